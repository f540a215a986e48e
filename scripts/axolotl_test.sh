#!/usr/bin/env bash
# The axolotl plugin's tests (a ctest entry): builds or refreshes the axolotl venv (scripts/
# axolotl_env.sh: axolotl 0.21.0 and spillarena, cached between runs), then runs tests/axolotl
# there, on the CPU, with nothing downloaded. Exit 77 (skipped) only when the first build of the
# venv cannot reach PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(scripts/axolotl_env.sh) || exit $?
exec "$python" -m pytest -q -p no:cacheprovider tests/axolotl "$@"
