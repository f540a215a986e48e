# shellcheck shell=bash
# Sourced by tests/sanitizer_check.sh and tests/tsan_check.sh: the compiler their tree is built
# with (Note [The sanitizer tree is clang's] in tests/sanitizer_check.sh).
#
#   source "$(dirname "$0")/sanitizer_compiler.sh"
#   cxx=$(sanitizer_cxx address,undefined) || { echo "skipped: ..."; exit 77; }

# $SPILLARENA_SANITIZER_CXX, else clang++, where it links -fsanitize=$1; else c++ where that
# does; else nothing, and a failing status.
sanitizer_cxx() {
  local cxx
  local clang
  clang=$(command -v clang++ || command -v clang++-14 || true)
  for cxx in "${SPILLARENA_SANITIZER_CXX:-}" "$clang" c++; do
    [[ -n $cxx ]] || continue
    if echo 'int main(){}' | "$cxx" -fsanitize="$1" -x c++ - -o /dev/null 2>/dev/null; then
      echo "$cxx"
      return 0
    fi
  done
  return 1
}
