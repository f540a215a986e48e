// The parts of ArenaShared: the stash options and the shared chain, the host pool's owner and
// the cuFile resources, each under its own mutex. The paths that use them are device_path.cc
// (the host pool) and gds_path.cc (the staging buffer); the stats are made in stash_stats.cc.
#include "arena_shared.h"

#include <string>
#include <utility>
#include <vector>

#include "chain.h"
#include "core/arena/arena_internals.h"

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

std::shared_ptr<Chain> StashSettings::shared_chain(const SpillArena& arena) {
  MutexLock lock(mutex_);
  std::shared_ptr<Chain> chain = shared_chain_.lock();
  if (!chain) {
    chain = std::make_shared<Chain>(arena, options_);
    shared_chain_ = chain;
  }
  return chain;
}

// ---------------------------------------------------------------------------------------------
// The host pool
// ---------------------------------------------------------------------------------------------

// Made outside the mutex: the engine's allocator may need what a thread holding that mutex
// holds (Python's GIL: Note [Letting go of the stash without the GIL] in
// python/src/stash_binding.cc). Two first inputs at once may both make one; one is kept.
HostPool& HostPoolOwner::get_or_make(const std::function<std::uint64_t()>& budget_bytes,
                                     CopyEngine* engine) {
  {
    MutexLock lock(mutex_);
    if (pool_) return *pool_;
  }
  std::shared_ptr<HostPool> made = HostPool::make(budget_bytes(), engine);
  MutexLock lock(mutex_);
  if (!pool_) {
    pool_ = std::move(made);
    std::string notice = pool_->pinned() ? std::string() : pageable_notice();
    if (!notice.empty()) notices_.push_back(std::move(notice));
  }
  return *pool_;
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
