#!/usr/bin/env bash
# Runs the whole benchmark suite once into docs/bench/results.json, then draws the plots and the
# ratio table (docs/bench/*.png, docs/bench/ratios.md). SPILL_DIR chooses the disk under test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests >/dev/null  # Google Benchmark is a test tool
scripts/build.sh >/dev/null
mkdir -p docs/bench
build/bench/spillarena_bench --benchmark_format=console --benchmark_out_format=json \
  --benchmark_out=docs/bench/results.json --benchmark_min_time=1 "$@"
/usr/bin/python3 scripts/plot_bench.py docs/bench/results.json docs/bench
