#!/usr/bin/env bash
# Builds the torch-free engine test with ThreadSanitizer in its own tree ($1) and runs it.
# Exit 77 (skipped) where the compiler has no ThreadSanitizer runtime.
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")/.." && pwd)
if ! echo 'int main(){}' | c++ -fsanitize=thread -x c++ - -o /dev/null 2>/dev/null; then
  echo "skipped: this compiler cannot link -fsanitize=thread"
  exit 77
fi
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPILLARENA_SANITIZE=thread \
  -DSPILLARENA_WITH_TORCH=OFF -DSPILLARENA_BUILD_BENCH=OFF -DSPILLARENA_BUILD_TOOLS=OFF >/dev/null
cmake --build "$build" --target io_engine_test >/dev/null
# setarch -R: ThreadSanitizer on newer kernels needs fewer random bits in the address layout.
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" setarch "$(uname -m)" -R \
  "$build/tests/io_engine_test"
