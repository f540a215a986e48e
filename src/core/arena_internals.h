// What spillarena's own layers need of an arena and its regions beyond the public API (Note
// [A public API a newcomer can hold] in src/core/arena_internals.cc): the LibTorch stash keeps
// one object per arena and reads ahead; the tests, benchmarks and `spillarena plan` control the
// page cache. Internal: not installed, reached with the source tree on the include path.
//
//   #include "core/arena_internals.h"
//   auto pool = spill::detail::attachment(arena, [] { return std::make_shared<Pool>(); });
//   spill::detail::drop_cached_pages(region);  // written back, waited for, out of the cache
//   bool cached = spill::detail::resident(region);
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "spill/arena.h"

namespace spill::detail {

// The core behind a handle: throws spill::Error for a moved-from arena (or a use in a child of
// fork()), MovedFromRegionError for a moved-from or freed region.
struct ArenaAccess {
  static ArenaCore& core(const SpillArena& arena) { return arena.live_core(); }
  static ArenaCore& core(const Region& region) { return region.core_or_throw(); }
};

// One object kept per arena (the stash's host pool and counters), made by `make` at the first
// call, shared by every handle of the arena and destroyed with it.
std::shared_ptr<void> attachment(const SpillArena& arena,
                                 const std::function<std::shared_ptr<void>()>& make);
// io = gds was asked: device inputs go through cuFile.
bool uses_gds(const SpillArena& arena);
// The arena's sizing warnings not yet given (Note [Growing the arena] in
// src/core/arena_growth.cc), each once per arena: the stash warns with them.
std::vector<std::string> take_notices(const SpillArena& arena);

// Bytes of the region held in memory (page cache or host memory); resident(): all of them, so a
// read will not wait for the disk.
std::uint64_t resident_bytes(const Region& region);
inline bool resident(const Region& region) { return resident_bytes(region) >= region.size(); }
// Page-cache hints: readahead of the region; writeback start; writeback, wait and drop.
void read_ahead(const Region& region);
void start_writeback(const Region& region);
void drop_cached_pages(const Region& region);

}  // namespace spill::detail
