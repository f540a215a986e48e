#include "spill/slab_allocator.h"

#include <limits>
#include <string>

#include "spill/error.h"

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
    : alignment_(alignment_bytes), capacity_(capacity_bytes / alignment_bytes * alignment_bytes) {
  stats_.capacity_bytes = capacity_;
  stats_.free_bytes = capacity_;
  if (capacity_ > 0) insert_free(0, capacity_, 0);
}

// ---------------------------------------------------------------------------------------------
// Free-block index: by offset (for coalescing) and by (size, recency) (for best fit, LIFO)
// ---------------------------------------------------------------------------------------------

void SlabAllocator::insert_free(std::uint64_t offset, std::uint64_t size, std::uint64_t seq) {
  free_by_offset_.emplace(offset, FreeBlock{size, seq});
  free_by_size_.emplace(size, ~seq, offset);
}

void SlabAllocator::erase_free(std::map<std::uint64_t, FreeBlock>::iterator it) {
  free_by_size_.erase(SizeKey{it->second.size, ~it->second.freed_seq, it->first});
  free_by_offset_.erase(it);
}

std::uint64_t SlabAllocator::largest_free_locked() const {
  return free_by_size_.empty() ? 0 : std::get<0>(*free_by_size_.rbegin());
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
  std::lock_guard<std::mutex> lock(mutex_);
  auto fit = free_by_size_.lower_bound(SizeKey{size, 0, 0});
  if (size > capacity_ || fit == free_by_size_.end()) return std::nullopt;
  const std::uint64_t offset = std::get<2>(*fit);
  auto it = free_by_offset_.find(offset);
  const FreeBlock found = it->second;
  erase_free(it);
  if (found.size > size) insert_free(offset + size, found.size - size, found.freed_seq);

  live_.emplace(offset, LiveBlock{size, bytes});
  if (offset + size <= stats_.high_water_bytes) ++stats_.reuse_hits;
  stats_.high_water_bytes = std::max(stats_.high_water_bytes, offset + size);
  stats_.bytes_in_use += size;
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  stats_.bytes_requested += bytes;
  stats_.free_bytes -= size;
  ++stats_.live_blocks;
  ++stats_.allocations;
  return Block{offset, size};
}

void SlabAllocator::free(const Block& block) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto live = live_.find(block.offset);
  if (live == live_.end() || live->second.size != block.size) {
    throw InvalidArgumentError("spill: free of a block that is not live (offset " +
                               std::to_string(block.offset) + ", size " +
                               std::to_string(block.size) + "): double free or foreign block");
  }
  stats_.bytes_in_use -= block.size;
  stats_.bytes_requested -= live->second.requested;
  stats_.free_bytes += block.size;
  --stats_.live_blocks;
  ++stats_.frees;
  live_.erase(live);

  std::uint64_t offset = block.offset;
  std::uint64_t size = block.size;
  auto next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.end() && next->first == offset + size) {
    size += next->second.size;
    next = std::next(next);
    erase_free(std::prev(next));
  }
  if (next != free_by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size == offset) {
      offset = prev->first;
      size += prev->second.size;
      erase_free(prev);
    }
  }
  insert_free(offset, size, ++seq_);
}

// ---------------------------------------------------------------------------------------------
// Stats and invariants
// ---------------------------------------------------------------------------------------------

AllocatorStats SlabAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  AllocatorStats s = stats_;
  s.largest_free_block = largest_free_locked();
  return s;
}

bool SlabAllocator::check_invariants() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_by_offset_.size() != free_by_size_.size()) return false;
  std::uint64_t free_sum = 0;
  std::uint64_t prev_end = 0;
  bool first = true;
  for (const auto& [offset, fb] : free_by_offset_) {
    if (offset % alignment_ != 0 || fb.size == 0 || fb.size % alignment_ != 0) return false;
    if (!first && offset <= prev_end) return false;  // overlapping or not coalesced
    if (free_by_size_.count(SizeKey{fb.size, ~fb.freed_seq, offset}) == 0) return false;
    prev_end = offset + fb.size;
    first = false;
    free_sum += fb.size;
  }
  if (prev_end > capacity_) return false;
  std::uint64_t live_sum = 0;
  std::uint64_t requested_sum = 0;
  for (const auto& [offset, lb] : live_) {
    auto after = free_by_offset_.upper_bound(offset);
    if (after != free_by_offset_.end() && offset + lb.size > after->first) return false;
    if (after != free_by_offset_.begin()) {
      auto before = std::prev(after);
      if (before->first + before->second.size > offset) return false;
    }
    live_sum += lb.size;
    requested_sum += lb.requested;
  }
  return free_sum + live_sum == capacity_ && live_sum == stats_.bytes_in_use &&
         requested_sum == stats_.bytes_requested && free_sum == stats_.free_bytes &&
         live_.size() == stats_.live_blocks;
}

}  // namespace spill
