#include "core/io/staging_pool.h"

#include <cstring>
#include <string>

#include "core/os/counted_wait.h"
#include "core/os/platform.h"
#include "spill/error.h"
#include "spill/units.h"

namespace spill::detail {

namespace {

// Memory for a pool, resident now (not at the first spill), or nullptr with the errno in *error.
char* reserve(std::uint64_t bytes, int* error) {
  void* base = nullptr;
  *error = platform::map_anonymous(bytes, &base);
  if (*error != 0) return nullptr;
  std::memset(base, 0, bytes);
  return static_cast<char*>(base);
}

}  // namespace

StagingPool::StagingPool(std::uint64_t budget_bytes, std::uint64_t slot_bytes)
    : budget_bytes_(budget_bytes), slot_bytes_(slot_bytes) {
  int e = 0;
  MutexLock lock(mutex_);
  base_ = reserve(budget_bytes, &e);
  if (base_ == nullptr) {
    throw InsufficientSpaceError("<staging>", budget_bytes, platform::mem_available_bytes(),
                                 "spill: cannot reserve the staging pool of " +
                                     bytes_with_units(budget_bytes) + ": " + std::strerror(e) +
                                     "; lower ArenaOptions::staging_bytes");
  }
  hand_out_slots();
}

StagingPool::~StagingPool() {
  MutexLock lock(mutex_);
  platform::unmap(base_, budget_bytes());
}

void StagingPool::hand_out_slots() {
  const auto slots = static_cast<std::uint32_t>(budget_bytes() / slot_bytes());
  free_.clear();
  for (std::uint32_t i = slots; i > 0; --i) free_.push_back(i - 1);
}

bool StagingPool::resize(std::uint64_t budget_bytes, std::uint64_t slot_bytes) {
  MutexLock lock(mutex_);
  if (free_.size() != budget_bytes_ / slot_bytes_) return false;  // a slot is in use
  int e = 0;
  char* base = reserve(budget_bytes, &e);
  if (base == nullptr) return false;
  platform::unmap(base_, budget_bytes_);
  base_ = base;
  budget_bytes_ = budget_bytes;
  slot_bytes_ = slot_bytes;
  hand_out_slots();
  return true;
}

StagingPool::Slot StagingPool::acquire() {
  MutexLock lock(mutex_);
  if (free_.empty()) {
    const CountedWait counted(waits_, wait_ns_);
    slot_freed_.wait(lock, [this]() REQUIRES(mutex_) { return !free_.empty(); });
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

std::uint64_t StagingPool::waits() const { return waits_.load(); }

std::uint64_t StagingPool::wait_ns() const { return wait_ns_.load(); }

}  // namespace spill::detail
