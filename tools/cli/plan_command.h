// `spillarena plan`: how big an arena a model needs, whether the directory can hold it, and
// whether the disk is fast enough.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

namespace spill::cli {

struct PlanRequest {
  std::uint64_t layers = 0;
  std::uint64_t batch = 0;
  std::uint64_t seq = 0;
  std::uint64_t hidden = 0;
  std::string dtype = "bf16";
  std::string directory;                     // "" -> the default spill directory
  double layer_ms = 0;                       // 0: not given
  std::uint64_t probe_bytes = 256ull << 20;  // 0: skip the bandwidth probe
  bool json = false;
};

// Bytes per element of a dtype name (fp32, fp16, bf16, fp64 and spellings); 0 when unknown.
std::uint64_t element_size_of(const std::string& dtype);

// Checks what the option bounds cannot: the arena's size must be countable (no overflow).
// Returns "" or the problem (a usage error).
std::string check_plan_request(const PlanRequest& request);

// Prints the plan (text or JSON) to `out`. Returns 0, or 1 when the directory cannot hold the
// arena (missing, unwritable, memory-backed, too small, cannot preallocate) or the disk path
// does not fit in memory; the reasons are in the report and the first one is also one line on
// stderr. In-RAM checkpointing that does not fit is reported, not failed on. --layer-ms without
// a bandwidth probe is a warning line on stderr.
int run_plan(const PlanRequest& request, std::ostream& out);

}  // namespace spill::cli
