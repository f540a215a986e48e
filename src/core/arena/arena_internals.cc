#include "core/arena/arena_internals.h"

#include <string>

#include "core/arena/arena_core.h"
#include "spill/error.h"

namespace spill::detail {

// Note [A public API a newcomer can hold]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A user of spill::SpillArena allocates regions, moves bytes through them and reads the stats;
// the public headers hold that and what describes it (options, stats, errors, the resolved I/O
// mode and its alignment). What only spillarena's own layers need lives here instead: the
// stash's per-arena object, the gds flag, and the page-cache controls that tests, benchmarks
// and `spillarena plan` use to put data out of the cache. They reach the handles' core through
// ArenaAccess, a friend of both; nothing here is installed. The SpillArena copies of Region's
// read/write/prefetch are gone: a Region already knows its arena. "Prefetch" now means one thing,
// the stash reading an input back ahead of backward (StashOptions::prefetch_depth, the
// prefetch counters); the page-cache hint is "read ahead" (read_ahead, platform::read_ahead_range).

std::shared_ptr<void> attachment(const SpillArena& arena,
                                 const std::function<std::shared_ptr<void>()>& make) {
  return ArenaAccess::core(arena).attachment(make);
}

bool uses_gds(const SpillArena& arena) { return ArenaAccess::core(arena).gds_requested(); }

std::vector<std::string> take_notices(const SpillArena& arena) {
  return ArenaAccess::core(arena).take_notices();
}

// Note [A RAM restore is a view]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A restore from a disk arena copies the region into a tensor of its own (Note [Restoring from
// the mapping] in src/core/stash/cpu_path.cc): a spill file can shrink under a mapping, and a
// SIGBUS inside a LibTorch kernel would end the process. Host memory has no file to shrink, so
// the RAM arena's restore is a view of the region (from_blob), checked once against the write's
// hashes here, and the region is freed with the view's last reference. Copying it instead cost
// BM_RoundTrip/arena_ram/64 4x (11 ms -> 46-50 ms: a new 64 MiB tensor faults its pages in).
const void* host_bytes(const Region& region, std::uint64_t bytes) {
  if (bytes > region.size()) {
    throw InvalidArgumentError("spill: a view of " + std::to_string(bytes) +
                               " bytes overruns a region of " + std::to_string(region.size()) +
                               " bytes; allocate a larger region");
  }
  return ArenaAccess::core(region).host_bytes(region.offset(), bytes);
}

std::uint64_t resident_bytes(const Region& region) {
  return ArenaAccess::core(region).storage().resident_bytes(region.offset(), region.size());
}

bool resident(const Region& region, std::uint64_t bytes) {
  return ArenaAccess::core(region).storage().resident(region.offset(), bytes);
}

void start_writeback(const Region& region) {
  ArenaAccess::core(region).start_writeback(region.offset(), region.size());
}

void drop_cached_pages(const Region& region) {
  ArenaAccess::core(region).drop_cached_pages(region.offset(), region.size());
}

}  // namespace spill::detail
