// Memory as `spillarena` reports it: the cgroup's limit and peak (v1 or v2, through
// spill::memory_limits), RssAnon, and whether a model's checkpointed inputs fit in RAM or only
// on the disk path.
//
//   MemoryVerdict v = judge_memory(capacity_bytes, bytes_per_layer);
//   print_text(v, std::cout);  // "memory  limit 512.00 MiB (cgroup v1) ... in RAM: no ..."
//   nlohmann::json j = to_json(v);
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <ostream>
#include <string>

#include "spill/process_memory.h"

namespace spill::cli {

// The staging pool the CLI gives direct I/O: two layer inputs (one being written while the next
// arrives), at most the arena's default. See Note [Staging sized to the layer] in
// tools/cli/memory_budget.cc.
std::uint64_t staging_bytes_for_layer(std::uint64_t bytes_per_layer);

struct MemoryVerdict {
  MemoryLimits limits;
  std::uint64_t ram_checkpointing_bytes = 0;  // every layer input held in RAM
  std::uint64_t disk_path_bytes = 0;          // staging pool + the inputs in flight
  bool known = false;                         // a limit or MemAvailable could be read
  bool ram_fits = true;
  bool disk_path_fits = true;
};

// `capacity_bytes`: all spilled inputs of a step; `bytes_per_layer`: one of them.
MemoryVerdict judge_memory(std::uint64_t capacity_bytes, std::uint64_t bytes_per_layer);
nlohmann::json to_json(const MemoryVerdict& verdict);
void print_text(const MemoryVerdict& verdict, std::ostream& out);

// The cgroup part of memory_limits() as JSON: version, limit and peak (null when unknown).
nlohmann::json cgroup_json(const MemoryLimits& limits);
// "limit 512.00 MiB, peak 301.20 MiB (cgroup v1)" or "no cgroup limit".
std::string cgroup_text(const MemoryLimits& limits);

}  // namespace spill::cli
