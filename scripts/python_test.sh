#!/usr/bin/env bash
# The Python package's tests (a ctest entry, so `scripts/test.sh` still ends with ctest's summary):
# installs the wheel (scripts/install_python_package.sh: the one wheel for every torch >= 2.11)
# into .venv, then runs pytest. Exit 77 (skipped) when .venv
# lacks the test tools (scripts/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
if ! "$py" -c "import scikit_build_core, pytest, transformers, accelerate" 2>/dev/null; then
  echo "skipped: .venv lacks scikit-build-core/pytest/transformers/accelerate; run scripts/setup.sh"
  exit 77
fi
scripts/install_python_package.sh "$py"
"$py" -m pytest -q -p no:cacheprovider tests/python
