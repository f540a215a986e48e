// The one check of memory the library is about to touch against what this process may still
// use (MemAvailable and its memory cgroup's room, spill::memory_limits): more would not fail
// where it is touched but summon the OOM killer, for this process or a neighbour. The arena's
// constructor refuses such staging and host pools (src/core/arena/arena.cc); a grow leaves the
// staging pool as it is (IoEngine::fit_staging).
//
//   std::uint64_t usable = 0;
//   if (!fits_in_usable_memory(bytes, &usable)) return "exceeds " + human_bytes(usable);
#pragma once

#include <cstdint>

#include "spill/process_memory.h"

namespace spill::detail {

// Whether `bytes` fit; `*usable` gets the figure compared against (0 where it is unknown: then
// everything fits).
inline bool fits_in_usable_memory(std::uint64_t bytes, std::uint64_t* usable) {
  *usable = memory_limits().usable_bytes();
  return *usable == 0 || bytes <= *usable;
}

}  // namespace spill::detail
