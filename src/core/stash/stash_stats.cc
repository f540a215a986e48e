// spill::stash_stats: an arena's StashStats, made from the parts of its ArenaShared
// (arena_shared.h). See Note [One list of each struct's fields] in stash_fields.h.
#include <algorithm>
#include <memory>

#include "arena_shared.h"

namespace spill {
namespace detail {

// The COUNTED fields, then the READ ones, each from the part that owns it: the restore pool,
// the host pool, the cuFile resources (Note [One list of each struct's fields]).
StashStats stash_stats_of(const ArenaShared& shared) {
  StashStats s;
  shared.counters->copy_to(s);
  s.restores_into_reused_memory = shared.restore_pool->reused();
  const HostPoolOwner::Retired retired = shared.host_pool.retired();  // grown out of
  s.host_pool_grows = retired.grows;
  s.pool_waits += retired.waits;
  s.pool_wait_ns += retired.wait_ns;
  s.peak_host_pool_bytes_in_use = retired.peak_bytes_in_use;
  if (const std::shared_ptr<const HostPool> pool = shared.host_pool.get()) {
    s.host_pool_bytes = pool->bytes();
    s.host_pool_pinned = pool->pinned();
    s.peak_host_pool_bytes_in_use =
        std::max(s.peak_host_pool_bytes_in_use, pool->peak_bytes_in_use());
    s.pool_waits += pool->waits();
    s.pool_wait_ns += pool->wait_ns();
  }
  if (const std::shared_ptr<const GdsStaging> staging = shared.gds.staging()) {
    s.gds_buffer_bytes = staging->bytes();
    s.gds_buffer_registered = staging->registered();
  }
  // Live: a later arena of the process may have lowered the limit since.
  if (const std::shared_ptr<const GdsDriver> cufile = shared.gds.driver()) {
    s.cufile_mode = cufile->mode();
    s.cufile_bounce_bytes = cufile->bounce_bytes();
  }
  return s;
}

}  // namespace detail

StashStats stash_stats(const SpillArena& arena) {
  return detail::stash_stats_of(*detail::shared_state_of(arena));
}

}  // namespace spill
