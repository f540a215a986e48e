#!/usr/bin/env bash
# Builds the slab allocator fuzzer (tests/fuzz/) with clang + libFuzzer in its own tree ($1) and
# fuzzes for $2 seconds (default 60), keeping its corpus in $1/corpus between runs.
# Exit 77 (skipped) where clang or its libFuzzer runtime is missing. See docs/fuzzing.md.
set -euo pipefail
build=$1
seconds=${2:-60}
src=$(cd "$(dirname "$0")/.." && pwd)
clangxx=${SPILLARENA_CLANGXX:-$(command -v clang++ || command -v clang++-14 || true)}
if [[ -z $clangxx ]]; then
  echo "skipped: no clang++ (libFuzzer needs clang: apt-get install clang libclang-rt-14-dev)"
  exit 77
fi
probe='extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }'
if ! echo "$probe" | "$clangxx" -fsanitize=fuzzer,address,undefined -x c++ - -o /dev/null \
    2>/dev/null; then
  echo "skipped: $clangxx cannot link -fsanitize=fuzzer (apt-get install libclang-rt-14-dev)"
  exit 77
fi
cmake -S "$src/tests/fuzz" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$clangxx" >/dev/null
cmake --build "$build" >"$build/build.log" 2>&1 || {
  tail -n 60 "$build/build.log"
  exit 1
}
mkdir -p "$build/corpus"
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# -timeout: an input that runs 10 s is a hang. -error_exitcode: libFuzzer's default, 77, is
# ctest's "skipped". Crash reproducers land in $build (crash-<sha1>); docs/fuzzing.md replays them.
"$build/slab_allocator_fuzzer" -max_total_time="$seconds" -timeout=10 -error_exitcode=1 \
  -timeout_exitcode=1 -print_final_stats=1 -artifact_prefix="$build/" "$build/corpus"
