#!/usr/bin/env bash
# Sets up, builds and runs every test. Output ends with ctest's summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd build && ctest --output-on-failure --timeout 900
