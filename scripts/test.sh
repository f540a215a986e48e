#!/usr/bin/env bash
# Sets up, builds and runs every test, one ctest entry per core side by side (Note [Tests side by
# side] in tests/CMakeLists.txt). Output ends with ctest's summary line.
# The quick tier alone, after a build: cd build && ctest -L quick -j "$(nproc)".
set -euo pipefail
cd "$(dirname "$0")/.."
phase() { echo "test.sh [$1/3, ${SECONDS} s] $2" >&2; }
phase 1 "setup: the test tools (Debian packages, the Python test stack, linters)"
scripts/setup.sh --tests
phase 2 "build: library, tools, tests and benchmarks"
scripts/build.sh
phase 3 "ctest, $(nproc) entries at a time"
cd build && ctest --output-on-failure --timeout 900 -j "$(nproc)"
