// Memory probe: how much anonymous memory a forward pass through an N-layer stack keeps alive
// until backward, per mode. This is what a memory cgroup counts and what spilling to disk is for.
//
//   spill::return_freed_memory_promptly();
//   auto r = spill::harness::probe_stack_memory("disk", 16, 1024, 1024, "/mnt/nvme");
//   std::cout << r.held_after_forward_bytes;      // flat in N for disk, linear for recompute
#pragma once

#include <cstdint>
#include <string>

namespace spill::harness {

struct MemoryProbe {
  std::string mode;
  int layers = 0;
  std::uint64_t input_bytes_per_layer = 0;
  std::uint64_t held_after_forward_bytes = 0;  // RssAnon after forward - RssAnon before
  std::uint64_t peak_during_step_bytes = 0;    // max RssAnon over the step - RssAnon before
  std::uint64_t spilled_bytes = 0;             // written to the arena (ram/disk)
};

// A stack of `layers` blocks y = x + tanh(x W) (W: hidden x hidden) on a [rows, hidden] float
// input; forward, measure, backward, measure.
MemoryProbe probe_stack_memory(const std::string& mode, int layers, std::int64_t rows,
                               std::int64_t hidden, const std::string& directory);

}  // namespace spill::harness
