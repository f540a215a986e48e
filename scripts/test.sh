#!/usr/bin/env bash
# Sets up, builds and runs every test, one ctest entry per core side by side (Note [Tests side by
# side] in tests/CMakeLists.txt). Output ends with ctest's summary line.
# The quick tier alone, after a build: cd build && ctest -L quick -j "$(nproc)".
#
# Note [Setup beside the build]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The build needs the Debian packages and torch, not the Python test stack (transformers, peft,
# trl, the wheel tools, the linters): pip spends some 35 s on those, mostly waiting on the disk
# and on unpacking, one core at most. So setup installs what the build needs first
# (--tests-build), and the rest (--tests) installs while the build runs; ctest starts once both
# are done, and a failure of either fails the run with its output.
set -euo pipefail
cd "$(dirname "$0")/.."
phase() { echo "test.sh [$1/3, ${SECONDS} s] $2" >&2; }
phase 1 "setup: what the build needs (Debian packages, the test tools among them, and torch)"
scripts/setup.sh --tests-build
phase 2 "build: library, tools, tests and benchmarks; beside it, setup's Python test stack"
setup_log=$(mktemp)
trap 'rm -f "$setup_log"' EXIT
scripts/setup.sh --tests >"$setup_log" 2>&1 &
setup_pid=$!
build_status=0
scripts/build.sh || build_status=$?
setup_status=0
wait "$setup_pid" || setup_status=$?
cat "$setup_log" >&2
if ((setup_status != 0)); then
  echo "test.sh: scripts/setup.sh --tests failed (exit $setup_status)" >&2
  exit "$setup_status"
fi
((build_status == 0)) || exit "$build_status"
phase 3 "ctest, $(nproc) entries at a time"
cd build && ctest --output-on-failure --timeout 900 -j "$(nproc)"
