#include "memory_budget.h"

#include <algorithm>
#include <type_traits>

#include "core/os/memory_limits_fields.h"
#include "spill/arena.h"
#include "spill/tensor_stash.h"
#include "spill/units.h"

namespace spill::cli {
namespace {

nlohmann::json bytes_or_null(std::uint64_t bytes) {
  return bytes ? nlohmann::json(bytes) : nlohmann::json(nullptr);
}

const char* yes_no(bool known, bool yes) { return !known ? "unknown" : yes ? "yes" : "no"; }

}  // namespace

// Note [Staging sized to the layer]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The arena's default staging pool (64 MiB) is a fixed cost in anonymous memory; for a small
// model under a tight limit it alone can exceed what spilling saves. Writes are queued one layer
// input at a time, so two inputs' worth keeps the queue busy without idling compute.
std::uint64_t staging_bytes_for_layer(std::uint64_t bytes_per_layer) {
  const std::uint64_t arena_default = ArenaOptions{}.staging_bytes;
  return std::min(arena_default, std::max<std::uint64_t>(2 * bytes_per_layer, 1ull << 20));
}

// Note [What the disk path holds in RAM]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With the stash's defaults the disk path keeps, per step: the staging pool of direct I/O
// (staging_bytes_for_layer), the last layer's input (keep_last), the inputs read ahead in
// backward (prefetch_depth) and the one being recomputed. The model's weights, optimizer state
// and one layer's activations come on top in every mode; plan does not know the model, so it
// compares only what checkpointing itself holds.
MemoryVerdict judge_memory(std::uint64_t capacity_bytes, std::uint64_t bytes_per_layer) {
  const StashOptions defaults;
  MemoryVerdict v;
  v.limits = memory_limits();
  v.ram_checkpointing_bytes = capacity_bytes;
  const std::uint64_t in_flight = defaults.prefetch_depth + defaults.keep_last + 1;
  v.disk_path_bytes = staging_bytes_for_layer(bytes_per_layer) + in_flight * bytes_per_layer;
  const std::uint64_t usable = v.limits.usable_bytes();
  v.known = usable > 0;
  v.ram_fits = !v.known || v.ram_checkpointing_bytes <= usable;
  v.disk_path_fits = !v.known || v.disk_path_bytes <= usable;
  return v;
}

// Each field of `m` (a byte count of 0, unknown or no limit, as null).
nlohmann::json cgroup_json(const MemoryLimits& m) {
  nlohmann::json j = nlohmann::json::object();
  detail::visit_fields(m, [&j](const char* name, const auto& value) {
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, std::uint64_t>) {
      j[name] = bytes_or_null(value);
    } else {
      j[name] = value;
    }
  });
  return j;
}

std::string cgroup_text(const MemoryLimits& m) {
  if (m.cgroup_version == 0) return "no memory cgroup";
  const std::string v = " (cgroup v" + std::to_string(m.cgroup_version) + ")";
  const std::string peak = m.cgroup_peak_bytes ? ", peak " + human_bytes(m.cgroup_peak_bytes) : "";
  if (m.cgroup_limit_bytes == 0) return "no limit" + peak + v;
  return "limit " + human_bytes(m.cgroup_limit_bytes) + peak + v;
}

nlohmann::json to_json(const MemoryVerdict& v) {
  nlohmann::json j = cgroup_json(v.limits);
  j["usable_bytes"] = bytes_or_null(v.limits.usable_bytes());
  j["ram_checkpointing_bytes"] = v.ram_checkpointing_bytes;
  j["ram_checkpointing_fits"] = v.known ? nlohmann::json(v.ram_fits) : nlohmann::json(nullptr);
  j["disk_path_bytes"] = v.disk_path_bytes;
  j["disk_path_fits"] = v.known ? nlohmann::json(v.disk_path_fits) : nlohmann::json(nullptr);
  return j;
}

void print_text(const MemoryVerdict& v, std::ostream& out) {
  out << "memory       " << cgroup_text(v.limits) << ", usable now "
      << (v.known ? human_bytes(v.limits.usable_bytes()) : "unknown") << "\n"
      << "  in RAM     " << yes_no(v.known, v.ram_fits) << ": checkpointing in RAM holds "
      << human_bytes(v.ram_checkpointing_bytes) << " of layer inputs\n"
      << "  disk path  " << yes_no(v.known, v.disk_path_fits) << ": holds about "
      << human_bytes(v.disk_path_bytes)
      << " (staging pool + inputs in flight); weights and one layer's work come on top\n";
}

}  // namespace spill::cli
