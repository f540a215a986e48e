#!/usr/bin/env bash
# Configures and builds spillarena in ./build (Release, Ninja), LibTorch from .venv.
#   scripts/build.sh                  everything: library, tools, tests, benchmarks
#   scripts/build.sh spillarena_cli   only the named targets (and what they need)
# Extra CMake options for the configure step: SPILLARENA_CMAKE_ARGS="-DFOO=BAR ...".
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC2086  # word splitting of the options is the point
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${SPILLARENA_CMAKE_ARGS:-} >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build --parallel "$(nproc)" "${targets[@]}"
