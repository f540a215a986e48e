// `spillarena train`: trains a small GPT-style character model on the CPU with every block
// checkpointed through the chosen mode, showing progress and a summary.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>

#include "spill/arena.h"
#include "spill/error.h"

namespace spill::cli {

// The loss stopped being finite (a learning rate far too high): training stops at that step.
class TrainingDivergedError : public spill::Error {
 public:
  TrainingDivergedError(std::int64_t step, double loss, const std::string& message)
      : Error(message), step_(step), loss_(loss) {}
  std::int64_t step() const { return step_; }
  double loss() const { return loss_; }

 private:
  std::int64_t step_;
  double loss_;
};

// Note [The learning rate AdamW can hold]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// AdamW scales its first step by lr / (1 - beta1) in float32 (the parameters' type): a rate above
// FLT_MAX * (1 - beta1) overflows inside the optimizer ("value cannot be converted to type float
// without overflow", issue 19) instead of diverging visibly. Below FLT_MIN it would be 0, a run
// that silently learns nothing. --lr is bounded by both, so every rate that passes either trains
// or stops with TrainingDivergedError. The bounds are round numbers just inside those limits, so
// the range a message prints is the range accepted (a rounded FLT_MIN was refused).
constexpr double kAdamBeta1 = 0.9;
constexpr double kAdamBeta2 = 0.999;
constexpr double kMinLearningRate = 1.2e-38;  // > FLT_MIN (1.17549435e-38)
constexpr double kMaxLearningRate = 3.4e37;   // < FLT_MAX * (1 - beta1) (3.40282347e37)

// Largest --corpus read (64 MiB): the whole text is held in memory as training data.
constexpr std::uint64_t kMaxCorpusBytes = 64ull << 20;

// The defaults are the model a newcomer's first run trains (`scripts/run.sh`): 12 blocks of
// [batch 32, seq 256, hidden 96] float inputs, 3 MiB each, 36 MiB per step, 33 MiB of it spilled
// (the last block's input is kept) — enough that the summary's memory figures mean something —
// while 16 steps and 3 paired comparison steps take about a minute on 2 cores (2.6 s a step).
struct TrainRequest {
  std::string mode = "disk";  // none | recompute | ram | disk | per-file
  std::int64_t layers = 12;
  std::int64_t hidden = 96;
  std::int64_t heads = 4;
  std::int64_t seq = 256;
  std::int64_t batch = 32;
  std::int64_t steps = 16;
  double lr = 3e-3;
  std::uint64_t seed = 1;
  std::string directory;       // "" -> the default spill directory
  std::uint64_t capacity = 0;  // 0 -> computed from the model
  std::string io = "auto";     // auto | buffered | direct (disk mode)
  // The arena's sizing (disk and ram modes): ArenaOptions::when_full, grow, growth_margin.
  std::string when_full = "keep_in_memory";  // keep_in_memory (keep-in-memory) | error
  bool grow = ArenaOptions{}.grow;
  double growth_margin = ArenaOptions{}.growth_margin;
  double dropout = 0.1;
  double attention_dropout = 0.0;
  bool json = false;
  bool keep_freed_memory = false;   // true: leave glibc's malloc thresholds as they are
  std::string corpus;               // "" -> the embedded text
  std::int64_t sample_chars = 200;  // 0: no sample
  std::int64_t compare_steps = 3;   // paired steps against recompute mode after training; 0: none
};

// Checks what the option bounds cannot (heads divide hidden, the arena's size can be counted, a
// --capacity holds the model's inputs). Returns "" or the problem (a usage error).
std::string check_train_request(const TrainRequest& request);

// The warning for options given on the command line (`given` says which) that the request's mode
// does not use, or "". See Note [Options a mode does not use] in tools/cli/train_command.cc.
std::string unused_options(const TrainRequest& request,
                           const std::function<bool(const std::string&)>& given);

// Trains and prints progress and a summary (text or JSON) to `out`; returns 0. Throws
// spill::Error (or c10::Error) on a runtime failure: bad directory, unreadable, oversized or
// special (FIFO, device) corpus, TrainingDivergedError (after printing the --json summary of
// the steps run), a failed write to `out`.
int run_train(const TrainRequest& request, std::ostream& out);

}  // namespace spill::cli
