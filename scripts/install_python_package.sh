#!/usr/bin/env bash
# Installs spillarena into the virtualenv of $1 (its python) from the wheel for .venv's torch:
# the newest wheel in $SPILLARENA_WHEEL_DIR when that is set (ctest's wheel_build entry made it,
# once for every entry that needs it), else the one scripts/build_wheel.sh brings up to date in
# build/wheel (seconds when nothing changed). Further arguments go to pip. The target venv must
# hold the same torch release as .venv (the wheel requires it). Used by scripts/python_test.sh
# and scripts/axolotl_env.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:?usage: install_python_package.sh PYTHON [pip arguments]}
shift
if [[ -n ${SPILLARENA_WHEEL_DIR:-} ]]; then
  wheel=""
  for w in "$SPILLARENA_WHEEL_DIR"/spillarena-*.whl; do  # the newest
    if [[ -f $w && (-z $wheel || $w -nt $wheel) ]]; then wheel=$w; fi
  done
  [[ -n $wheel ]] || { echo "install_python_package: no wheel in $SPILLARENA_WHEEL_DIR" >&2; exit 1; }
else
  wheel=$(scripts/build_wheel.sh --out build/wheel)
fi
"$python" -m pip install -q --no-deps --force-reinstall "$@" "$wheel"
