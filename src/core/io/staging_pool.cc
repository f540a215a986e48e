#include "core/io/staging_pool.h"

#include <chrono>
#include <cstring>
#include <string>

#include "core/os/platform.h"
#include "spill/error.h"
#include "spill/units.h"

namespace spill::detail {

StagingPool::StagingPool(std::uint64_t budget_bytes, std::uint64_t slot_bytes)
    : budget_bytes_(budget_bytes), slot_bytes_(slot_bytes) {
  void* base = nullptr;
  if (int e = platform::map_anonymous(budget_bytes, &base); e != 0) {
    throw InsufficientSpaceError("<staging>", budget_bytes, platform::mem_available_bytes(),
                                 "spill: cannot reserve the staging pool of " +
                                     bytes_with_units(budget_bytes) + ": " + std::strerror(e) +
                                     "; lower ArenaOptions::staging_bytes");
  }
  base_ = static_cast<char*>(base);
  std::memset(base_, 0, budget_bytes);  // resident now, not at the first spill
  const auto slots = static_cast<std::uint32_t>(budget_bytes / slot_bytes);
  for (std::uint32_t i = slots; i > 0; --i) free_.push_back(i - 1);
}

StagingPool::~StagingPool() { platform::unmap(base_, budget_bytes_); }

StagingPool::Slot StagingPool::acquire() {
  MutexLock lock(mutex_);
  if (free_.empty()) {
    const auto start = std::chrono::steady_clock::now();
    slot_freed_.wait(lock, [this]() REQUIRES(mutex_) { return !free_.empty(); });
    ++waits_;
    wait_ns_ += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                               std::chrono::steady_clock::now() - start)
                                               .count());
  }
  const std::uint32_t index = free_.back();
  free_.pop_back();
  return Slot{base_ + std::uint64_t{index} * slot_bytes_, index};
}

void StagingPool::release(std::uint32_t index) noexcept {
  {
    MutexLock lock(mutex_);
    free_.push_back(index);
  }
  slot_freed_.notify_one();
}

std::uint64_t StagingPool::waits() const {
  MutexLock lock(mutex_);
  return waits_;
}

std::uint64_t StagingPool::wait_ns() const {
  MutexLock lock(mutex_);
  return wait_ns_;
}

}  // namespace spill::detail
