// What `spillarena train` prints: a progress line per step and the summary at the end (text or
// one JSON object), memory included: peak RssAnon, the cgroup's limit and peak, and what the
// cgroup holds beyond anonymous memory (mostly the spill file's page cache).
//
//   Summary s;
//   s.losses.push_back(loss);
//   progress.update(progress_text(request, step, record, mean_s, arena), milestone);
//   print_summary(request, s, std::cout);  // s.arena, s.stash: the stats when training ended
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "spill/arena.h"
#include "spill/process_memory.h"
#include "spill/tensor_stash.h"
#include "train_command.h"

namespace spill::cli {

struct StepRecord {
  double loss = 0;
  double seconds = 0;
  std::uint64_t io_bytes = 0;
  std::uint64_t overflows = 0;  // inputs that found no room in the arena in this step
  std::uint64_t grows = 0;      // the arena grew in this step (at its first store)
};

struct Summary {
  std::vector<double> losses;  // one per step run
  double step_ms_mean = 0;
  double tokens_per_s = 0;
  std::uint64_t peak_rss_anon = 0;  // sampled after each forward and backward
  std::uint64_t spilled_per_step = 0;
  std::string sample;
  std::int64_t diverged_at_step = 0;  // 0: every loss was finite
  bool returns_freed_memory = true;
  MemoryLimits memory;  // read at the end of the run
  std::uint64_t rss_anon_at_end = 0;
  // The arena's and stash's numbers when training ended (none without an arena).
  std::optional<ArenaStats> arena;
  std::optional<ArenaOptions> arena_options;  // as the arena resolved them
  StashStats stash;
  // What spilling bought: the layer inputs in-RAM checkpointing holds in a step (every block's),
  // and what this run wrote to disk (or the RAM arena) in its last step (after any grow: the
  // steady state); the rest stayed in RAM.
  std::uint64_t layer_inputs_per_step = 0;
  std::uint64_t inputs_per_step = 0;  // block inputs stored per step
  std::uint64_t inputs_spilled_per_step = 0;
  // Paired steps against recompute mode after training (--compare-steps); 0: not measured.
  std::int64_t compared_steps = 0;
  double compared_ms = 0;            // this mode's mean step in the pairs
  double compared_recompute_ms = 0;  // recompute's mean step in the pairs
  std::string comparison_skipped;    // why the pairs did not run (a memory limit), or ""
};

std::string progress_text(const TrainRequest& r, std::int64_t step, const StepRecord& s,
                          double mean_s, const SpillArena* arena);

void print_summary(const TrainRequest& r, const Summary& s, std::ostream& out);

}  // namespace spill::cli
