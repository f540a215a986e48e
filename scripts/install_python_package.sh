#!/usr/bin/env bash
# Installs this source's Python package into the virtualenv of $1 (its python), built in $2 (a
# CMake tree kept between runs, so rebuilds are incremental), against that venv's torch
# (--no-build-isolation). Where build/ exists it is brought up to date first and the extension
# links its static libraries instead of compiling them again (Note [The Python extension may
# reuse the main build] in python/CMakeLists.txt). Used by scripts/python_test.sh and
# scripts/axolotl_env.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
python=$1
build_dir=$2
shift 2
prebuilt=""
if [[ -f build/build.ninja ]]; then
  cmake --build build --target spillarena spillarena_core >/dev/null
  prebuilt=$PWD/build
fi
"$python" -m pip install -q --no-build-isolation --no-deps "-Cbuild-dir=$build_dir" \
  "-Ccmake.define.SPILLARENA_PREBUILT_LIBRARIES=$prebuilt" "$@" .
