// `spillarena train`: trains a small GPT-style character model on the CPU with every block
// checkpointed through the chosen mode, showing progress and a summary.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

namespace spill::cli {

struct TrainRequest {
  std::string mode = "disk";      // none | recompute | ram | disk | per-file
  std::int64_t layers = 4;
  std::int64_t hidden = 128;
  std::int64_t heads = 4;
  std::int64_t seq = 128;
  std::int64_t batch = 16;
  std::int64_t steps = 200;
  double lr = 3e-3;
  std::uint64_t seed = 1;
  std::string directory;          // "" -> the default spill directory
  std::uint64_t capacity = 0;     // 0 -> computed from the model
  double dropout = 0.1;
  bool json = false;
  std::string corpus;             // "" -> the embedded text
  std::int64_t sample_chars = 200;
};

// Checks what the argument parser cannot (heads divide hidden, ...). Returns "" or the problem.
std::string check_train_request(const TrainRequest& request);

// Trains and prints progress and a summary (text or JSON) to `out`. Throws spill::Error (or
// c10::Error) on a runtime failure: bad directory, capacity too small, unreadable corpus.
void run_train(const TrainRequest& request, std::ostream& out);

}  // namespace spill::cli
