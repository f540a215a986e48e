#!/usr/bin/env bash
# The installed spillarena command where liburing is missing or broken (Note [The command carries
# its own liburing] in tools/CMakeLists.txt):
#   1. `cmake --install` into a scratch prefix; the installed command's NEEDED list (readelf) and
#      its loaded libraries (ldd) name no liburing;
#   2. with liburing.so.2 hidden behind an empty file (a mount namespace: root only, else exit 77,
#      skipped), the command starts (--help), makes an arena (plan) and trains a step on the
#      I/O backend it uses with the library in place.
#
#   tests/cli_liburing_check.sh BUILD_DIR LINKAGE   # LINKAGE: static, shared or none (the build's)
set -euo pipefail
build=${1:?usage: cli_liburing_check.sh BUILD_DIR LINKAGE}
linkage=${2:?usage: cli_liburing_check.sh BUILD_DIR LINKAGE}
if [[ $linkage == shared ]]; then
  echo "skipped: this build found no liburing.a, so the command links liburing.so.2" \
    "(Debian: apt-get install liburing-dev, then configure again)"
  exit 77
fi
work=$(mktemp -d "$build/cli_liburing_check.XXXXXX")  # on disk: plan says no to a RAM dir
trap 'rm -rf "$work"' EXIT

# 1. What the installed command asks the loader for.
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cli=$work/prefix/bin/spillarena
if readelf -d "$cli" | grep -i 'NEEDED.*liburing'; then
  echo "cli_liburing_check: the installed command still needs liburing's shared library"
  exit 1
fi
if ldd "$cli" | grep -i liburing; then
  echo "cli_liburing_check: the installed command loads liburing's shared library (ldd)"
  exit 1
fi
echo "cli_liburing_check: $cli names no liburing (readelf -d, ldd)"

# 2. The command with liburing.so.2 hidden: an empty file in its place, which the loader would
# refuse ("file too short"). It starts (--help), makes an arena (plan's grow trial) and trains a
# step on the same I/O backend as with the library in place: io_uring is the archive's, where the
# kernel allows it.
mkdir "$work/spill"
plan=(plan --layers 4 --batch 2 --seq 128 --hidden 64 --dtype fp32 --probe-bytes 0
  --dir "$work/spill")
train=(train --layers 2 --hidden 32 --heads 2 --seq 32 --batch 4 --steps 1 --compare-steps 0
  --sample-chars 0 --json --dir "$work/spill")
backend() { "$@" 2>/dev/null | sed -n 's/.*"io_backend": "\([^"]*\)".*/\1/p' | head -n 1; }
expected=$(backend "$cli" "${train[@]}") || {
  echo "cli_liburing_check: the installed command cannot train a step: $cli ${train[*]}"
  exit 1
}
liburing=$(ldconfig -p | awk '/liburing\.so\.2 /{print $NF}' | tail -n 1)
if [[ -z $liburing ]]; then  # nothing to hide: the command runs without it as it is
  "$cli" --help >/dev/null
  "$cli" "${plan[@]}" >/dev/null
  echo "cli_liburing_check: no liburing.so.2 on this system; the command starts without it"
  exit 0
fi
: >"$work/empty"
# shellcheck disable=SC2016  # expanded by the inner shell, from its arguments
hide='mount --bind "$1" "$2" && [[ ! -s $2 ]]'
if [[ $(id -u) -ne 0 ]] || ! command -v unshare >/dev/null ||
  ! unshare -m bash -c "$hide" _ "$work/empty" "$liburing" 2>/dev/null; then
  echo "skipped: cannot hide $liburing (needs root, unshare -m and mount --bind);" \
    "the NEEDED list above stands for it"
  exit 77
fi
hidden() {
  # shellcheck disable=SC2016
  unshare -m bash -c "$hide"' || exit 1; shift 2; exec "$@"' _ "$work/empty" "$liburing" "$@"
}
if ! { hidden "$cli" --help >/dev/null && hidden "$cli" "${plan[@]}" >/dev/null; }; then
  echo "cli_liburing_check: the installed command fails with $liburing hidden (an empty file)"
  exit 1
fi
got=$(backend hidden "$cli" "${train[@]}") || true  # an empty $got says it failed
if [[ -z $got || $got != "$expected" ]]; then
  echo "cli_liburing_check: with $liburing hidden a step ran on \"$got\", not \"$expected\""
  exit 1
fi
echo "cli_liburing_check: with $liburing hidden (an empty file): --help, plan and a step on" \
  "$expected run"
