// The slab allocator's validity check: SlabAllocator::State::first_broken_invariant, run by
// SlabAllocator::check_invariants and, with SPILLARENA_EXPENSIVE_CHECKS, after every allocate and
// free. See Note [Expensive checks] in src/core/alloc/slab_allocator.cc.
#include <algorithm>

#include "core/alloc/slab_allocator_state.h"

namespace spill {
namespace {

// The same type as SlabAllocator::State::Extents, which is private.
using Extents = std::vector<std::pair<std::uint64_t, std::uint64_t>>;

bool aligned(std::uint64_t value, std::uint64_t alignment) { return value % alignment == 0; }

// Free and live blocks, each sorted by offset, must cover [0, capacity) exactly once, and no
// two free blocks may touch (free coalesces at once).
const char* check_tiling(const Extents& free, const Extents& live, std::uint64_t capacity) {
  std::uint64_t end = 0;
  bool last_was_free = false;
  std::size_t f = 0, l = 0;
  while (f < free.size() || l < live.size()) {
    const bool take_free = l == live.size() || (f < free.size() && free[f].first < live[l].first);
    const auto [offset, size] = take_free ? free[f++] : live[l++];
    if (offset != end) return offset < end ? "blocks overlap" : "bytes neither free nor live";
    if (take_free && last_was_free) return "adjacent free blocks were not coalesced";
    if (size > capacity - end) return "a block ends beyond the capacity";
    end += size;
    last_was_free = take_free;
  }
  return end == capacity ? nullptr : "bytes at the end neither free nor live";
}

}  // namespace

// Note [Allocator invariants]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// What must hold between any two operations, all checked here:
//  - the two free indexes agree: each free block by offset has its (size, ~freed_seq, offset)
//    key by size and the counts match, so best fit sees exactly the blocks coalescing sees;
//  - every block, free or live, is aligned and non-empty; a live block's size is
//    rounded_size(requested) (Note [Size classes]); no free block is stamped later than the last
//    free (Note [LIFO reuse] orders equal fits by that stamp);
//  - free and live blocks sorted by offset tile [0, capacity): no overlap, no lost bytes, and no
//    two free blocks side by side (free coalesces at once);
//  - the counters add up: free + live bytes == capacity; free_bytes, bytes_in_use,
//    bytes_requested and live_blocks equal the sums over the blocks; allocations - frees ==
//    live_blocks; bytes_in_use <= peak; no live block ends past high_water_bytes.
// Both Notes are in src/core/alloc/slab_allocator.cc.
const char* SlabAllocator::State::first_broken_invariant(std::uint64_t alignment,
                                                         std::uint64_t capacity) const {
  if (free_by_offset.size() != free_by_size.size()) return "the free indexes differ in size";
  Extents free, used;
  std::uint64_t free_sum = 0, live_sum = 0, requested_sum = 0;
  if (const char* broken = check_free_blocks(alignment, &free, &free_sum)) return broken;
  if (const char* broken = check_live_blocks(alignment, &used, &live_sum, &requested_sum)) {
    return broken;
  }
  std::sort(used.begin(), used.end());  // free_by_offset is sorted already
  if (const char* broken = check_tiling(free, used, capacity)) return broken;
  return check_counters(capacity, free_sum, live_sum, requested_sum);
}

const char* SlabAllocator::State::check_free_blocks(std::uint64_t alignment, Extents* blocks,
                                                    std::uint64_t* free_sum) const {
  blocks->reserve(free_by_offset.size());
  for (const auto& [offset, fb] : free_by_offset) {
    if (!aligned(offset, alignment) || fb.size == 0 || !aligned(fb.size, alignment)) {
      return "a free block is empty or unaligned";
    }
    if (free_by_size.count(SizeKey{fb.size, ~fb.freed_seq, offset}) == 0) {
      return "a free block is missing from the size index";
    }
    if (fb.freed_seq > seq) return "a free block is stamped later than the last free";
    blocks->emplace_back(offset, fb.size);
    *free_sum += fb.size;
  }
  return nullptr;
}

const char* SlabAllocator::State::check_live_blocks(std::uint64_t alignment, Extents* blocks,
                                                    std::uint64_t* live_sum,
                                                    std::uint64_t* requested_sum) const {
  blocks->reserve(live.size());
  for (const auto& [offset, lb] : live) {
    if (!aligned(offset, alignment) || lb.requested == 0 ||
        lb.size != rounded_size(lb.requested, alignment)) {
      return "a live block is unaligned or not its request's size class";
    }
    if (lb.size > stats.high_water_bytes || offset > stats.high_water_bytes - lb.size) {
      return "a live block ends past high_water_bytes";
    }
    blocks->emplace_back(offset, lb.size);
    *live_sum += lb.size;
    *requested_sum += lb.requested;
  }
  return nullptr;
}

const char* SlabAllocator::State::check_counters(std::uint64_t capacity, std::uint64_t free_sum,
                                                 std::uint64_t live_sum,
                                                 std::uint64_t requested_sum) const {
  if (free_sum + live_sum != capacity) return "free + live bytes differ from the capacity";
  if (free_sum != stats.free_bytes || live_sum != stats.bytes_in_use ||
      requested_sum != stats.bytes_requested || live.size() != stats.live_blocks) {
    return "the stats disagree with the blocks";
  }
  if (stats.allocations - stats.frees != stats.live_blocks ||
      stats.bytes_in_use > stats.peak_bytes_in_use || stats.capacity_bytes != capacity) {
    return "the operation counters disagree";
  }
  return nullptr;
}

}  // namespace spill
