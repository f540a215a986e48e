// What spillarena's own layers need of an arena and its regions beyond the public API (Note
// [A public API a newcomer can hold] in src/core/arena/arena_internals.cc): the LibTorch stash
// keeps one object per arena and reads ahead; the tests, benchmarks and `spillarena plan` control
// the page cache. Internal: not installed, reached with the source tree on the include path.
//
//   #include "core/arena/arena_internals.h"
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
  static void write_from_device(Region& r, const void* device_ptr, std::uint64_t bytes,
                                std::uint64_t offset_in_region) {
    r.write_from_device(device_ptr, bytes, offset_in_region);
  }
  static void read_to_device(Region& r, void* device_ptr, std::uint64_t bytes,
                             std::uint64_t offset_in_region) {
    r.read_to_device(device_ptr, bytes, offset_in_region);
  }
};

// A RAM arena's region (Backing::ram): its first `bytes` where they are, checked against the
// write's hashes (IntegrityError), counted in bytes_read; InvalidArgumentError for a disk
// arena. See Note [A RAM restore is a view] in arena_internals.cc.
const void* host_bytes(const Region& region, std::uint64_t bytes);

// io = gds (options().io == IoMode::gds): device memory to and from the region through cuFile,
// synchronously; `bytes` and `offset_in_region` multiples of 4 KiB. Not hashed (the host never
// sees the bytes). See Note [GPUDirect Storage] in src/core/io/gds.cc.
inline void write_from_device(Region& region, const void* device_ptr, std::uint64_t bytes,
                              std::uint64_t offset_in_region) {
  ArenaAccess::write_from_device(region, device_ptr, bytes, offset_in_region);
}
inline void read_to_device(Region& region, void* device_ptr, std::uint64_t bytes,
                           std::uint64_t offset_in_region) {
  ArenaAccess::read_to_device(region, device_ptr, bytes, offset_in_region);
}

// One object kept per arena (the stash's host pool and counters), made by `make` at the first
// call, shared by every handle of the arena and destroyed with it.
std::shared_ptr<void> attachment(const SpillArena& arena,
                                 const std::function<std::shared_ptr<void>()>& make);
// io = gds was asked: device inputs go through cuFile.
bool uses_gds(const SpillArena& arena);
// The arena's sizing warnings not yet given (Note [Growing the arena] in
// src/core/arena/arena_growth.cc), each once per arena: the stash warns with them.
std::vector<std::string> take_notices(const SpillArena& arena);

// Bytes of the region held in memory (page cache or host memory); resident(): all of them, or
// all of its first `bytes` (what take_into reads), so a read will not wait for the disk.
std::uint64_t resident_bytes(const Region& region);
inline bool resident(const Region& region) { return resident_bytes(region) >= region.size(); }
bool resident(const Region& region, std::uint64_t bytes);
// Page-cache hints: writeback start; writeback, wait and drop (Region::read_ahead reads ahead).
void start_writeback(const Region& region);
void drop_cached_pages(const Region& region);

}  // namespace spill::detail
