#!/usr/bin/env bash
# Builds the torch-free tests that share state across threads (the slab allocator, the arena, the
# I/O engine, faults, the mapping guard, cuFile's table) with ThreadSanitizer in their own tree
# ($1) and runs them.
# Exit 77 (skipped) where the compiler has no ThreadSanitizer runtime.
#
# Note [ThreadSanitizer and the LibTorch layer]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The LibTorch layer (src/torch_layer) is not run under ThreadSanitizer: LibTorch comes
# uninstrumented, and its reference counts and internal mutexes then look racy. Tried with
# LibTorch 2.13.0 (CPU) on device_path_test and fault_injection_test: every tensor freed by the
# last reference, inside libc10, was reported as racing the I/O thread's earlier hash of it;
# ignoring LibTorch's interceptors (called_from_lib) traded that for "unlock of an unlocked
# mutex" inside libc10 and libtorch_cpu. What covers the layer instead: every mutex there names
# what it guards and clang's -Wthread-safety checks it (thread_safety_check), AddressSanitizer
# runs device_path_test and the checkpoint tests (tests/sanitizer_check.sh: a use after free by
# any thread), and device_path_test shuffles the copy thread's timing with random delays.
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")/.." && pwd)
if ! echo 'int main(){}' | c++ -fsanitize=thread -x c++ - -o /dev/null 2>/dev/null; then
  echo "skipped: this compiler cannot link -fsanitize=thread"
  exit 77
fi
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPILLARENA_SANITIZE=thread \
  -DSPILLARENA_WITH_TORCH=OFF -DSPILLARENA_BUILD_BENCH=OFF -DSPILLARENA_BUILD_TOOLS=OFF >/dev/null
tests=(slab_allocator_test arena_test hash_pipeline_test io_engine_test fault_injection_test security_test
  mapping_fault_test gds_test)
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
