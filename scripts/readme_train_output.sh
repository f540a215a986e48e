#!/usr/bin/env bash
# The README's figures from real runs (issue 18: docs that cannot go stale).
#
#   scripts/readme_train_output.sh            run the default training, piped as in the README,
#                                             and spillarena_memory, and rewrite the blocks
#                                             between the README's <!-- train-output:begin/end -->
#                                             and <!-- memory-table:begin/end --> markers
#   scripts/readme_train_output.sh memory     only the memory table (or only `train`)
#   scripts/readme_train_output.sh --check    (ctest readme_train_output) a 2-step run of the
#                                             same default model must print the README block's
#                                             summary lines, in order, and the same counts: the
#                                             layer-inputs line and the arena's capacity (what
#                                             does not depend on timing or on the step count);
#                                             and spillarena_memory's 4-layer rows must show the
#                                             README table's layer input, modes and bytes
#                                             spilled, with disk holding less than recompute
# SPILLARENA_CLI names the binary (default build/tools/spillarena), SPILLARENA_MEMORY the memory
# report (default: spillarena_memory beside it).
set -euo pipefail
cd "$(dirname "$0")/.."
cli=${SPILLARENA_CLI:-build/tools/spillarena}
memory=${SPILLARENA_MEMORY:-${cli%/spillarena}/spillarena_memory}
readme=README.md
begin='<!-- train-output:begin -->'
end='<!-- train-output:end -->'

block() {  # the README's block, without the markers and the ``` fences
  awk -v b="$begin" -v e="$end" '$0 == e { on = 0 } on && $0 !~ /^```/ { print } $0 == b { on = 1 }' "$readme"
}
labels() {  # the summary's labels ("loss", "layer inputs", ...), one per line, in order
  awk '/^summary \(/ { on = 1; next } on && /^  [a-zA-Z]/ { sub(/^  /, ""); sub(/  .*/, ""); print }'
}
line_of() { grep -m1 "^  $1 " || true; }
capacity() { grep -m1 '^  arena ' | grep -o 'capacity [^,]*' || true; }

# The memory table's rows for `layers` layers: "mode<TAB>spilled<TAB>held after forward".
table_rows() {
  awk -F'|' -v n="$1" '$2 ~ "^ *" n " *$" {
    gsub(/^ +| +$/, "", $3); gsub(/^ +| +$/, "", $6); gsub(/^ +| +$/, "", $4)
    print $3 "\t" $6 "\t" $4 }'
}
memory_block() {
  awk '$0 == "<!-- memory-table:end -->" { on = 0 } on { print } $0 == "<!-- memory-table:begin -->" { on = 1 }' "$readme"
}
mib() { awk -v v="$1" 'BEGIN { split(v, p, " "); f = p[1] + 0
  if (p[2] == "KiB") f /= 1024; if (p[2] == "GiB") f *= 1024; if (p[2] == "B") f /= 1048576; print f }'; }

# The parts of the memory table that do not depend on the machine's timing or allocator: the
# layer input, the modes, the bytes each spilled (4 layers), and disk holding less than recompute.
check_memory_table() {
  local table ok=0 input_readme input_build
  table=$("$memory" "" 2048 1024 4)
  input_readme=$(memory_block | grep -m1 '^layer input' | sed 's/; LibTorch threads.*//')
  input_build=$(echo "$table" | grep -m1 '^layer input' | sed 's/; LibTorch threads.*//')
  if [ "$input_readme" != "$input_build" ]; then
    printf 'memory table: the layer input differs:\n  README: %s\n  build:  %s\n' "$input_readme" "$input_build"
    ok=1
  fi
  if [ "$(memory_block | table_rows 4 | cut -f1,2)" != "$(echo "$table" | table_rows 4 | cut -f1,2)" ]; then
    echo "memory table: the 4-layer modes or bytes spilled differ (README, then this build):"
    diff <(memory_block | table_rows 4 | cut -f1,2) <(echo "$table" | table_rows 4 | cut -f1,2) || true
    ok=1
  fi
  local disk recompute
  disk=$(mib "$(echo "$table" | table_rows 4 | awk -F'\t' '$1 == "disk" { print $3 }')")
  recompute=$(mib "$(echo "$table" | table_rows 4 | awk -F'\t' '$1 == "recompute" { print $3 }')")
  if ! awk -v d="$disk" -v r="$recompute" 'BEGIN { exit !(d < r) }'; then
    echo "memory table: disk held ${disk} MiB after forward, not less than recompute's ${recompute} MiB"
    ok=1
  fi
  [ "$ok" -eq 0 ] && echo "README memory table: 4-layer modes, bytes spilled and layer input match this build"
  return "$ok"
}

if [ "${1:-}" = "--check" ]; then
  if ! grep -qx -- "$begin" "$readme" || ! grep -qx -- "$end" "$readme"; then
    echo "$readme has no $begin ... $end block"; exit 1
  fi
  run=$("$cli" train --steps 2 --compare-steps 1 --sample-chars 20 --dir "${TMPDIR:-/tmp}" | cat)
  status=0
  if [ "$(block | labels)" != "$(echo "$run" | labels)" ]; then
    echo "summary lines differ (README, then this build):"
    diff <(block | labels) <(echo "$run" | labels) || true
    status=1
  fi
  what="layer inputs"
  if [ "$(block | line_of "$what")" != "$(echo "$run" | line_of "$what")" ]; then
    printf 'the "%s" line differs:\n  README: %s\n  build:  %s\n' "$what" \
      "$(block | line_of "$what")" "$(echo "$run" | line_of "$what")"
    status=1
  fi
  if [ "$(block | capacity)" != "$(echo "$run" | capacity)" ]; then
    echo "arena capacity differs: README '$(block | capacity)', build '$(echo "$run" | capacity)'"
    status=1
  fi
  check_memory_table || status=1
  [ "$status" -eq 0 ] && echo "README train output: $(block | labels | wc -l) summary lines match this build"
  [ "$status" -eq 0 ] || echo "regenerate with scripts/readme_train_output.sh"
  exit "$status"
fi

# Replaces the lines between <!-- NAME:begin --> and <!-- NAME:end --> with stdin.
rewrite_block() {
  local name=$1 tmp
  tmp=$(mktemp)
  {
    awk -v b="<!-- $name:begin -->" '{ print } $0 == b { exit }' "$readme"
    cat
    awk -v e="<!-- $name:end -->" '$0 == e { on = 1 } on { print }' "$readme"
  } >"$tmp"
  cp "$tmp" "$readme"
  rm -f "$tmp"
  echo "rewrote the $name block in $readme"
}

blocks=${*:-train memory}
if [[ " $blocks " == *" train "* ]]; then
  output=$("$cli" train | cat)
  # shellcheck disable=SC2016  # a Markdown fence: the backticks are literal
  printf '```\n%s\n```\n' "$output" | rewrite_block train-output
fi
if [[ " $blocks " == *" memory "* ]]; then
  table=$("$memory")
  # shellcheck disable=SC2016  # a Markdown fence and a shell prompt: `, $ are literal
  printf '```sh\n$ %s\n%s\n```\n\n%s\n' "$memory" "$(echo "$table" | head -1)" \
    "$(echo "$table" | sed -n '2,$p' | sed '/./,$!d')" | rewrite_block memory-table
fi
