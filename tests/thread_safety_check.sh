#!/usr/bin/env bash
# Compiles every source of the core library (src/core/*/*.cc) with clang's -Wthread-safety -Werror
# (syntax only, no build tree): a member marked GUARDED_BY(m) read or written without m held, or
# a REQUIRES(m) function called without it, fails. See src/core/os/thread_annotations.h.
# $1 (optional): LibTorch's include directories, ':'-separated (CMake's TORCH_INCLUDE_DIRS);
# then the LibTorch front end's files that lock (src/torch_layer: the stash's C++ front end) and
# the tests' emulated accelerator (tests/support) are checked too; the stash itself (its pool,
# copies and progress thread) is torch-free, in src/core/stash, and checked with the core.
# forward_state.cc locks LibTorch's own generator mutex, which carries no annotations, and is
# left out.
# Exit 77 (skipped) where there is no clang++.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
clangxx=${SPILLARENA_CLANGXX:-$(command -v clang++ || command -v clang++-14 || true)}
if [[ -z $clangxx ]]; then
  echo "skipped: no clang++ (-Wthread-safety is clang's; apt-get install clang)"
  exit 77
fi
flags=(-std=c++17 -fsyntax-only -Wthread-safety -Werror -I"$src/include" -I"$src/src"
  -DSPILLARENA_EXPENSIVE_CHECKS=1)
# io_uring_queue.cc compiles its ring only where liburing is installed, as CMakeLists.txt does.
if echo '#include <liburing.h>' | "$clangxx" -fsyntax-only -x c++ - 2>/dev/null; then
  flags+=(-DSPILLARENA_HAVE_LIBURING)
fi

# The check itself must be live: a guarded member written without its mutex has to fail.
probe='#include "core/os/mutex.h"
struct Probe { spill::detail::Mutex m; int x GUARDED_BY(m) = 0; void f() { ++x; } };'
if echo "$probe" | "$clangxx" "${flags[@]}" -x c++ - 2>/dev/null; then
  echo "thread_safety_check: an unguarded write compiled; the annotations are not checked"
  exit 1
fi

failed=0
checked="src/core/*/*.cc"
for f in "$src"/src/core/*/*.cc; do
  "$clangxx" "${flags[@]}" "$f" || { echo "thread_safety_check: ${f#"$src"/} fails"; failed=1; }
done
if [[ -n ${1:-} ]]; then
  torch_flags=(-I"$src/src")
  IFS=':' read -r -a torch_dirs <<<"$1"
  for d in "${torch_dirs[@]}"; do torch_flags+=(-isystem "$d"); done
  for name in arena_stash stream_engine; do
    f=$src/src/torch_layer/$name.cc
    "$clangxx" "${flags[@]}" "${torch_flags[@]}" "$f" ||
      { echo "thread_safety_check: ${f#"$src"/} fails"; failed=1; }
  done
  # The tests' emulated accelerator (its copies and engine have mutexes of their own).
  f=$src/tests/support/accelerator_emulation.cc
  "$clangxx" "${flags[@]}" "${torch_flags[@]}" "$f" ||
    { echo "thread_safety_check: ${f#"$src"/} fails"; failed=1; }
  checked+=" and the stash's C++ front end in src/torch_layer (and tests/support's emulation)"
fi
[[ $failed == 0 ]] && echo "thread_safety_check: $checked clean under -Wthread-safety"
exit $failed
