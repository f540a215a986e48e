#!/usr/bin/env bash
# Builds the torch-free tests that share state across threads (the slab allocator, the arena, the
# I/O engine) with ThreadSanitizer in their own tree ($1) and runs them.
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
tests=(slab_allocator_test arena_test io_engine_test fault_injection_test security_test)
cmake --build "$build" --target "${tests[@]}" >"$build/build.log" 2>&1 || {
  tail -n 60 "$build/build.log"
  exit 1
}
for t in "${tests[@]}"; do
  start=$SECONDS
  # setarch -R: ThreadSanitizer on newer kernels needs fewer random bits in the address layout.
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" setarch "$(uname -m)" -R "$build/tests/$t"
  echo "tsan_check: $t clean under ThreadSanitizer ($((SECONDS - start)) s)"
done
