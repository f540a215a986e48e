// An arena whose stashes (spill::checkpoint(arena, ...), spill::make_arena_stash(arena)) use the
// given stash settings: the tests' one way to pair spill::ArenaOptions with spill::StashOptions.
//
//   spill::SpillArena arena =
//       stash_arena(engine_options(dir, io, backend), stash_settings(true, 0));
#pragma once

#include <cstdint>

#include "spill/tensor_stash.h"

namespace spill_test {

inline spill::StashOptions stash_settings(bool asynchronous, std::uint32_t keep_last,
                                          std::uint32_t prefetch_depth = 2) {
  spill::StashOptions s;
  s.asynchronous = asynchronous;
  s.keep_last = keep_last;
  s.prefetch_depth = prefetch_depth;
  return s;
}

inline spill::SpillArena stash_arena(const spill::ArenaOptions& options,
                                     const spill::StashOptions& stash) {
  spill::SpillArena arena(options);
  spill::set_stash_options(arena, stash);
  return arena;
}

}  // namespace spill_test
