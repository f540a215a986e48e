// The promise, proved: under a memory limit below what gradient checkpointing in RAM needs, the
// recompute, ram and none modes are OOM-killed and the disk mode trains every step, with the
// same losses as an unlimited run, while the cgroup's peak stays under the limit.
// Needs root and a writable memory cgroup (v1 or v2); elsewhere it says why and skips.
#include <doctest/doctest.h>
#include <signal.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "memory_cgroup.h"
#include "spill/units.h"
#include "test_support.h"

namespace {

// Note [The proof's model]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// 48 blocks of [batch 128, seq 64, hidden 64] float inputs: 2 MiB per input, 96 MiB for all of
// them, against a few MiB of weights and one block's activations (attention runs without the
// seq x seq matrix). Checkpointing in RAM holds all 48 inputs at the end of forward; the disk
// path holds a handful. Two steps, so the second reuses the arena's regions.
const std::vector<std::string> kModel = {
    "--layers",       "48", "--hidden",        "64",  "--heads", "2",
    "--seq",          "64", "--batch",         "128", "--steps", "2",
    "--sample-chars", "0",  "--compare-steps", "0",   "--json"};

// Note [Choosing the limit]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Half-way between what the disk path needs and what checkpointing in RAM needs: the unlimited
// disk run's peak RssAnon plus half of the inputs one step checkpoints (the arena's capacity).
// The RAM modes hold all of those inputs at the end of forward on top of the same working set,
// so they cross the limit; the disk path keeps the other half free for the spill file's page
// cache, which the kernel reclaims under the limit. Derived, not fixed, so it holds on machines
// whose LibTorch keeps a different baseline.
std::uint64_t limit_between(const nlohmann::json& free_disk_run) {
  const auto rss = free_disk_run["memory"]["peak_rss_anon_bytes"].get<std::uint64_t>();
  const auto inputs = free_disk_run["arena"]["capacity_bytes"].get<std::uint64_t>();
  return rss + inputs / 2;
}

struct ModeRun {
  spill_test::ChildRun child;
  std::uint64_t peak_bytes = 0;
  std::uint64_t oom_kills = 0;
  nlohmann::json summary;  // null unless it completed
};

ModeRun train(const std::string& mode, std::uint64_t limit, const std::string& dir) {
  spill_test::MemoryCgroup cg(mode + (limit ? "-limited" : "-free"));
  REQUIRE_MESSAGE(cg.ok(), cg.reason());
  if (limit) REQUIRE(cg.set_limit(limit));
  std::vector<std::string> argv = {SPILLARENA_CLI, "train", "--mode", mode, "--dir", dir};
  argv.insert(argv.end(), kModel.begin(), kModel.end());
  ModeRun r;
  r.child = cg.run(argv, dir);
  r.peak_bytes = cg.peak_bytes();
  r.oom_kills = cg.oom_kills();
  if (r.child.exit_code == 0) r.summary = nlohmann::json::parse(r.child.out);
  const std::string what = mode + (limit ? " limited" : " unlimited");
  MESSAGE(what << ": exit " << r.child.exit_code << " signal " << r.child.signal << ", peak "
               << spill::human_bytes(r.peak_bytes) << ", " << r.child.seconds << " s"
               << (r.summary.is_null() ? "" : ", step " + r.summary["step_ms_mean"].dump() + " ms")
               << (r.child.err.empty() ? "" : ", stderr: " + r.child.err));
  return r;
}

}  // namespace

TEST_CASE("memory limit: under a limit below recompute's need, only the disk mode trains") {
  spill_test::MemoryCgroup probe("probe");
  if (!probe.ok()) {
    MESSAGE("SKIPPED memory limit proof: " << probe.reason());
    return;
  }
  spill_test::ScratchDir dir;
  const ModeRun free = train("disk", 0, dir.path());
  REQUIRE(free.child.exit_code == 0);
  // The saving itself, against the model (Note [The proof's model]), before any limit: without
  // one, checkpointing in RAM holds at least half of a step's inputs more than the disk path.
  // The limit below is derived from the disk run's own peak, so this is what fails when the
  // disk path keeps its inputs in RAM as well.
  const ModeRun free_recompute = train("recompute", 0, dir.path());
  REQUIRE(free_recompute.child.exit_code == 0);
  const auto peak_of = [](const ModeRun& r) {
    return r.summary["memory"]["peak_rss_anon_bytes"].get<std::uint64_t>();
  };
  const auto inputs = free.summary["arena"]["capacity_bytes"].get<std::uint64_t>();
  CHECK(peak_of(free_recompute) >= peak_of(free) + inputs / 2);
  const std::uint64_t limit = limit_between(free.summary);
  MESSAGE("limit " << spill::human_bytes(limit) << ": the unlimited disk run's peak RssAnon "
                   << spill::human_bytes(
                          free.summary["memory"]["peak_rss_anon_bytes"].get<std::uint64_t>())
                   << " + half the inputs of a step, cgroup v" << probe.version());

  const ModeRun disk = train("disk", limit, dir.path());
  CHECK(disk.child.exit_code == 0);
  CHECK(disk.peak_bytes <= limit);
  CHECK(disk.summary["memory"]["peak_rss_anon_bytes"].get<std::uint64_t>() < limit);
  CHECK(disk.oom_kills == 0);
  REQUIRE_FALSE(disk.summary.is_null());
  CHECK(disk.summary["losses"] == free.summary["losses"]);
  CHECK(disk.summary["memory"]["cgroup_limit_bytes"] == limit);

  for (const std::string mode : {"recompute", "ram", "none"}) {
    CAPTURE(mode);
    const ModeRun killed = train(mode, limit, dir.path());
    CHECK(killed.child.signal == SIGKILL);
    CHECK(killed.oom_kills >= 1);
  }
  CHECK(spill_test::list_dir(dir.path()).size() <= 2);  // child.out and child.err only
}
