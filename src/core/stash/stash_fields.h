// The fields of StashOptions and StashStats by name, in declaration order: the one list the
// reports and keywords are made from (the CLI's JSON, the Python dicts and SpillArena keywords).
// Internal (not installed), as core/arena/arena_fields.h is for the arena's.
//
//   #include "core/stash/stash_fields.h"
//   spill::detail::visit_fields(spill::stash_stats(arena), [&](const char* name, const auto& v) {
//     json[name] = v;
//   });
#pragma once

#include <type_traits>

#include "spill/stash.h"

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

// Calls visit(name, value) for each field of `stats`: the one list reports are made from.
template <class Visit>
void visit_fields(const StashStats& s, Visit&& visit) {
  visit("inputs_stored", s.inputs_stored);
  visit("inputs_spilled", s.inputs_spilled);
  visit("device_bytes_held", s.device_bytes_held);
  visit("peak_device_bytes_held", s.peak_device_bytes_held);
  visit("host_pool_bytes", s.host_pool_bytes);
  visit("host_pool_pinned", s.host_pool_pinned);
  visit("peak_host_pool_bytes_in_use", s.peak_host_pool_bytes_in_use);
  visit("host_bytes_in_flight", s.host_bytes_in_flight);
  visit("peak_host_bytes_in_flight", s.peak_host_bytes_in_flight);
  visit("pool_waits", s.pool_waits);
  visit("pool_wait_ns", s.pool_wait_ns);
  visit("inputs_kept_on_device", s.inputs_kept_on_device);
  visit("bytes_kept_on_device", s.bytes_kept_on_device);
  visit("pieces", s.pieces);
  visit("restores", s.restores);
  visit("restore_waits", s.restore_waits);
  visit("restore_wait_ns", s.restore_wait_ns);
  visit("prefetches", s.prefetches);
  visit("prefetch_hits", s.prefetch_hits);
  visit("restores_into_reused_memory", s.restores_into_reused_memory);
  visit("gds_buffer_bytes", s.gds_buffer_bytes);
  visit("gds_buffer_registered", s.gds_buffer_registered);
  visit("cufile_mode", s.cufile_mode);
  visit("cufile_bounce_bytes", s.cufile_bounce_bytes);
  visit("cufile_bytes_written", s.cufile_bytes_written);
  visit("cufile_bytes_read", s.cufile_bytes_read);
}

}  // namespace spill::detail
