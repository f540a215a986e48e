// AllocatorModel: the slab allocator fuzzer's reference. It knows what SlabAllocator must answer,
// computed the slow, obvious way: a map of live blocks and a map of free gaps, scanned linearly.
//
//   AllocatorModel model(slabs.capacity_bytes());
//   std::optional<std::uint64_t> offset = model.best_fit(size);  // where the block must go
//   model.allocate(*block, requested_bytes);                     // false: overlaps or outside
//   model.free(*block);
//   compare(slabs.stats(), model.stats());
//
// Note [Why the model tracks free order]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The allocator promises best fit, the most recently freed block among equal fits, carved from
// the front (see Note [LIFO reuse] in src/core/alloc/slab_allocator.cc). The model stamps each gap
// with the count of frees when it last grew, so best_fit can name the exact offset the allocator
// must return, not merely "some block that fits".
#pragma once

#include <cstdint>
#include <iterator>
#include <map>
#include <optional>

#include "core/alloc/slab_allocator.h"

namespace spill_fuzz {

class AllocatorModel {
 public:
  explicit AllocatorModel(std::uint64_t capacity_bytes) {
    stats_.capacity_bytes = capacity_bytes;
    stats_.free_bytes = capacity_bytes;
    if (capacity_bytes > 0) gaps_.emplace(0, Gap{capacity_bytes, 0});
  }

  // The offset a block of `size` (already rounded) must get, or nullopt when no gap holds it.
  std::optional<std::uint64_t> best_fit(std::uint64_t size) const {
    std::optional<std::uint64_t> best;
    const Gap* best_gap = nullptr;
    for (const auto& [offset, gap] : gaps_) {
      if (gap.size < size) continue;
      if (best_gap == nullptr || gap.size < best_gap->size ||
          (gap.size == best_gap->size && gap.freed_seq > best_gap->freed_seq)) {
        best = offset;
        best_gap = &gap;
      }
    }
    return best;
  }

  // Records a block the allocator handed out. False when it is not wholly inside one free gap:
  // it would overlap a live block or reach past the capacity.
  bool allocate(const spill::Block& block, std::uint64_t requested_bytes) {
    auto gap = gap_containing(block.offset);
    if (gap == gaps_.end() || block.size == 0) return false;
    const std::uint64_t gap_end = gap->first + gap->second.size;
    if (block.size > gap_end - block.offset) return false;
    const Gap old = gap->second;
    const std::uint64_t gap_offset = gap->first;
    gaps_.erase(gap);
    if (block.offset > gap_offset) {
      gaps_.emplace(gap_offset, Gap{block.offset - gap_offset, old.freed_seq});
    }
    const std::uint64_t end = block.offset + block.size;
    if (end < gap_end) gaps_.emplace(end, Gap{gap_end - end, old.freed_seq});
    live_.emplace(block.offset, Live{block.size, requested_bytes});
    count_allocation(block, requested_bytes);
    return true;
  }

  // True when `block` is exactly a live block (same offset and size): free must accept it.
  bool is_live(const spill::Block& block) const {
    auto it = live_.find(block.offset);
    return it != live_.end() && it->second.size == block.size;
  }

  // Frees a block for which is_live holds; the gap it leaves joins its free neighbours.
  void free(const spill::Block& block) {
    auto it = live_.find(block.offset);
    stats_.bytes_in_use -= block.size;
    stats_.bytes_requested -= it->second.requested;
    stats_.free_bytes += block.size;
    --stats_.live_blocks;
    ++stats_.frees;
    live_.erase(it);
    std::uint64_t offset = block.offset;
    std::uint64_t size = block.size;
    auto next = gaps_.find(offset + size);
    if (next != gaps_.end()) {
      size += next->second.size;
      gaps_.erase(next);
    }
    auto prev = gaps_.lower_bound(offset);
    if (prev != gaps_.begin() && std::prev(prev)->first + std::prev(prev)->second.size == offset) {
      --prev;
      offset = prev->first;
      size += prev->second.size;
      gaps_.erase(prev);
    }
    gaps_.emplace(offset, Gap{size, ++free_seq_});
  }

  // What SlabAllocator::stats() must report now.
  spill::AllocatorStats stats() const {
    spill::AllocatorStats s = stats_;
    for (const auto& [offset, gap] : gaps_) {
      if (gap.size > s.largest_free_block) s.largest_free_block = gap.size;
    }
    return s;
  }

  std::uint64_t free_gap_count() const { return gaps_.size(); }

 private:
  struct Gap {
    std::uint64_t size;
    std::uint64_t freed_seq;  // frees counted when this gap last grew; larger = more recent
  };
  struct Live {
    std::uint64_t size;
    std::uint64_t requested;
  };

  std::map<std::uint64_t, Gap>::iterator gap_containing(std::uint64_t offset) {
    auto it = gaps_.upper_bound(offset);
    if (it == gaps_.begin()) return gaps_.end();
    --it;
    return offset - it->first < it->second.size ? it : gaps_.end();
  }

  void count_allocation(const spill::Block& block, std::uint64_t requested_bytes) {
    const std::uint64_t end = block.offset + block.size;
    if (end <= stats_.high_water_bytes) ++stats_.reuse_hits;
    if (end > stats_.high_water_bytes) stats_.high_water_bytes = end;
    stats_.bytes_in_use += block.size;
    if (stats_.bytes_in_use > stats_.peak_bytes_in_use) {
      stats_.peak_bytes_in_use = stats_.bytes_in_use;
    }
    stats_.bytes_requested += requested_bytes;
    stats_.free_bytes -= block.size;
    ++stats_.live_blocks;
    ++stats_.allocations;
  }

  std::map<std::uint64_t, Gap> gaps_;
  std::map<std::uint64_t, Live> live_;
  std::uint64_t free_seq_ = 0;
  spill::AllocatorStats stats_;
};

}  // namespace spill_fuzz
