#!/usr/bin/env bash
# Checks that docs/design.md's Notes index and the source agree (run by ctest as notes_index):
# every Note defined in the source (a "// Note [Title]" or "# Note [Title]" line, or a docstring's
# "Note [Title]" line, followed by an underline of ~) has a row naming the file that defines it,
# every row names a Note defined in that file, every "Note [Title]" mentioned anywhere refers to a
# Note that is defined, and every repository path a comment, docstring or the doc names exists.
set -euo pipefail
cd "$(dirname "$0")/.."
index=docs/design.md
mapfile -t sources < <(git ls-files -- src include tools python tests bench models harness \
  scripts CMakeLists.txt '*/CMakeLists.txt' cmake | grep -E '\.(cc|h|py|sh|txt|cmake)$|CMakeLists' |
  sort -u)

status=0
report() {  # a heading and its findings, indented, if there are any
  [ -n "$2" ] || return 0
  echo "$1"
  while IFS= read -r line; do echo "  $line"; done <<<"$2"
  status=1
}

# "Title<TAB>file" for each definition.
definitions=$(for f in "${sources[@]}"; do
  awk -v f="$f" 'prev != "" && /^ *((\/\/|#) )?~+$/ { print prev "\t" f }
    { prev = "" } /^ *((\/\/|#) )?Note \[[^]]+\]$/ {
      t = $0; sub(/^ *((\/\/|#) )?Note \[/, "", t); sub(/\]$/, "", t); prev = t }' "$f"
done | sort -u)
# shellcheck disable=SC2016  # the backticks are Markdown's, matched literally
rows=$(grep -E '^\| [^|]+ \| `[^`]+` \|' "$index" |
  sed -E 's/^\| ([^|]+) \| `([^`]+)` \|.*/\1\t\2/' | sort -u)

report "Notes defined in the source without a matching row (title, file) in $index:" \
  "$(comm -23 <(echo "$definitions") <(echo "$rows"))"
report "Rows of $index's Notes index that name no Note defined in that file:" \
  "$(comm -13 <(echo "$definitions") <(echo "$rows"))"
titles=$(echo "$definitions" | cut -f1 | sort -u)
mentioned=$(grep -ohE 'Note \[[^]]+\]' "${sources[@]}" README.md docs/*.md |
  sed -E 's/^Note \[(.*)\]$/\1/' | sort -u)
report "Mentioned but defined nowhere: Note [...] with these titles:" \
  "$(comm -13 <(echo "$titles") <(echo "$mentioned") | grep -vxF -e 'Title' -e '...' || true)"

# Paths named in comments, docstrings and $index, as "file:line<TAB>path": a token whose first
# component is a tracked top-level directory, {a,b} expanded, ending in a source or doc extension;
# globs are skipped. A path relative to the naming file's directory counts as well.
tops=$(git ls-files | sed -n 's|/.*||p' | sort -u | paste -sd'|')
named=$(awk -v re="(^|[^A-Za-z0-9_./\$}-])($tops)/[A-Za-z0-9_./{},-]+" '
  FNR == 1 { py = FILENAME ~ /\.py$/; md = FILENAME ~ /\.md$/; c = FILENAME ~ /\.(cc|h)$/; doc = 0 }
  { t = ""; n = gsub(/"""/, "&")
    if (md || (py && (doc || n))) t = $0
    else if (c && index($0, "//")) t = substr($0, index($0, "//"))
    else if (!c && index($0, "#")) t = substr($0, index($0, "#"))
    if (py && n % 2) doc = !doc
    while (match(t, re)) {
      p = substr(t, RSTART, RLENGTH); t = substr(t, RSTART + RLENGTH)
      sub(/^[^A-Za-z0-9_.]/, "", p); sub(/[.,]+$/, "", p); print FILENAME ":" FNR "\t" p } }
  ' "${sources[@]}" "$index")
expand() {  # a{b,c}d{e,f} -> abde abdf acde acdf, one a line
  if [[ $1 =~ ^([^{]*)\{([^}]*)\}(.*)$ ]]; then
    local pre=${BASH_REMATCH[1]} post=${BASH_REMATCH[3]} alt alts
    IFS=, read -ra alts <<<"${BASH_REMATCH[2]}"
    for alt in "${alts[@]}"; do expand "$pre$alt$post"; done
  else echo "$1"; fi
}
report "Paths named in a comment, docstring or $index that do not exist (fix the reference):" \
  "$(while IFS=$'\t' read -r at token; do
    f=${at%%:*}
    while IFS= read -r p; do
      [[ $p =~ \.(cc|h|py|sh|md|txt|cmake|toml|json)$ ]] || continue
      [[ -e $p || -e ${f%/*}/$p ]] || echo "$at: $p"
    done < <(expand "$token")
  done <<<"$named")"
[ "$status" -eq 0 ] &&
  echo "notes index: $(echo "$definitions" | wc -l) Notes, each indexed in $index; paths exist"
exit "$status"
