// StagingPool: aligned host memory for direct I/O, preallocated and reused (made larger only when
// its arena grows, with no slot in use). A
// transfer takes a slot, fills or drains it, and gives it back when its operation completed; a
// writer that finds every slot busy waits, and the pool counts those waits and their time.
// See Note [Direct I/O and the staging pool] in src/core/io/io_engine.cc.
#pragma once

#include <atomic>
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

  // Replaces the memory with `budget_bytes` in slots of `slot_bytes` (as the constructor), only
  // while every slot is free: the arena calls it when it grew with no region live (Note [The
  // staging pool follows the arena] in io_engine.cc). False, with the pool unchanged, when a slot
  // is in use or the memory cannot be reserved.
  bool resize(std::uint64_t budget_bytes, std::uint64_t slot_bytes);

  // Read without the mutex by transfers: they change only in resize(), with no transfer running.
  std::uint64_t slot_bytes() const { return slot_bytes_.load(std::memory_order_relaxed); }
  std::uint64_t budget_bytes() const { return budget_bytes_.load(std::memory_order_relaxed); }
  std::uint64_t waits() const;
  std::uint64_t wait_ns() const;

 private:
  void hand_out_slots() REQUIRES(mutex_);

  std::atomic<std::uint64_t> budget_bytes_;
  std::atomic<std::uint64_t> slot_bytes_;
  mutable Mutex mutex_;
  char* base_ GUARDED_BY(mutex_) = nullptr;
  std::condition_variable slot_freed_;
  // Most recently released last: its pages are warm.
  std::vector<std::uint32_t> free_ GUARDED_BY(mutex_);
  std::atomic<std::uint64_t> waits_{0};  // atomics, as CountedWait keeps them
  std::atomic<std::uint64_t> wait_ns_{0};
};

}  // namespace spill::detail
