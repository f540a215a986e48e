// The point of spillarena, measured: anonymous memory held between forward and backward.
#include <doctest/doctest.h>

#include "memory_probe.h"
#include "spill/core.h"
#include "test_support.h"

using spill::harness::probe_stack_memory;

TEST_CASE("memory: the disk arena's held memory does not grow with depth like the RAM stash") {
  spill::return_freed_memory_promptly();
  spill_test::ScratchDir dir;
  const std::int64_t rows = 1024, hidden = 512;  // 2 MiB per layer input
  auto held = [&](const std::string& mode, int layers) {
    auto r = probe_stack_memory(mode, layers, rows, hidden, dir.path());
    MESSAGE(mode << " x" << layers << ": held " << spill::human_bytes(r.held_after_forward_bytes)
                 << ", peak " << spill::human_bytes(r.peak_during_step_bytes));
    return static_cast<double>(r.held_after_forward_bytes);
  };
  const double per_layer = static_cast<double>(rows * hidden * 4);
  probe_stack_memory("none", 2, rows, hidden, dir.path());  // warm up allocator and threads
  const double recompute_growth = held("recompute", 24) - held("recompute", 4);
  const double disk_growth = held("disk", 24) - held("disk", 4);
  const double none_growth = held("none", 24) - held("none", 4);
  CHECK(recompute_growth >= 0.8 * 20 * per_layer);  // one input per extra layer
  CHECK(none_growth >= recompute_growth);           // plus every intermediate
  CHECK(disk_growth <= 0.25 * recompute_growth);    // flat: the inputs are in the file
}
