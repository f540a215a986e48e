#!/usr/bin/env bash
# Formatting and lint as a check: clang-format (the root .clang-format) over every tracked C/C++
# source and header, ruff (ruff.toml) over every tracked Python file, and shellcheck over every
# tracked shell script (*.sh, and scripts/ and .ci/ files with a shell #!). Changes nothing; prints
# one line per tool and exits 1 naming the offending files.
#
#   scripts/lint.sh                          # the tools in .venv/bin (scripts/setup.sh's)
#   LINT_BIN=/elsewhere/bin scripts/lint.sh  # the tools in another bin directory
#
# The versions are pinned: another clang-format lays code out differently, another ruff flags
# different lines. setup.sh reads the two pins below. shellcheck is Debian's (on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."

CLANG_FORMAT_VERSION=23.1.5
RUFF_VERSION=0.17.6

bin=${LINT_BIN:-.venv/bin}
fix="$bin/pip install clang-format==$CLANG_FORMAT_VERSION ruff==$RUFF_VERSION (or scripts/setup.sh)"

for tool in clang-format ruff; do
  if [[ ! -x $bin/$tool ]]; then
    echo "lint: no $tool in $bin; install the pinned tools: $fix" >&2
    exit 1
  fi
done
if ! command -v shellcheck >/dev/null; then
  echo "lint: no shellcheck on PATH; install it: sudo apt-get install shellcheck" \
    "(or scripts/setup.sh --tests)" >&2
  exit 1
fi

# "clang-format version 23.1.5 (https://...)" and "ruff 0.17.6": the word after the name.
clang_format_version=$("$bin/clang-format" --version |
  sed -nE 's/.*clang-format version ([^ ]+).*/\1/p')
ruff_version=$("$bin/ruff" --version | awk '{print $2}')
if [[ $clang_format_version != "$CLANG_FORMAT_VERSION" ]]; then
  echo "lint: $bin/clang-format is ${clang_format_version:-of unknown version}, not the pinned" \
    "$CLANG_FORMAT_VERSION; another version formats differently. Install it: $fix" >&2
  exit 1
fi
if [[ $ruff_version != "$RUFF_VERSION" ]]; then
  echo "lint: $bin/ruff is ${ruff_version:-of unknown version}, not the pinned $RUFF_VERSION;" \
    "another version flags differently. Install it: $fix" >&2
  exit 1
fi

# Tracked files that exist in the work tree. tests/mutations/ holds patches, not sources; add a
# vendored or generated file to `excluded` (an extended regex) if one is ever committed.
excluded='^tests/mutations/'
tracked() {
  git ls-files -z -- "$@" | while IFS= read -r -d '' f; do
    [[ -f $f ]] && ! [[ $f =~ $excluded ]] && printf '%s\0' "$f"
  done
}
mapfile -d '' cxx_files < <(tracked '*.cc' '*.h' '*.cpp' '*.hpp')
mapfile -d '' py_files < <(tracked '*.py')
mapfile -d '' sh_files < <(
  tracked '*.sh'
  tracked scripts .ci | while IFS= read -r -d '' f; do
    if [[ $f != *.sh ]] && head -n 1 "$f" | grep -qE '^#!.*\b(ba|da)?sh\b'; then
      printf '%s\0' "$f"
    fi
  done)

status=0

# clang-format names each violation "path:line:col: error: ..."; report each file once.
if out=$("$bin/clang-format" --dry-run -Werror "${cxx_files[@]}" 2>&1); then
  echo "lint: clang-format $CLANG_FORMAT_VERSION: ${#cxx_files[@]} files clean"
else
  mapfile -t bad < <(printf '%s\n' "$out" |
    sed -nE 's/^([^:]+):[0-9]+:[0-9]+: (error|warning):.*/\1/p' | sort -u)
  echo "lint: clang-format $CLANG_FORMAT_VERSION: ${#bad[@]} of ${#cxx_files[@]} files are not" \
    "formatted (fix: $bin/clang-format -i FILE...):"
  if ((${#bad[@]})); then printf '  %s\n' "${bad[@]}"; else printf '%s\n' "$out" | tail -n 20; fi
  status=1
fi

# findings TOOL OUTPUT COUNT NOUN HINT: the files named in OUTPUT's "file:line:col: ..." lines
# out of COUNT, then OUTPUT indented.
findings() {
  local bad
  mapfile -t bad < <(printf '%s\n' "$2" | sed -nE 's/^([^:]+):[0-9]+:[0-9]+: .*/\1/p' | sort -u)
  echo "lint: $1: findings in ${#bad[@]} of $3 $4 ($5):"
  printf '%s\n' "$2" | sed 's/^/  /'
  status=1
}

# --no-cache: a check leaves nothing behind in the tree.
if out=$("$bin/ruff" check --no-cache --quiet --output-format concise -- "${py_files[@]}" 2>&1)
then
  echo "lint: ruff $RUFF_VERSION: clean"
else
  findings "ruff $RUFF_VERSION" "$out" "${#py_files[@]}" files \
    "safe fixes: $bin/ruff check --fix FILE..."
fi

# A finding not worth fixing takes "# shellcheck disable=SCnnnn  # why" on the line above.
shellcheck_version=$(shellcheck --version | sed -n 's/^version: //p')
if out=$(shellcheck -x -f gcc -- "${sh_files[@]}" 2>&1); then
  echo "lint: shellcheck $shellcheck_version: ${#sh_files[@]} scripts clean"
else
  findings "shellcheck $shellcheck_version" "$out" "${#sh_files[@]}" scripts \
    "see https://www.shellcheck.net/wiki/SCnnnn"
fi
exit "$status"
