// The fields of ArenaOptions and ArenaStats by name, in declaration order: the one list the
// reports and keywords are made from (the CLI's JSON, the Python dicts and SpillArena keywords).
// Internal (not installed): the CLI and the Python bindings read it through src/ on their
// include path; tests/field_count.h checks that it names every field once.
//
//   #include "core/arena/arena_fields.h"
//   spill::detail::visit_fields(arena.stats(), [&](const char* name, const auto& value) {
//     if constexpr (!std::is_enum_v<std::decay_t<decltype(value)>>) json[name] = value;
//   });
//   spill::ArenaOptions options;
//   spill::detail::visit_fields(options, [&](const char* name, auto& field) { /* set */ });
#pragma once

#include <type_traits>

#include "spill/arena.h"

namespace spill::detail {

// Calls visit(name, field) for each field of `options` (const or not), in declaration order: the
// one list of the options by name (the Python keywords are made from it).
template <class Options, class Visit>
std::enable_if_t<std::is_same_v<std::remove_const_t<Options>, ArenaOptions>> visit_fields(
    Options& options, Visit&& visit) {
  visit("directory", options.directory);
  visit("capacity_bytes", options.capacity_bytes);
  visit("when_full", options.when_full);
  visit("grow", options.grow);
  visit("growth_margin", options.growth_margin);
  visit("backing", options.backing);
  visit("allow_memory_backed_directory", options.allow_memory_backed_directory);
  visit("start_writeback_after_write", options.start_writeback_after_write);
  visit("page_cache_limit_bytes", options.page_cache_limit_bytes);
  visit("io", options.io);
  visit("io_backend", options.io_backend);
  visit("staging_bytes", options.staging_bytes);
  visit("verify_integrity", options.verify_integrity);
  visit("host_pool_bytes", options.host_pool_bytes);
  visit("when_pool_full", options.when_pool_full);
}

// Calls visit(name, value) for each field of `stats`, in declaration order: the one list the
// reports are made from (the CLI's JSON, the Python dict). Enums come as enums (to_string).
template <class Visit>
void visit_fields(const ArenaStats& stats, Visit&& visit) {
  visit("capacity_bytes", stats.capacity_bytes);
  visit("bytes_in_use", stats.bytes_in_use);
  visit("peak_bytes_in_use", stats.peak_bytes_in_use);
  visit("bytes_requested", stats.bytes_requested);
  visit("live_regions", stats.live_regions);
  visit("allocations", stats.allocations);
  visit("frees", stats.frees);
  visit("reuse_hits", stats.reuse_hits);
  visit("largest_free_block", stats.largest_free_block);
  visit("free_bytes", stats.free_bytes);
  visit("high_water_bytes", stats.high_water_bytes);
  visit("bytes_written", stats.bytes_written);
  visit("bytes_read", stats.bytes_read);
  visit("io_mode", stats.io_mode);
  visit("io_backend", stats.io_backend);
  visit("io_note", stats.io_note);
  visit("staging_bytes", stats.staging_bytes);
  visit("staging_waits", stats.staging_waits);
  visit("staging_wait_ns", stats.staging_wait_ns);
  visit("bytes_hashed", stats.bytes_hashed);
  visit("bytes_verified", stats.bytes_verified);
  visit("integrity_failures", stats.integrity_failures);
  visit("overflows", stats.overflows);
  visit("overflow_bytes", stats.overflow_bytes);
  visit("capacity_needed_bytes", stats.capacity_needed_bytes);
  visit("initial_capacity_bytes", stats.initial_capacity_bytes);
  visit("grows", stats.grows);
  visit("grow_failures", stats.grow_failures);
  visit("grow_note", stats.grow_note);
}

}  // namespace spill::detail
