#!/usr/bin/env bash
# Checks that docs/design.md's Notes index and the source agree (run by ctest as notes_index):
# every Note defined in the source (a "// Note [Title]" or "# Note [Title]" line, or a docstring's
# "Note [Title]" line, followed by an underline of ~) has a row naming the file that defines it,
# every row names a Note defined in that file, every "Note [Title]" mentioned anywhere refers to a
# Note that is defined, and every repository path a comment, docstring or the doc names exists.
# Also that every file and folder the doc's file walk names (its sections before the Notes index:
# the layers diagram, the hops, the layers table) exists, and that docs/benchmarks.md stays short.
#   DESIGN_MD=/tmp/copy.md scripts/check_notes_index.sh       checks a copy of docs/design.md
#   BENCHMARKS_MD=/tmp/copy.md scripts/check_notes_index.sh   a copy of docs/benchmarks.md
# (each path absolute or from the repository root).
set -euo pipefail
cd "$(dirname "$0")/.."
index=${DESIGN_MD:-docs/design.md}
benchmarks=${BENCHMARKS_MD:-docs/benchmarks.md}
benchmarks_max_lines=400
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

# The file walk: "line<TAB>token<TAB>where" for each file or folder the sections before the Notes
# index name; where is the folders (".": the root) the token may be in, or "*": the name of some
# tracked file. The layers diagram names files under its folder rows; a layers-table row names
# them after a folder (`src/core/io/`: `io_queue.{h,cc}`) or beside a file (`python/src/py.h`,
# `capsules.cc`); elsewhere a path is from the root, src/, include/ or src/core/, and a bare name
# is any tracked file's.
walk=$(awk -v tops="$tops" '
  function emit(t, where) { print NR "\t" t "\t" where }
  function dir(t) { return t ~ /\/$/ ? t : substr(t, 1, match(t, /[^\/]*$/) - 1) }
  function spans(text, strict,    t, base) {
    base = "./"
    while (match(text, /`[^`]+`/)) {
      t = substr(text, RSTART + 1, RLENGTH - 2); text = substr(text, RSTART + RLENGTH)
      gsub(/^["<]|[">]$/, "", t)
      if (t !~ /^[A-Za-z0-9_.\/*{},-]+$/ || t ~ /^\//) continue
      if (t !~ file && t !~ /\/$/ && t !~ rooted) continue
      if (strict) {
        emit(t, t ~ /\// ? base " ./" : base)
        if (t ~ rooted && t !~ /[*]/) base = dir(t) }
      else if (t ~ rooted) emit(t, "./")
      else emit(t, t ~ /\// ? "src/ include/ src/core/" : "*")
    } }
  BEGIN { rooted = "^(" tops ")(/|$)"
    file = "\\.(\\{[a-z,]+\\}|h|cc|py|sh|txt|cmake|toml|json|md)$" }
  /^## Notes index/ { exit }
  /^## / { diagram = $0 ~ /^## The layers on one screen/; table = 0 }
  /^```/ { fence = !fence; next }
  fence && diagram {
    line = $0
    while (match(line, /<[a-z_]+\/[A-Za-z0-9_.]+>/)) {
      emit(substr(line, RSTART + 1, RLENGTH - 2), "include/")
      line = substr(line, 1, RSTART - 1) substr(line, RSTART + RLENGTH) }
    rest = line
    while (match(rest, "(^|[ (,])(" tops ")/[A-Za-z0-9_/]*")) {
      t = substr(rest, RSTART, RLENGTH); sub(/^[ (,]/, "", t); rest = substr(rest, RSTART + RLENGTH)
      emit(t, "./"); if (line ~ /──/) { root = t; folder = "" } }
    if (match(line, /^   [a-z_]+\/ /)) { folder = substr(line, 4, RLENGTH - 4); emit(folder, root) }
    else if (line ~ /^   [a-z_]+ /) folder = ""
    rest = line
    while (match(rest, /(^|[^A-Za-z0-9_.\/])[A-Za-z0-9_]+\.(\{[a-z,]+\}|[a-z]+)/)) {
      t = substr(rest, RSTART, RLENGTH); rest = substr(rest, RSTART + RLENGTH)
      sub(/^[^A-Za-z0-9_]/, "", t)
      if (t ~ file) emit(t, root folder) }
    next }
  fence { next }
  /^\| layer \| files \|/ { table = 1; next }
  table && /^\| / {  # the files cell strictly, the rest as prose
    n = split($0, cell, "|"); spans(cell[3], 1)
    for (i = 4; i <= n; i++) spans(cell[i], 0)
    next }
  { spans($0, 0) }
' "$index")
names=$(git ls-files | sed 's|.*/||' | sort -u)
report "Paths the file walk of $index names that do not exist (fix the walk):" \
  "$(while IFS=$'\t' read -r at token where; do
    read -ra places <<<"$where"
    while IFS= read -r p; do
      found=0
      for place in "${places[@]}"; do
        if [[ $place == '*' ]]; then
          grep -qxF -- "${p##*/}" <<<"$names" && found=1
        elif [[ -e $place$p ]] || { [[ $p == *[*?]* ]] && compgen -G "$place$p" >/dev/null; }; then
          found=1
        fi
        [[ $found -eq 1 ]] && break
      done
      [[ $found -eq 1 ]] || echo "$index:$at: $p (looked in: ${where//\*/any folder, by name})"
    done < <(expand "$token")
  done <<<"$walk")"

# The current figures stay one page (earlier runs go to docs/benchmarks_archive.md).
benchmarks_lines=$(wc -l <"$benchmarks")
too_long="$benchmarks_lines lines, at most $benchmarks_max_lines; move superseded runs"
[ "$benchmarks_lines" -le "$benchmarks_max_lines" ] ||
  report "$benchmarks is too long for a page of current figures:" \
    "$too_long to docs/benchmarks_archive.md"

[ "$status" -eq 0 ] &&
  echo "notes index: $(echo "$definitions" | wc -l) Notes, each indexed in $index; paths exist;" \
    "the file walk's $(echo "$walk" | wc -l) paths exist; $benchmarks $benchmarks_lines lines"
exit "$status"
