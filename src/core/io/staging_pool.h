// StagingPool: aligned host memory for direct I/O, preallocated once and reused forever. A
// transfer takes a slot, fills or drains it, and gives it back when its operation completed; a
// writer that finds every slot busy waits, and the pool counts those waits and their time.
// See Note [Direct I/O and the staging pool] in src/core/io/io_engine.cc.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <vector>

#include "core/os/mutex.h"

namespace spill::detail {

class StagingPool {
 public:
  // `budget_bytes` of memory cut into slots of `slot_bytes` (both multiples of the page size,
  // slot_bytes <= budget_bytes). Throws spill::InsufficientSpaceError when the memory cannot be
  // reserved.
  StagingPool(std::uint64_t budget_bytes, std::uint64_t slot_bytes);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  struct Slot {
    char* data = nullptr;
    std::uint32_t index = 0;
  };
  Slot acquire();  // blocks while every slot is in use
  void release(std::uint32_t index) noexcept;

  std::uint64_t slot_bytes() const { return slot_bytes_; }
  std::uint64_t budget_bytes() const { return budget_bytes_; }
  std::uint64_t waits() const;
  std::uint64_t wait_ns() const;

 private:
  const std::uint64_t budget_bytes_;
  const std::uint64_t slot_bytes_;
  char* base_ = nullptr;
  mutable Mutex mutex_;
  std::condition_variable slot_freed_;
  // Most recently released last: its pages are warm.
  std::vector<std::uint32_t> free_ GUARDED_BY(mutex_);
  std::uint64_t waits_ GUARDED_BY(mutex_) = 0;
  std::uint64_t wait_ns_ GUARDED_BY(mutex_) = 0;
};

}  // namespace spill::detail
