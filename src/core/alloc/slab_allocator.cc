#include "core/alloc/slab_allocator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <string>

#include "core/alloc/slab_allocator_state.h"
#include "spill/error.h"

// See Note [Expensive checks]. Without the CMake option: on unless NDEBUG.
#ifndef SPILLARENA_EXPENSIVE_CHECKS
#ifdef NDEBUG
#define SPILLARENA_EXPENSIVE_CHECKS 0
#else
#define SPILLARENA_EXPENSIVE_CHECKS 1
#endif
#endif

namespace spill {
namespace {

std::uint64_t round_up(std::uint64_t value, std::uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

int floor_log2(std::uint64_t v) { return 63 - __builtin_clzll(v); }

}  // namespace

// Note [Size classes]
// ~~~~~~~~~~~~~~~~~~~
// Requests are first rounded to whole pages. Up to 4 pages they stay exact. Above, the page count
// p in (2^n, 2^(n+1)] is rounded up to a multiple of 2^(n-2): the classes 5, 6, 7, 8 x 2^(n-2)
// pages, four per doubling as in jemalloc and mimalloc. A class is at most 5/4 of the smallest
// request it serves, so internal waste is at most 20 % of the reserved size. Above
// kExactCarveAboveBytes a block is carved exactly: 20 % of a 1 GiB activation is too much disk,
// and such sizes repeat exactly from step to step, so classes buy nothing there.
std::uint64_t SlabAllocator::rounded_size(std::uint64_t bytes, std::uint64_t alignment_bytes) {
  if (bytes == 0) return 0;
  const std::uint64_t pages = bytes / alignment_bytes + (bytes % alignment_bytes != 0);
  // Rounding up would overflow: larger than any capacity (a multiple of the alignment), so the
  // largest value stands for it and is never served.
  if (pages > std::numeric_limits<std::uint64_t>::max() / alignment_bytes) {
    return std::numeric_limits<std::uint64_t>::max();
  }
  if (pages <= 4 || bytes > kExactCarveAboveBytes) return pages * alignment_bytes;
  const std::uint64_t step = 1ull << (floor_log2(pages - 1) - 2);
  return round_up(pages, step) * alignment_bytes;
}

SlabAllocator::SlabAllocator(std::uint64_t capacity_bytes, std::uint64_t alignment_bytes)
    : alignment_(alignment_bytes),
      capacity_(capacity_bytes / alignment_bytes * alignment_bytes),
      state_(std::make_unique<State>()) {
  detail::MutexLock lock(state_->mutex);
  const std::uint64_t capacity = capacity_.load();
  state_->stats.capacity_bytes = capacity;
  state_->stats.free_bytes = capacity;
  if (capacity > 0) state_->insert_free(0, capacity, 0);
}

void SlabAllocator::grow(std::uint64_t capacity_bytes) {
  const std::uint64_t capacity = capacity_bytes / alignment_ * alignment_;
  State& s = *state_;
  detail::MutexLock lock(s.mutex);
  const std::uint64_t old = capacity_.load();
  if (capacity < old) {
    throw InvalidArgumentError("spill: cannot grow an allocator of " + std::to_string(old) +
                               " bytes to " + std::to_string(capacity) + ": it never shrinks");
  }
  if (capacity == old) return;
  s.insert_coalesced(old, capacity - old);
  s.stats.capacity_bytes = capacity;
  s.stats.free_bytes += capacity - old;
  capacity_.store(capacity);
  s.expensive_check(alignment_, capacity, "grow");
}

SlabAllocator::~SlabAllocator() = default;

// Note [Expensive checks]
// ~~~~~~~~~~~~~~~~~~~~~~~
// With SPILLARENA_EXPENSIVE_CHECKS every allocate and free ends, still under the lock, by walking
// the whole state (State::first_broken_invariant, O(n log n); see Note [Allocator invariants] in
// src/core/alloc/slab_allocator_invariants.cc) and aborts naming the first broken invariant, as
// mimalloc's mi_assert_expensive runs mi_page_is_valid: a bug shows at the operation that made
// it, not thousands of operations later as two tensors sharing bytes. It is on in Debug builds
// (the CMake option SPILLARENA_EXPENSIVE_CHECKS; without CMake, whenever NDEBUG is not defined),
// in slab_allocator_test, under AddressSanitizer + UBSan (tests/sanitizer_check.sh) and in the
// fuzzer (tests/fuzz/). Release builds compile it out: a walk per operation would undo the
// O(log n) the indexes buy.
void SlabAllocator::State::expensive_check(std::uint64_t alignment, std::uint64_t capacity,
                                           const char* after) const {
  if constexpr (SPILLARENA_EXPENSIVE_CHECKS != 0) {
    if (const char* broken = first_broken_invariant(alignment, capacity)) {
      std::fprintf(stderr, "spill: SlabAllocator invariant broken after %s: %s\n", after, broken);
      std::abort();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// allocate / free
// ---------------------------------------------------------------------------------------------

// Note [LIFO reuse]
// ~~~~~~~~~~~~~~~~~
// Best fit, and among equal fits the block freed most recently: its pages are the likeliest to
// still be in the page cache and its file blocks are already written. In a training step regions
// are freed in the reverse order of allocation, coalesce back into one block, and the next step
// carves the same offsets again from the front, so the file's used prefix stays put.
std::optional<Block> SlabAllocator::allocate(std::uint64_t bytes) {
  if (bytes == 0) {
    throw InvalidArgumentError(
        "spill: cannot allocate a region of 0 bytes; skip empty tensors before allocating");
  }
  const std::uint64_t size = rounded_size(bytes, alignment_);
  State& s = *state_;
  detail::MutexLock lock(s.mutex);
  auto fit = s.free_by_size.lower_bound(State::SizeKey{size, 0, 0});
  if (size > capacity_.load() || fit == s.free_by_size.end()) return std::nullopt;
  const std::uint64_t offset = std::get<2>(*fit);
  auto it = s.free_by_offset.find(offset);
  const State::FreeBlock found = it->second;
  s.erase_free(it);
  if (found.size > size) s.insert_free(offset + size, found.size - size, found.freed_seq);
  s.live.emplace(offset, State::LiveBlock{size, bytes});
  s.count_allocation(offset, size, bytes);
  s.expensive_check(alignment_, capacity_.load(), "allocate");
  return Block{offset, size};
}

void SlabAllocator::State::count_allocation(std::uint64_t offset, std::uint64_t size,
                                            std::uint64_t requested) {
  if (offset + size <= stats.high_water_bytes) ++stats.reuse_hits;
  stats.high_water_bytes = std::max(stats.high_water_bytes, offset + size);
  stats.bytes_in_use += size;
  stats.peak_bytes_in_use = std::max(stats.peak_bytes_in_use, stats.bytes_in_use);
  stats.bytes_requested += requested;
  stats.free_bytes -= size;
  ++stats.live_blocks;
  ++stats.allocations;
}

void SlabAllocator::free(const Block& block) {
  State& s = *state_;
  detail::MutexLock lock(s.mutex);
  auto live = s.live.find(block.offset);
  if (live == s.live.end() || live->second.size != block.size) {
    throw InvalidArgumentError("spill: free of a block that is not live (offset " +
                               std::to_string(block.offset) + ", size " +
                               std::to_string(block.size) + "): double free or foreign block");
  }
  s.stats.bytes_in_use -= block.size;
  s.stats.bytes_requested -= live->second.requested;
  s.stats.free_bytes += block.size;
  --s.stats.live_blocks;
  ++s.stats.frees;
  s.live.erase(live);
  s.insert_coalesced(block.offset, block.size);
  s.expensive_check(alignment_, capacity_.load(), "free");
}

// Joins [offset, offset + size) with a free neighbour on either side, stamped as freed now.
void SlabAllocator::State::insert_coalesced(std::uint64_t offset, std::uint64_t size) {
  auto next = free_by_offset.lower_bound(offset);
  if (next != free_by_offset.end() && next->first == offset + size) {
    size += next->second.size;
    next = std::next(next);
    erase_free(std::prev(next));
  }
  if (next != free_by_offset.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size == offset) {
      offset = prev->first;
      size += prev->second.size;
      erase_free(prev);
    }
  }
  insert_free(offset, size, ++seq);
}

// ---------------------------------------------------------------------------------------------
// Stats and invariants
// ---------------------------------------------------------------------------------------------

AllocatorStats SlabAllocator::stats() const {
  detail::MutexLock lock(state_->mutex);
  AllocatorStats s = state_->stats;
  s.largest_free_block = state_->largest_free();
  return s;
}

bool SlabAllocator::check_invariants() const {
  detail::MutexLock lock(state_->mutex);
  return state_->first_broken_invariant(alignment_, capacity_.load()) == nullptr;
}

}  // namespace spill
