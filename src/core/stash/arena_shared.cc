// The parts of ArenaShared: the stash options and the shared chain, the host pool's owner and
// the cuFile resources, each under its own mutex. The paths that use them are device_path.cc
// (the host pool) and gds_path.cc (the staging buffer); the stats are made in stash_stats.cc.
#include "arena_shared.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/arena/arena_internals.h"
#include "spill/error.h"

namespace spill::detail {

std::shared_ptr<ArenaShared> shared_state_of(const SpillArena& arena) {
  return std::static_pointer_cast<ArenaShared>(
      attachment(arena, [] { return std::make_shared<ArenaShared>(); }));
}

// ---------------------------------------------------------------------------------------------
// The stash options and the shared chain
// ---------------------------------------------------------------------------------------------

void StashSettings::set_options(const StashOptions& options) {
  MutexLock lock(mutex_);
  options_ = options;
}

StashOptions StashSettings::options() const {
  MutexLock lock(mutex_);
  return options_;
}

std::shared_ptr<void> StashSettings::get_or_make_shared(const MakeShared& make) {
  MutexLock lock(mutex_);
  std::shared_ptr<void> object = shared_.lock();
  if (!object) {
    object = make(options_);
    shared_ = object;
  }
  return object;
}

// ---------------------------------------------------------------------------------------------
// The host pool
// ---------------------------------------------------------------------------------------------

// Made outside the mutex: the engine's allocator may need what a thread holding that mutex
// holds (Python's GIL: Note [Letting go of the stash without the GIL] in
// python/src/stash_binding.cc). Two first inputs at once may both make one; one is kept.
std::shared_ptr<HostPool> HostPoolOwner::get_or_make(
    const std::function<std::uint64_t()>& budget_bytes, CopyEngine* engine, bool growable) {
  std::shared_ptr<HostPool> current;
  {
    MutexLock lock(mutex_);
    current = pool_;
  }
  if (current && !growable) return current;
  std::shared_ptr<HostPool> made =
      current ? grown(*current, engine) : HostPool::make(budget_bytes(), engine);
  if (!made) return current;
  MutexLock lock(mutex_);
  if (pool_ == current) {  // else another stash made one meanwhile: that one stays
    if (current) retire(*current);
    keep(std::move(made));
  }
  return pool_;
}

void HostPoolOwner::retire(const HostPool& pool) {
  ++retired_.grows;
  retired_.waits += pool.waits();
  retired_.wait_ns += pool.wait_ns();
  retired_.peak_bytes_in_use = std::max(retired_.peak_bytes_in_use, pool.peak_bytes_in_use());
}

// Note [A pool sized from what the disk does] in host_pool.cc: only an idle pool is replaced, so
// no input's bytes are in two pools at once, and its successor is made once per grow.
// A pool at the ceiling, or whose successor cannot be had as it is (pinned), stays: it forgets
// what it drained, so the next attempt waits for new waits.
std::shared_ptr<HostPool> HostPoolOwner::grown(HostPool& pool, CopyEngine* engine) {
  const std::uint64_t drained = pool.drained_while_waiting();
  if (drained == 0 || pool.bytes_in_use() != 0) return nullptr;
  const std::uint64_t bytes = grown_host_pool_bytes(pool.bytes(), drained, pool.pinned());
  std::shared_ptr<HostPool> made;
  try {
    if (bytes > pool.bytes()) made = HostPool::make(bytes, engine);
  } catch (const Error&) {  // the memory is not there now: a grow is never a failure
  }
  if (made && made->pinned() == pool.pinned()) return made;
  pool.forget_drained();
  return nullptr;
}

void HostPoolOwner::keep(std::shared_ptr<HostPool> made) {
  pool_ = std::move(made);
  std::string notice = pool_->pinned() ? std::string() : pageable_notice();
  if (!notice.empty()) notices_.push_back(std::move(notice));
}

HostPoolOwner::Retired HostPoolOwner::retired() const {
  MutexLock lock(mutex_);
  return retired_;
}

std::shared_ptr<const HostPool> HostPoolOwner::get() const {
  MutexLock lock(mutex_);
  return pool_;
}

std::vector<std::string> HostPoolOwner::take_notices() {
  MutexLock lock(mutex_);
  return std::exchange(notices_, {});
}

// ---------------------------------------------------------------------------------------------
// The cuFile resources
// ---------------------------------------------------------------------------------------------

// Made outside the mutex, as the host pool is; the bounce buffers are capped under it, by the
// call that keeps its buffer.
GdsStaging& GdsResources::get_or_make(CopyEngine& engine, const Device& device, std::uint64_t bytes,
                                      const std::function<std::uint64_t()>& host_budget_bytes) {
  {
    MutexLock lock(mutex_);
    if (staging_) return *staging_;
  }
  std::shared_ptr<GdsDriver> driver = GdsDriver::shared();  // the arena's session
  auto made = std::make_shared<GdsStaging>(engine, device, bytes, driver);
  MutexLock lock(mutex_);
  if (!staging_) {
    staging_ = std::move(made);
    driver->limit_bounce_bytes(host_budget_bytes());
    driver_ = std::move(driver);
  }
  return *staging_;
}

std::shared_ptr<const GdsStaging> GdsResources::staging() const {
  MutexLock lock(mutex_);
  return staging_;
}

std::shared_ptr<const GdsDriver> GdsResources::driver() const {
  MutexLock lock(mutex_);
  return driver_;
}

}  // namespace spill::detail
