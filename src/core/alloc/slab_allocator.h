// SlabAllocator: a best-fit allocator over size classes, with coalescing, that carves a byte
// range [0, capacity) into page-aligned blocks ("slab allocator" is the product's name for it;
// it has no slabs of equal objects). It knows nothing of files or tensors: SpillArena puts it
// over a spill file (or host memory), the LibTorch layer over its host pool. Internal (not
// installed); the fuzzer and the tests reach it with src/ on the include path.
//
//   spill::SlabAllocator slabs(1ull << 30);                 // 1 GiB of offsets, 4 KiB pages
//   std::optional<spill::Block> b = slabs.allocate(3000);   // -> {offset 0, size 4096}
//   if (b) {
//     use(b->offset, b->size);
//     slabs.free(*b);
//   }
//   spill::AllocatorStats s = slabs.stats();                // exact, O(1) except largest block
//
// Thread-safe: any thread may allocate or free any block.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

namespace spill {

struct Block {
  std::uint64_t offset = 0;  // multiple of the alignment
  std::uint64_t size = 0;    // rounded size actually reserved
};

struct AllocatorStats {
  std::uint64_t capacity_bytes = 0;
  std::uint64_t bytes_in_use = 0;       // sum of rounded sizes of live blocks
  std::uint64_t peak_bytes_in_use = 0;  // maximum of bytes_in_use so far
  std::uint64_t bytes_requested = 0;    // sum of the sizes asked for by live blocks
  std::uint64_t live_blocks = 0;
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t reuse_hits = 0;          // allocations that fit entirely in space used before
  std::uint64_t largest_free_block = 0;  // after coalescing (the allocator always coalesces)
  std::uint64_t free_bytes = 0;
  std::uint64_t high_water_bytes = 0;  // highest end offset ever handed out
};

class SlabAllocator {
 public:
  // Requests above this size are carved exactly (rounded to the alignment only).
  static constexpr std::uint64_t kExactCarveAboveBytes = 64ull << 20;

  // capacity_bytes is rounded down to a multiple of alignment_bytes (a power of two).
  explicit SlabAllocator(std::uint64_t capacity_bytes, std::uint64_t alignment_bytes = 4096);

  ~SlabAllocator();
  SlabAllocator(const SlabAllocator&) = delete;
  SlabAllocator& operator=(const SlabAllocator&) = delete;

  // The rounded size a request of `bytes` reserves. See Note [Size classes] in
  // src/core/alloc/slab_allocator.cc.
  static std::uint64_t rounded_size(std::uint64_t bytes, std::uint64_t alignment_bytes = 4096);

  // A block of at least `bytes` (> 0), or nullopt when no free block is large enough.
  // Throws spill::InvalidArgumentError for 0 bytes.
  std::optional<Block> allocate(std::uint64_t bytes);

  // Returns a block handed out by allocate. Throws spill::InvalidArgumentError for a block that
  // is not live (double free, foreign block); the allocator is unchanged then.
  void free(const Block& block);

  AllocatorStats stats() const;
  std::uint64_t alignment_bytes() const { return alignment_; }
  std::uint64_t capacity_bytes() const { return capacity_.load(); }

  // Extends the range to [0, capacity_bytes) (rounded down to the alignment): the new bytes join
  // the free block at the end, or become one. Live blocks stay where they are. Throws
  // spill::InvalidArgumentError when the rounded capacity is below the current one (the range
  // never shrinks); equal is a no-op.
  void grow(std::uint64_t capacity_bytes);

  // Checks every internal invariant (free blocks sorted, disjoint, coalesced, indexes agree,
  // counters add up). For tests; O(n log n). Builds with SPILLARENA_EXPENSIVE_CHECKS run it after
  // every allocate and free. See Note [Expensive checks] in src/core/alloc/slab_allocator.cc.
  bool check_invariants() const;

 private:
  // The free-block indexes, the live blocks, the counters and the mutex that guards them, in
  // src/core/alloc/slab_allocator_state.h: one pointer keeps containers and locks out of this
  // header.
  struct State;

  const std::uint64_t alignment_;
  std::atomic<std::uint64_t> capacity_;  // written under the state's mutex (grow)
  const std::unique_ptr<State> state_;
};

}  // namespace spill
