// What `spillarena train` prints: a progress line per step and the summary at the end (text or
// one JSON object), memory included: peak RssAnon, the cgroup's limit and peak, and what the
// cgroup holds beyond anonymous memory (mostly the spill file's page cache).
//
//   Summary s;
//   s.losses.push_back(loss);
//   progress.update(progress_text(request, step, record, mean_s, arena), milestone);
//   print_summary(request, s, arena, std::cout);
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "spill/arena.h"
#include "spill/process_memory.h"
#include "train_command.h"

namespace spill::cli {

struct StepRecord {
  double loss = 0;
  double seconds = 0;
  std::uint64_t io_bytes = 0;
};

struct Summary {
  std::vector<double> losses;        // one per step run
  double step_ms_mean = 0;
  double tokens_per_s = 0;
  std::uint64_t peak_rss_anon = 0;   // sampled after each forward and backward
  std::uint64_t spilled_per_step = 0;
  std::string sample;
  std::int64_t diverged_at_step = 0;  // 0: every loss was finite
  bool returns_freed_memory = true;
  MemoryLimits memory;                // read at the end of the run
  std::uint64_t rss_anon_at_end = 0;
};

std::string progress_text(const TrainRequest& r, std::int64_t step, const StepRecord& s,
                          double mean_s, const SpillArena* arena);

void print_summary(const TrainRequest& r, const Summary& s, const SpillArena* arena,
                   std::ostream& out);

}  // namespace spill::cli
