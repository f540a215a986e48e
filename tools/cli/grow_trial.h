// `spillarena plan`'s grow trial: an arena in the directory is made too small, overflows and
// grows, as a training run's arena does when a step needs more than its capacity.
//
//   GrowTrial g = try_growing("/mnt/nvme", 64ull << 20);
//   if (g.stats.grows == 1) std::cout << "grew in " << g.grow_ms << " ms\n";
//   else std::cout << "cannot grow: " << g.stats.grow_note << "\n";
//   nlohmann::json j = to_json(g);  // overflows, overflow_bytes, ..., grow_ms
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "spill/arena.h"

namespace spill::cli {

struct GrowTrial {
  ArenaStats stats;    // the trial arena's, after the grow (or the refused grow)
  double grow_ms = 0;  // the allocation that grew it, all of it: statfs, fallocate, mmap
};

// Makes a one-page arena in `directory`, asks it for `bytes` (at least two pages: an overflow),
// then for one page with nothing live: that allocation grows the file to `bytes`. Throws
// spill::Error when the directory cannot hold even the one-page arena.
GrowTrial try_growing(const std::string& directory, std::uint64_t bytes);

// The sizing fields of the trial's stats (overflows, overflow_bytes, capacity_needed_bytes,
// initial_capacity_bytes, grows, grow_failures, grow_note), capacity_bytes after it, grow_ms.
nlohmann::json to_json(const GrowTrial& trial);

// One line for plan's text report: what grew from what to what in how long, or why it did not.
std::string describe(const GrowTrial& trial);

}  // namespace spill::cli
