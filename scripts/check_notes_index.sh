#!/usr/bin/env bash
# Checks that docs/design.md's Notes index and the source agree (run by ctest as notes_index):
# every Note defined in the source (a "// Note [Title]" or "# Note [Title]" line, or a docstring's
# "Note [Title]" line, followed by an underline of ~) has a row naming the file that defines it, every row names a Note defined in
# that file, and every "Note [Title]" mentioned anywhere refers to a Note that is defined.
set -euo pipefail
cd "$(dirname "$0")/.."
index=docs/design.md
sources=$(git ls-files -- src include tools python tests bench models harness scripts \
  CMakeLists.txt '*/CMakeLists.txt' cmake | grep -E '\.(cc|h|py|sh|txt|cmake)$|CMakeLists' | sort -u)

# "Title<TAB>file" for each definition.
definitions=$(for f in $sources; do
  awk -v f="$f" 'prev != "" && /^ *((\/\/|#) )?~+$/ { print prev "\t" f }
    { prev = "" } /^ *((\/\/|#) )?Note \[[^]]+\]$/ {
      t = $0; sub(/^ *((\/\/|#) )?Note \[/, "", t); sub(/\]$/, "", t); prev = t }' "$f"
done | sort -u)
rows=$(grep -E '^\| [^|]+ \| `[^`]+` \|' "$index" |
  sed -E 's/^\| ([^|]+) \| `([^`]+)` \|.*/\1\t\2/' | sort -u)

status=0
missing=$(comm -23 <(echo "$definitions") <(echo "$rows"))
if [ -n "$missing" ]; then
  echo "Notes defined in the source without a matching row (title, file) in $index:"
  echo "$missing" | sed 's/^/  /'
  status=1
fi
stale=$(comm -13 <(echo "$definitions") <(echo "$rows"))
if [ -n "$stale" ]; then
  echo "Rows of $index's Notes index that name no Note defined in that file:"
  echo "$stale" | sed 's/^/  /'
  status=1
fi
titles=$(echo "$definitions" | cut -f1 | sort -u)
mentioned=$(grep -ohE 'Note \[[^]]+\]' $sources README.md docs/*.md | sed -E 's/^Note \[(.*)\]$/\1/' |
  sort -u)
dangling=$(comm -13 <(echo "$titles") <(echo "$mentioned") | grep -vxF -e 'Title' -e '...' || true)
if [ -n "$dangling" ]; then
  echo "Mentioned but defined nowhere: Note [...] with these titles:"
  echo "$dangling" | sed 's/^/  /'
  status=1
fi
[ "$status" -eq 0 ] && echo "notes index: $(echo "$definitions" | wc -l) Notes, each indexed in $index"
exit "$status"
