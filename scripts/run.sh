#!/usr/bin/env bash
# Sets up, builds and runs the main job: only what `spillarena train` needs (the library and the
# command), not the tests and benchmarks (scripts/test.sh builds those). Each phase says so as it
# starts, with the seconds spent so far.
set -euo pipefail
cd "$(dirname "$0")/.."
phase() { echo "run.sh [$1/3, ${SECONDS} s] $2" >&2; }
phase 1 "setup: Debian packages and .venv with torch (downloads on a fresh machine)"
scripts/setup.sh
phase 2 "build: the library and the spillarena command (a few minutes the first time)"
scripts/build.sh spillarena_cli
phase 3 "train: spillarena train $*"
exec build/tools/spillarena train "$@"
