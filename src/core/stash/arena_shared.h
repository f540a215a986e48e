// ArenaShared: what every stash of one arena shares, kept with the arena (attachment in
// src/core/arena/arena_internals.h) and reused by every step's stash. It only holds its parts,
// each with a mutex of its own: the stash options and the shared chain (StashSettings), the host
// pool (HostPoolOwner), the cuFile resources of io = gds (GdsResources), the counters and the
// restore pool. The stats are made from the parts by stash_stats_of (stash_stats.cc).
//
//   std::shared_ptr<spill::detail::ArenaShared> shared = spill::detail::shared_state_of(arena);
//   shared->settings.set_options(options);                       // spill::set_stash_options
//   std::shared_ptr<void> chain = shared->settings.get_or_make_shared(make);  // shared_chain
//   std::shared_ptr<spill::detail::HostPool> pool = shared->host_pool.get_or_make(
//       [&] { return context.host_budget(bytes); }, engine.get(), true);  // the first input
//   for (std::string& notice : shared->host_pool.take_notices()) warn(notice);
//   spill::StashStats stats = spill::detail::stash_stats_of(*shared);
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/io/gds.h"
#include "core/os/mutex.h"
#include "host_pool.h"
#include "restore_pool.h"
#include "spill/arena.h"
#include "spill/stash.h"
#include "stash_entry.h"

namespace spill::detail {

// The options set_stash_options keeps for the arena, and the one object every front end of the
// arena shares while a graph holds it: the shared chain (shared_chain in chain.cc, which makes
// it; type-erased here, as these settings sit below the chain). One mutex: the object is made
// with the options of that moment.
class StashSettings {
 public:
  void set_options(const StashOptions& options) EXCLUDES(mutex_);
  StashOptions options() const EXCLUDES(mutex_);
  // The shared object while something holds it, or a new one, `make(options)`, kept (weakly) in
  // its place; all under the mutex.
  using MakeShared = std::function<std::shared_ptr<void>(const StashOptions& options)>;
  std::shared_ptr<void> get_or_make_shared(const MakeShared& make) EXCLUDES(mutex_);

 private:
  mutable Mutex mutex_;
  StashOptions options_ GUARDED_BY(mutex_);
  std::weak_ptr<void> shared_ GUARDED_BY(mutex_);
};

// The arena's host pool: made at the first accelerator input, then reused by every step's stash
// (the shared stash of spill::checkpoint(arena, ...) lives only as long as a graph), and the
// warning for a pool that could not be pinned, given with the arena's.
class HostPoolOwner {
 public:
  // The pool, made at the first call (outside the mutex: the engine's allocator may take the
  // GIL) with `budget_bytes()`, asked only then, through `engine` (HostPool::make). `growable`
  // (an automatic budget): an idle pool whose store()s waited for room is made anew, larger
  // (Note [A pool sized from what the disk does] in host_pool.cc); leases keep the old one
  // alive, so hold the pool returned, not a reference to it.
  std::shared_ptr<HostPool> get_or_make(const std::function<std::uint64_t()>& budget_bytes,
                                        CopyEngine* engine, bool growable) EXCLUDES(mutex_);
  // The pool, or nullptr before the first accelerator input.
  std::shared_ptr<const HostPool> get() const EXCLUDES(mutex_);
  // What the pools replaced by larger ones counted, for the stats: they span the arena's life.
  struct Retired {
    std::uint64_t grows = 0;
    std::uint64_t waits = 0;
    std::uint64_t wait_ns = 0;
    std::uint64_t peak_bytes_in_use = 0;
  };
  Retired retired() const EXCLUDES(mutex_);
  // The warnings not yet given (a pageable pool), once each.
  std::vector<std::string> take_notices() EXCLUDES(mutex_);

 private:
  // A larger pool for `pool`, or nullptr when it should stay (not idle, never waited, or at the
  // ceiling already).
  static std::shared_ptr<HostPool> grown(HostPool& pool, CopyEngine* engine);
  void keep(std::shared_ptr<HostPool> made) REQUIRES(mutex_);
  void retire(const HostPool& pool) REQUIRES(mutex_);

  mutable Mutex mutex_;
  std::shared_ptr<HostPool> pool_ GUARDED_BY(mutex_);
  Retired retired_ GUARDED_BY(mutex_);
  std::vector<std::string> notices_ GUARDED_BY(mutex_);
};

// io = gds: the device buffer every cuFile transfer of an arena's stashes goes through, one at a
// time, registered with cuFile once. See Note [One registered staging buffer] in gds_path.cc,
// which makes it.
class GdsStaging {
 public:
  // `bytes` (a multiple of 4 KiB) on `device`, through `engine`'s allocator; throws the front
  // end's out-of-memory error. A registration cuFile refuses leaves it unregistered.
  GdsStaging(CopyEngine& engine, const Device& device, std::uint64_t bytes,
             std::shared_ptr<GdsDriver> driver);
  GdsStaging(const GdsStaging&) = delete;
  GdsStaging& operator=(const GdsStaging&) = delete;

  Mutex mutex;  // held for a whole transfer: copies and cuFile calls
  std::uint64_t bytes() const { return memory_.bytes(); }
  bool registered() const { return registration_ != nullptr; }
  // The first `bytes` of the buffer and its address, 4 KiB aligned.
  Buffer first(std::uint64_t bytes) const { return memory_.slice(0, bytes); }
  void* data() const { return memory_.data(); }

 private:
  const Buffer memory_;  // 4 KiB aligned, in an allocation one page larger
  std::unique_ptr<GdsRegistration> registration_;  // last: deregistered before the memory goes
};

// io = gds, from the first device input spilled on: the staging buffer, and the cuFile session
// (its mode and bounce buffers, capped to the host budget then, for the stats).
class GdsResources {
 public:
  // The staging buffer, made at the first call: `bytes` (a multiple of 4 KiB) on `device`
  // through `engine`, in the process's cuFile session, whose bounce buffers are then capped to
  // `host_budget_bytes()`. Made outside the mutex, as the host pool is.
  GdsStaging& get_or_make(CopyEngine& engine, const Device& device, std::uint64_t bytes,
                          const std::function<std::uint64_t()>& host_budget_bytes) EXCLUDES(mutex_);
  // Each nullptr before the first io = gds spill.
  std::shared_ptr<const GdsStaging> staging() const EXCLUDES(mutex_);
  std::shared_ptr<const GdsDriver> driver() const EXCLUDES(mutex_);

 private:
  mutable Mutex mutex_;
  std::shared_ptr<GdsStaging> staging_ GUARDED_BY(mutex_);
  std::shared_ptr<GdsDriver> driver_ GUARDED_BY(mutex_);
};

// What every stash of one arena shares; the parts guard themselves.
struct ArenaShared {
  HostPoolOwner host_pool;
  StashSettings settings;  // set_stash_options, shared_chain
  GdsResources gds;
  const std::shared_ptr<StashCounters> counters = std::make_shared<StashCounters>();
  // CPU restores' host memory, reused within a backward (Note [Restoring into reused memory]).
  const std::shared_ptr<RestorePool> restore_pool = std::make_shared<RestorePool>();
};

// The arena's ArenaShared, made at the first call.
std::shared_ptr<ArenaShared> shared_state_of(const SpillArena& arena);

// spill::stash_stats: the counters copied, the READ fields read from the part that owns each
// (stash_stats.cc).
StashStats stash_stats_of(const ArenaShared& shared);

}  // namespace spill::detail
