#!/usr/bin/env bash
# Builds the tests with AddressSanitizer + UndefinedBehaviorSanitizer in their own tree ($1) and
# runs them: the torch-free core tests and, unless $2 is OFF, the LibTorch checkpoint tests. The
# slab allocator checks its invariants after every operation here (SPILLARENA_EXPENSIVE_CHECKS).
# Exit 77 (skipped) where the compiler cannot link -fsanitize=address,undefined.
#
# Note [Sanitizing next to an uninstrumented LibTorch]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Only spillarena's own code and the tests are instrumented; LibTorch comes prebuilt from .venv.
# AddressSanitizer still intercepts every malloc and free in the process, so spillarena reading
# or writing past a block that LibTorch allocated is caught; what LibTorch does inside itself is
# not checked. LeakSanitizer sees LibTorch's allocations too: tests/lsan_suppressions.txt is where
# leaks inside LibTorch would be suppressed (none are reported today). UBSan is built with
# -fno-sanitize-recover=all, so a finding ends the test with a failure instead of a warning.
#
# Warnings are not errors here: GCC warns falsely under -fsanitize, and the main build already
# holds every warning to -Werror.
#
# Note [The sanitizer tree is clang's]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# This tree is built with clang++ where it links -fsanitize=address,undefined (scripts/setup.sh
# --tests installs clang and its sanitizer runtimes), else with c++. On the 2-core CI machine
# (2026-12-04, torch 2.13.0) the whole entry took 235 CPU-seconds with clang 14 against 482 with
# GCC 12: the precompiled <torch/torch.h> 11 s against 30, a LibTorch unit 8.5 s against 17.6,
# and the tests ran faster under clang's instrumentation (integrity_test 21 s against 33). Clang's
# -fsanitize=undefined holds every check GCC's does and more (float-cast-overflow, function);
# at -g1 a report names file, line and column. The main build stays GCC's: the project compiles
# with both.
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=tests/sanitizer_compiler.sh
source "$src/tests/sanitizer_compiler.sh"
if ! cxx=$(sanitizer_cxx address,undefined); then
  echo "skipped: this compiler cannot link -fsanitize=address,undefined"
  exit 77
fi
echo "sanitizer_check: built with $cxx"
with_torch=${2:-ON}
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -fno-omit-frame-pointer -fno-sanitize-recover=all" \
  -DSPILLARENA_SANITIZE=address,undefined -DSPILLARENA_WITH_TORCH="$with_torch" \
  -DSPILLARENA_EXPENSIVE_CHECKS=ON \
  -DSPILLARENA_BUILD_BENCH=OFF -DSPILLARENA_BUILD_TOOLS=OFF -DSPILLARENA_WERROR=OFF >/dev/null
tests=(slab_allocator_test spill_file_test arena_test sizing_test io_engine_test fault_injection_test
  security_test mapping_fault_test fork_test gds_test)
[[ $with_torch == ON ]] &&
  tests+=(checkpoint_test overlapped_checkpoint_test integrity_test device_path_test gds_stash_test)
cmake --build "$build" --target "${tests[@]}" >"$build/build.log" 2>&1 || {
  tail -n 60 "$build/build.log"
  exit 1
}

asan_options=(detect_leaks=1 abort_on_error=1 strict_string_checks=1
  detect_stack_use_after_return=1 check_initialization_order=1)
export ASAN_OPTIONS="${asan_options[*]}"
export LSAN_OPTIONS="suppressions=$src/tests/lsan_suppressions.txt:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
for t in "${tests[@]}"; do
  start=$SECONDS
  "$build/tests/$t"
  echo "sanitizer_check: $t clean under address,undefined ($((SECONDS - start)) s)"
done
