// SlabAllocator::State: what SlabAllocator (src/core/alloc/slab_allocator.h, internal) holds
// behind its one pointer: the two indexes of the free blocks, the live blocks, the counters and
// the mutex that guards them all. Only slab_allocator.cc and slab_allocator_invariants.cc see it.
//
//   SlabAllocator::State& s = *state_;
//   MutexLock lock(s.mutex);
//   auto fit = s.free_by_size.lower_bound(SizeKey{size, 0, 0});   // best fit, most recent first
//   s.erase_free(s.free_by_offset.find(std::get<2>(*fit)));
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/alloc/slab_allocator.h"
#include "core/os/mutex.h"
#include "core/os/thread_annotations.h"

namespace spill {

struct SlabAllocator::State {
  struct FreeBlock {
    std::uint64_t size;
    std::uint64_t freed_seq;  // larger = freed more recently
  };
  struct LiveBlock {
    std::uint64_t size;
    std::uint64_t requested;
  };
  // (size, ~freed_seq, offset): the first entry >= (n, 0, 0) is the best fit, most recent first.
  // See Note [LIFO reuse] in src/core/alloc/slab_allocator.cc.
  using SizeKey = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>;
  using FreeByOffset = std::map<std::uint64_t, FreeBlock>;

  void insert_free(std::uint64_t offset, std::uint64_t size, std::uint64_t seq) REQUIRES(mutex) {
    free_by_offset.emplace(offset, FreeBlock{size, seq});
    free_by_size.emplace(size, ~seq, offset);
  }

  void erase_free(FreeByOffset::iterator it) REQUIRES(mutex) {
    free_by_size.erase(SizeKey{it->second.size, ~it->second.freed_seq, it->first});
    free_by_offset.erase(it);
  }

  std::uint64_t largest_free() const REQUIRES(mutex) {
    return free_by_size.empty() ? 0 : std::get<0>(*free_by_size.rbegin());
  }

  // Defined in slab_allocator.cc: the counters' share of allocate, free's coalescing, and the
  // check after each (a no-op unless SPILLARENA_EXPENSIVE_CHECKS; see Note [Expensive checks]).
  void count_allocation(std::uint64_t offset, std::uint64_t size, std::uint64_t requested)
      REQUIRES(mutex);
  void insert_coalesced(std::uint64_t offset, std::uint64_t size) REQUIRES(mutex);
  void expensive_check(std::uint64_t alignment, std::uint64_t capacity, const char* after) const
      REQUIRES(mutex);

  // nullptr when every invariant holds, else which one is broken. O(n log n). See
  // Note [Allocator invariants] in src/core/alloc/slab_allocator_invariants.cc.
  const char* first_broken_invariant(std::uint64_t alignment, std::uint64_t capacity) const
      REQUIRES(mutex);
  // Its parts: each appends its blocks' (offset, size) to *blocks and adds their bytes to *sums.
  using Extents = std::vector<std::pair<std::uint64_t, std::uint64_t>>;
  const char* check_free_blocks(std::uint64_t alignment, Extents* blocks,
                                std::uint64_t* free_sum) const REQUIRES(mutex);
  const char* check_live_blocks(std::uint64_t alignment, Extents* blocks, std::uint64_t* live_sum,
                                std::uint64_t* requested_sum) const REQUIRES(mutex);
  const char* check_counters(std::uint64_t capacity, std::uint64_t free_sum, std::uint64_t live_sum,
                             std::uint64_t requested_sum) const REQUIRES(mutex);

  mutable detail::Mutex mutex;
  FreeByOffset free_by_offset GUARDED_BY(mutex);     // for coalescing with neighbours
  std::set<SizeKey> free_by_size GUARDED_BY(mutex);  // for best fit
  std::unordered_map<std::uint64_t, LiveBlock> live GUARDED_BY(mutex);  // by offset
  std::uint64_t seq GUARDED_BY(mutex) = 0;  // the latest free's freed_seq (0: none yet)
  AllocatorStats stats GUARDED_BY(mutex);
};

}  // namespace spill
