#!/usr/bin/env bash
# Installs everything spillarena needs on Debian 12, idempotently: the Debian -dev packages and a
# project-local virtual environment (.venv) with the CPU build of torch 2.13.0, whose LibTorch
# CMake finds. Safe to run again; does nothing that is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBIAN_PACKAGES=(build-essential cmake ninja-build python3-venv doctest-dev
  libbenchmark-dev libcli11-dev nlohmann-json3-dev liburing-dev python3-dev python3-matplotlib
  e2fsprogs libxxhash-dev clang libclang-rt-14-dev)
TORCH_VERSION=2.13.0

missing=()
for p in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  echo "setup: creating .venv"
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  echo "setup: installing torch==$TORCH_VERSION (CPU) into .venv"
  # An exact pin: a looser spec would pull a multi-GB CUDA build.
  .venv/bin/pip install -q "torch==$TORCH_VERSION"
fi
# The Python package's build and test tools. torch is named with its exact pin in the same
# command, so pip can never swap it for another build.
# peft and trl: the integration tests (tests/python/test_integrations_peft_trl.py); these are the
# releases that pair with transformers 5.23.0 (trl also brings datasets).
PYTHON_TEST_PACKAGES=(scikit-build-core pytest "transformers==5.23.0" accelerate "peft==0.21.2" "trl==1.16.0")
if ! .venv/bin/python -c "import scikit_build_core, pytest, accelerate, transformers, peft, trl, sys; sys.exit(transformers.__version__ != '5.23.0' or peft.__version__ != '0.21.2' or trl.__version__ != '1.16.0')" 2>/dev/null; then
  echo "setup: installing ${PYTHON_TEST_PACKAGES[*]} into .venv"
  .venv/bin/pip install -q "torch==$TORCH_VERSION" "${PYTHON_TEST_PACKAGES[@]}"
fi
echo "setup: ok (torch $(.venv/bin/python -c 'import torch; print(torch.__version__)' 2>/dev/null))"
