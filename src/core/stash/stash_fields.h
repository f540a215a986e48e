// The fields of StashOptions and StashStats by name, in declaration order: the one list the
// reports and keywords are made from (the CLI's JSON, the Python dicts and SpillArena keywords)
// and, for StashStats, the stash's counters. Internal (not installed), as
// core/arena/arena_fields.h is for the arena's. See Note [One list of each struct's fields].
//
//   #include "core/stash/stash_fields.h"
//   spill::detail::visit_fields(spill::stash_stats(arena), [&](const char* name, const auto& v) {
//     json[name] = v;
//   });
#pragma once

#include <type_traits>

#include "spill/stash.h"

// Note [One list of each struct's fields]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A field of the options or stats is declared once, with what it means, in its public struct
// (ArenaOptions and ArenaStats in include/spill/arena.h, StashOptions and StashStats in
// include/spill/stash.h), and named once in its internal list: visit_fields in
// src/core/arena/arena_fields.h, SPILL_STASH_STATS_FIELDS and visit_fields in
// src/core/stash/stash_fields.h. Everything else
// is made from the lists: the CLI's JSON, the Python dicts and keywords (python/src/fields.h)
// and, for StashStats, the atomics the paths count in (StashCounters in stash_entry.h) and their
// copy into the stats (stash_stats_of in stash_stats.cc). tests/field_count.h checks that each
// list names every field of its struct once, in declaration order (arena_test, checkpoint_test).
// What is not copied is computed where the stats are made, each field from its source: ArenaStats
// in ArenaCore::stats (src/core/arena/arena_core.cc), StashStats' READ fields in stash_stats_of,
// each from the part of ArenaShared (arena_shared.h) that owns it. A new StashStats field: declare
// it in the struct, list it below in the same place, and either count it (COUNTED) or set it in
// stash_stats_of (READ).

// StashStats' fields in declaration order, each once. COUNTED(name): a count the stash's paths
// keep in an atomic of the same name in StashCounters, copied into the stats (pool_waits and
// pool_wait_ns then add the host pool's own waits). READ(name): read from the host pool, the
// restore pool or the cuFile resources when the stats are made.
#define SPILL_STASH_STATS_FIELDS(COUNTED, READ) \
  COUNTED(inputs_stored)                        \
  COUNTED(inputs_spilled)                       \
  COUNTED(saved_tensors_stored)                 \
  COUNTED(saved_tensors_spilled)                \
  COUNTED(device_bytes_held)                    \
  COUNTED(peak_device_bytes_held)               \
  READ(host_pool_bytes)                         \
  READ(host_pool_grows)                         \
  READ(host_pool_pinned)                        \
  READ(peak_host_pool_bytes_in_use)             \
  COUNTED(host_bytes_in_flight)                 \
  COUNTED(peak_host_bytes_in_flight)            \
  COUNTED(pool_waits)                           \
  COUNTED(pool_wait_ns)                         \
  COUNTED(copy_waits)                           \
  COUNTED(copy_wait_ns)                         \
  COUNTED(inputs_back_before_copied)            \
  COUNTED(inputs_kept_on_device)                \
  COUNTED(bytes_kept_on_device)                 \
  COUNTED(pieces)                               \
  COUNTED(restores)                             \
  COUNTED(restore_waits)                        \
  COUNTED(restore_wait_ns)                      \
  COUNTED(prefetches)                           \
  COUNTED(prefetch_hits)                        \
  READ(restores_into_reused_memory)             \
  READ(gds_buffer_bytes)                        \
  READ(gds_buffer_registered)                   \
  READ(cufile_mode)                             \
  READ(cufile_bounce_bytes)                     \
  COUNTED(cufile_bytes_written)                 \
  COUNTED(cufile_bytes_read)

namespace spill::detail {

// Calls visit(name, field) for each field of `options` (const or not), in declaration order.
template <class Options, class Visit>
std::enable_if_t<std::is_same_v<std::remove_const_t<Options>, StashOptions>> visit_fields(
    Options& options, Visit&& visit) {
  visit("asynchronous", options.asynchronous);
  visit("prefetch_depth", options.prefetch_depth);
  visit("keep_last", options.keep_last);
  visit("gds_buffer_bytes", options.gds_buffer_bytes);
}

// Calls visit(name, value) for each field of `stats`, in SPILL_STASH_STATS_FIELDS' order.
template <class Visit>
void visit_fields(const StashStats& s, Visit&& visit) {
#define SPILL_VISIT_STASH_STATS_FIELD(name) visit(#name, s.name);
  SPILL_STASH_STATS_FIELDS(SPILL_VISIT_STASH_STATS_FIELD, SPILL_VISIT_STASH_STATS_FIELD)
#undef SPILL_VISIT_STASH_STATS_FIELD
}

}  // namespace spill::detail
