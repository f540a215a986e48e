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
#                                             does not depend on timing or on the step count)
# SPILLARENA_CLI names the binary (default build/tools/spillarena).
set -euo pipefail
cd "$(dirname "$0")/.."
cli=${SPILLARENA_CLI:-build/tools/spillarena}
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

if [ "${1:-}" = "--check" ]; then
  grep -qx -- "$begin" "$readme" && grep -qx -- "$end" "$readme" || {
    echo "$readme has no $begin ... $end block"; exit 1; }
  run=$("$cli" train --steps 2 --compare-steps 1 --sample-chars 20 --dir "${TMPDIR:-/tmp}" | cat)
  status=0
  if [ "$(block | labels)" != "$(echo "$run" | labels)" ]; then
    echo "summary lines differ (README, then this build):"
    diff <(block | labels) <(echo "$run" | labels) || true
    status=1
  fi
  for what in "layer inputs"; do
    if [ "$(block | line_of "$what")" != "$(echo "$run" | line_of "$what")" ]; then
      printf 'the "%s" line differs:\n  README: %s\n  build:  %s\n' "$what" \
        "$(block | line_of "$what")" "$(echo "$run" | line_of "$what")"
      status=1
    fi
  done
  if [ "$(block | capacity)" != "$(echo "$run" | capacity)" ]; then
    echo "arena capacity differs: README '$(block | capacity)', build '$(echo "$run" | capacity)'"
    status=1
  fi
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
  printf '```\n%s\n```\n' "$output" | rewrite_block train-output
fi
if [[ " $blocks " == *" memory "* ]]; then
  memory=${cli%/spillarena}/spillarena_memory
  table=$("$memory")
  printf '```sh\n$ %s\n%s\n```\n\n%s\n' "$memory" "$(echo "$table" | head -1)" \
    "$(echo "$table" | sed -n '2,$p' | sed '/./,$!d')" | rewrite_block memory-table
fi
