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

TEST_CASE("memory: pressure is the tighter of the cgroup's anonymous memory and the system's use") {
  spill::MemoryLimits m;
  CHECK(m.pressure() == 0.0);  // nothing known
  m.mem_total_bytes = 1000;
  m.mem_available_bytes = 750;
  CHECK(m.pressure() == doctest::Approx(0.25));
  m.cgroup_limit_bytes = 400;
  m.cgroup_anon_bytes = 300;
  m.cgroup_usage_bytes = 400;  // page cache up to the limit does not count: it is reclaimed
  CHECK(m.pressure() == doctest::Approx(0.75));
  m.cgroup_anon_bytes = 900;  // above the limit (v1 counts a moment before the kill): capped
  CHECK(m.pressure() == 1.0);
  m.cgroup_limit_bytes = 0;  // no limit: the system's share
  CHECK(m.pressure() == doctest::Approx(0.25));
  m.mem_available_bytes = 0;  // MemAvailable unreadable: unknown, not "all used"
  CHECK(m.pressure() == 0.0);
}

TEST_CASE("memory: this process's limits are read (Linux)") {
  const spill::MemoryLimits m = spill::memory_limits();
#ifdef __linux__
  CHECK(m.mem_total_bytes > 0);
  CHECK(m.mem_available_bytes > 0);
  CHECK(m.mem_available_bytes <= m.mem_total_bytes);
  if (m.cgroup_version != 0) CHECK(m.cgroup_anon_bytes > 0);  // this test's own heap at least
#endif
  CHECK(m.pressure() >= 0.0);
  CHECK(m.pressure() <= 1.0);
}
