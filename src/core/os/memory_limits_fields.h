// The fields of MemoryLimits by name, in declaration order: the one list its reports are made
// from (the CLI's JSON, Python's spillarena.memory_limits() dict). Internal (not installed), as
// core/arena/arena_fields.h is for the arena's structs; tests/field_count.h checks that it names
// every field once (Note [One list of each struct's fields] in core/stash/stash_fields.h).
//
//   #include "core/os/memory_limits_fields.h"
//   spill::detail::visit_fields(spill::memory_limits(), [&](const char* name, const auto& v) {
//     json[name] = v;
//   });
#pragma once

#include "spill/process_memory.h"

namespace spill::detail {

// Calls visit(name, value) for each field of `limits`, in declaration order. The two computed
// figures, usable_bytes() and pressure(), are not fields: reports add them by name.
template <class Visit>
void visit_fields(const MemoryLimits& limits, Visit&& visit) {
  visit("cgroup_version", limits.cgroup_version);
  visit("cgroup_limit_bytes", limits.cgroup_limit_bytes);
  visit("cgroup_usage_bytes", limits.cgroup_usage_bytes);
  visit("cgroup_peak_bytes", limits.cgroup_peak_bytes);
  visit("cgroup_anon_bytes", limits.cgroup_anon_bytes);
  visit("mem_available_bytes", limits.mem_available_bytes);
  visit("mem_total_bytes", limits.mem_total_bytes);
}

}  // namespace spill::detail
