#!/usr/bin/env bash
# Configures and builds spillarena in ./build (Release, Ninja), LibTorch from .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build --parallel "$(nproc)"
