#include "train_command.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "clock.h"
#include "core/text/quote.h"
#include "corpus.h"
#include "failures.h"
#include "memory_budget.h"
#include "modes.h"
#include "progress.h"
#include "signal_cleaned_directory.h"
#include "spill/spill.h"
#include "spill/units.h"
#include "tiny_gpt.h"
#include "train_summary.h"

namespace spill::cli {
namespace {

// A descriptor closed when it goes out of scope.
class OpenFile {
 public:
  explicit OpenFile(int fd) : fd_(fd) {}
  ~OpenFile() {
    if (fd_ >= 0) close(fd_);
  }
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

// Note [A corpus is a regular file]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Opening a FIFO for reading waits for a writer, forever if none comes; a device (/dev/zero)
// never ends. The file is opened with O_NONBLOCK, which returns at once for a FIFO, and anything
// but a regular file is refused by what fstat says about the descriptor opened (not about the
// name, which could change in between). At most kMaxCorpusBytes + 1 bytes are read, so a file
// that grows while it is read is refused too, never read until memory runs out.
std::string load_corpus(const std::string& path) {
  if (path.empty()) return std::string(embedded_corpus());
  OpenFile file(open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (file.get() < 0) {
    throw InvalidArgumentError("cannot read --corpus " + detail::quote(path) + ": " +
                               std::strerror(errno) + "; check the path");
  }
  struct stat s;
  if (fstat(file.get(), &s) != 0) {
    throw InvalidArgumentError("cannot read --corpus " + detail::quote(path) + ": " +
                               std::strerror(errno));
  }
  if (!S_ISREG(s.st_mode)) {
    throw InvalidArgumentError("--corpus " + detail::quote(path) + " is " + kind_of(s.st_mode) +
                               ", not a regular file; pass a text file (a pipe or device may "
                               "never end)");
  }
  std::string text(kMaxCorpusBytes + 1, '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = read(file.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw InvalidArgumentError("cannot read --corpus " + detail::quote(path) + ": " +
                                 std::strerror(errno));
    }
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  text.resize(done);
  if (text.size() > kMaxCorpusBytes) {
    throw InvalidArgumentError("--corpus " + detail::quote(path) + " is larger than " +
                               bytes_with_units(kMaxCorpusBytes) +
                               "; pass a smaller text file (or an excerpt of it)");
  }
  return text;
}

// Random windows of seq + 1 bytes: inputs and next-byte targets. Its own generator, so the
// batches do not depend on how many random numbers the model drew.
class BatchSampler {
 public:
  BatchSampler(const torch::Tensor& data, std::int64_t batch, std::int64_t seq, std::uint64_t seed)
      : data_(data), batch_(batch), seq_(seq), rng_(seed) {}
  std::pair<torch::Tensor, torch::Tensor> next() {
    std::uniform_int_distribution<std::int64_t> pick(0, data_.size(0) - seq_ - 2);
    std::vector<torch::Tensor> rows;
    for (std::int64_t b = 0; b < batch_; ++b) rows.push_back(data_.narrow(0, pick(rng_), seq_ + 1));
    torch::Tensor windows = torch::stack(rows);
    return {windows.narrow(1, 0, seq_), windows.narrow(1, 1, seq_)};
  }

 private:
  torch::Tensor data_;
  std::int64_t batch_, seq_;
  std::mt19937_64 rng_;
};

std::uint64_t needed_capacity(const TrainRequest& r) {
  return bytes_for_layer_inputs(
      static_cast<std::uint64_t>(r.layers),
      {static_cast<std::uint64_t>(r.batch), static_cast<std::uint64_t>(r.seq),
       static_cast<std::uint64_t>(r.hidden)},
      torch::kFloat);
}

std::uint64_t capacity_of(const TrainRequest& r) {
  return r.capacity == 0 ? needed_capacity(r) : r.capacity;
}

bool uses_arena(const std::string& mode) { return mode == "disk" || mode == "ram"; }

std::string generate(models::TinyGpt& model, const std::string& prompt, std::int64_t chars,
                     std::int64_t max_seq) {
  torch::NoGradGuard no_grad;
  model->eval();
  // Printable ASCII and newlines only: an undertrained model may emit any byte.
  torch::Tensor banned = torch::ones({256}, torch::kBool);
  banned.narrow(0, 32, 95).fill_(false);
  banned[10] = false;
  std::vector<std::int64_t> ids(prompt.begin(), prompt.end());
  for (std::int64_t i = 0; i < chars; ++i) {
    const auto start = static_cast<std::ptrdiff_t>(
        std::max<std::int64_t>(0, static_cast<std::int64_t>(ids.size()) - max_seq));
    std::vector<std::int64_t> window(ids.begin() + start, ids.end());
    torch::Tensor tokens = torch::tensor(window, torch::kLong).unsqueeze(0);
    torch::Tensor logits = model->forward(tokens, nullptr).select(1, -1).squeeze(0);
    logits.masked_fill_(banned, -std::numeric_limits<float>::infinity());
    torch::Tensor probs = torch::softmax(logits / 0.8, -1);
    ids.push_back(torch::multinomial(probs, 1).item<std::int64_t>());
  }
  model->train();
  std::string text;
  for (std::int64_t id : ids) text.push_back(static_cast<char>(id));
  return text;
}

}  // namespace

std::string check_train_request(const TrainRequest& r) {
  if (r.hidden % r.heads != 0) {
    return "--hidden " + std::to_string(r.hidden) + " is not a multiple of --heads " +
           std::to_string(r.heads) + "; choose a hidden size divisible by the head count";
  }
  try {
    needed_capacity(r);
  } catch (const spill::InvalidArgumentError&) {
    return "the layer inputs of --layers " + std::to_string(r.layers) + " x [--batch " +
           std::to_string(r.batch) + ", --seq " + std::to_string(r.seq) + ", --hidden " +
           std::to_string(r.hidden) + "] are more bytes than can be counted; use a smaller model";
  }
  // With --when-full keep_in_memory a small --capacity is a start: the first step keeps what
  // does not fit in memory and the arena grows before the second (Note [Growing the arena] in
  // src/core/arena/arena_growth.cc). With error, the first input that does not fit ends the run.
  const std::uint64_t needed = needed_capacity(r);
  if (r.capacity != 0 && r.capacity < needed && uses_arena(r.mode) && r.when_full == "error") {
    return "--capacity " + std::to_string(r.capacity) +
           " bytes is too small for this model with --when-full error: a step stashes " +
           std::to_string(r.layers) + " block inputs, " + bytes_with_units(needed) +
           "; raise --capacity to at least that, omit it, or let the arena grow "
           "(--when-full keep_in_memory)";
  }
  return "";
}

// Note [Options a mode does not use]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// --io only means something to the disk arena, --capacity and the sizing options (--when-full,
// --grow/--no-grow, --growth-margin) to an arena (disk, ram), --dir to what writes files (disk,
// per-file). Given with another mode they would change nothing, silently; a refusal would break
// a command line rerun with another --mode. So they are accepted, and one warning line on stderr
// names them and the modes they apply to. The exit code is unchanged.
std::string unused_options(const TrainRequest& r,
                           const std::function<bool(const std::string&)>& given) {
  struct Applies {
    const char* option;
    bool (*used_by)(const std::string& mode);
    const char* modes;
  };
  static const Applies kOptions[] = {
      {"--io", [](const std::string& m) { return m == "disk"; }, "disk"},
      {"--capacity", uses_arena, "disk and ram"},
      {"--when-full", uses_arena, "disk and ram"},
      {"--no-grow", uses_arena, "disk and ram"},  // --grow, the default, is the same option
      {"--growth-margin", uses_arena, "disk and ram"},
      {"--dir", [](const std::string& m) { return m == "disk" || m == "per_file"; },
       "disk and per-file"},
  };
  const std::string mode = harness::mode_named(r.mode);
  std::string unused;
  for (const Applies& a : kOptions) {
    if (!given(a.option) || a.used_by(mode)) continue;
    unused += std::string(unused.empty() ? "" : "; ") + a.option + " (" + a.modes + " only)";
  }
  if (unused.empty()) return "";
  return "ignored with --mode " + r.mode + ": " + unused;
}

namespace {

IoMode io_mode_of(const std::string& name) {
  if (name == "buffered") return IoMode::buffered;
  if (name == "direct") return IoMode::direct;
  return IoMode::automatic;
}

double check_finite_loss(const TrainRequest& r, std::int64_t step, const torch::Tensor& loss) {
  const double value = loss.item<double>();
  if (std::isfinite(value)) return value;
  std::ostringstream m;
  m << "training diverged: the loss is " << format_real(value) << " at step " << step << " of "
    << r.steps << " (--lr " << format_real(r.lr) << "); lower --lr (the default is "
    << format_real(TrainRequest{}.lr) << ")";
  throw TrainingDivergedError(step, value, m.str());
}

void check_output(std::ostream& out) {
  if (!out) {
    throw spill::Error(
        "cannot write the progress to standard output (closed, or on a full file "
        "system); leave it open, or send it to a file system with free space");
  }
}

struct Trainer {
  TrainRequest r;
  std::unique_ptr<SignalCleanedDirectory> per_file_directory;  // outlives mode's stash
  harness::ModeSetup mode;
  models::TinyGpt model{nullptr};
  std::unique_ptr<torch::optim::AdamW> opt;
  Summary summary;
  // The totals when the latest step began: the summary's per-step figures are that step's, the
  // steady state once an arena that overflowed in an earlier step has grown.
  ArenaStats arena_at_step_start;
  StashStats stash_at_step_start;

  // The arena's totals as a record; a step's record is the difference across it.
  static StepRecord so_far(const ArenaStats& a) {
    StepRecord totals;
    totals.io_bytes = a.bytes_written + a.bytes_read;
    totals.overflows = a.overflows;
    totals.grows = a.grows;
    return totals;
  }
  void sample_rss() {
    summary.peak_rss_anon = std::max(summary.peak_rss_anon, resident_anonymous_bytes());
  }

  // One optimizer step; the loss is checked before backward, so a diverged run stops there.
  StepRecord step(std::int64_t n, BatchSampler& sampler) {
    if (mode.arena) {
      arena_at_step_start = mode.arena->stats();
      stash_at_step_start = stash_stats(*mode.arena);
    }
    const auto t0 = Clock::now();
    auto [inputs, targets] = sampler.next();
    opt->zero_grad();
    torch::Tensor loss = models::next_token_loss(model->forward(inputs, mode.stash), targets);
    sample_rss();
    const double value = check_finite_loss(r, n, loss);
    loss.backward();
    sample_rss();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt->step();
    const double seconds = seconds_since(t0);
    const StepRecord before = so_far(arena_at_step_start);
    StepRecord record = mode.arena ? so_far(mode.arena->stats()) : StepRecord{};
    record.loss = value;
    record.seconds = seconds;
    record.io_bytes -= before.io_bytes;
    record.overflows -= before.overflows;
    record.grows -= before.grows;
    return record;
  }

  void finish_summary(double total_s) {
    const auto steps = static_cast<double>(summary.losses.size());
    summary.step_ms_mean = total_s / steps * 1e3;
    summary.tokens_per_s = total_s > 0 ? static_cast<double>(r.batch * r.seq) * steps / total_s : 0;
    summary.layer_inputs_per_step = needed_capacity(r);
    if (mode.arena) {
      summary.arena = mode.arena->stats();
      summary.arena_options = mode.arena->options();
      summary.spilled_per_step = summary.arena->bytes_written - arena_at_step_start.bytes_written;
      summary.stash = stash_stats(*mode.arena);
      summary.inputs_per_step = summary.stash.inputs_stored - stash_at_step_start.inputs_stored;
      summary.inputs_spilled_per_step =
          summary.stash.inputs_spilled - stash_at_step_start.inputs_spilled;
    }
    summary.memory = memory_limits();
    summary.rss_anon_at_end = resident_anonymous_bytes();
  }
};

// The model, optimizer and mode of a run; `mode` may differ from r.mode (the comparison).
void set_up(Trainer& t, const std::string& mode, const std::string& directory) {
  const TrainRequest& r = t.r;
  const std::uint64_t per_layer = needed_capacity(r) / static_cast<std::uint64_t>(r.layers);
  harness::ArenaTuning tuning{true, io_mode_of(r.io), staging_bytes_for_layer(per_layer)};
  tuning.when_full = r.when_full == "error" ? WhenFull::error : WhenFull::keep_in_memory;
  tuning.grow = r.grow;
  tuning.growth_margin = r.growth_margin;
  t.mode = harness::make_mode(mode, capacity_of(r), directory, tuning);
  torch::manual_seed(r.seed);
  models::GptConfig cfg{256, r.hidden, r.heads, r.layers, r.seq, r.dropout, r.attention_dropout};
  t.model = models::TinyGpt(cfg);
  t.model->train();
  t.opt = std::make_unique<torch::optim::AdamW>(
      t.model->parameters(),
      torch::optim::AdamWOptions(r.lr).betas({kAdamBeta1, kAdamBeta2}).weight_decay(0.01));
}

// Note [What spilling costs in time]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The summary's step-time ratio compares this mode with the same model under in-RAM
// checkpointing (recompute mode: the same recomputation, no spill), measured, not estimated.
// After training, a fresh recompute model (same seed, same batches) and the trained model take
// turns, one step each, --compare-steps times: a 2-core machine's load changes from second to
// second, and alternating lets it hit both sides alike. The first pair warms the recompute
// model's allocator and is not counted. Only for modes that spill (disk, ram, per-file). The
// recompute model holds every layer input in RAM, which is what a run under a memory limit
// cannot afford: the comparison is skipped, and says why, unless the memory the process may
// still use holds a second model of this run's peak plus all its layer inputs.
void compare_with_recompute(Trainer& t, const torch::Tensor& data) {
  const TrainRequest& r = t.r;
  if (r.compare_steps == 0 || r.mode == "none" || r.mode == "recompute") return;
  const std::uint64_t need = t.summary.peak_rss_anon + needed_capacity(r);
  const std::uint64_t usable = memory_limits().usable_bytes();
  if (usable < need) {
    t.summary.comparison_skipped = "in-RAM checkpointing would need about " + human_bytes(need) +
                                   " more; this process may use " + human_bytes(usable);
    return;
  }
  Trainer base;
  base.r = r;
  set_up(base, "recompute", r.directory);
  BatchSampler ours(data, r.batch, r.seq, r.seed + 1);
  BatchSampler theirs(data, r.batch, r.seq, r.seed + 1);
  const std::uint64_t peak = t.summary.peak_rss_anon;
  double ours_s = 0;
  double theirs_s = 0;
  for (std::int64_t n = 0; n <= r.compare_steps; ++n) {
    const double a = t.step(n, ours).seconds;
    const double b = base.step(n, theirs).seconds;
    if (n == 0) continue;
    ours_s += a;
    theirs_s += b;
  }
  t.summary.peak_rss_anon = peak;  // training's, not the two models' of the comparison
  t.summary.compared_steps = r.compare_steps;
  t.summary.compared_ms = ours_s / static_cast<double>(r.compare_steps) * 1e3;
  t.summary.compared_recompute_ms = theirs_s / static_cast<double>(r.compare_steps) * 1e3;
}

void train_loop(Trainer& t, BatchSampler& sampler, std::ostream& out) {
  const TrainRequest& r = t.r;
  ProgressLine progress(out, !r.json && stdout_is_terminal());
  double total_s = 0;
  const std::int64_t every = std::max<std::int64_t>(1, r.steps / 10);
  for (std::int64_t n = 1; n <= r.steps; ++n) {
    StepRecord rec;
    try {
      rec = t.step(n, sampler);
    } catch (const TrainingDivergedError& e) {
      progress.finish();
      t.summary.diverged_at_step = n;
      t.summary.losses.push_back(e.loss());
      if (r.json) {
        t.finish_summary(total_s);
        print_summary(r, t.summary, out);
      }
      throw;
    }
    t.summary.losses.push_back(rec.loss);
    total_s += rec.seconds;
    if (r.json) continue;
    const bool resized = rec.overflows > 0 || rec.grows > 0;  // always worth a line
    const bool milestone = n == 1 || n % every == 0 || n == r.steps || resized;
    progress.update(progress_text(r, n, rec, total_s / static_cast<double>(n), t.mode.arena.get()),
                    milestone);
    check_output(out);
  }
  progress.finish();
  t.finish_summary(total_s);
}

// The arena stash warns through TORCH_WARN (the first overflow, a refused grow: Note [Growing the
// arena] in src/core/arena/arena_growth.cc), which c10 prints as a multi-part log line. In the CLI
// each becomes the one stderr line every other warning is.
class WarningsAsLines final : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    std::string text = warning.msg();
    const std::string prefix = "spillarena: ";
    if (text.rfind(prefix, 0) == 0) text.erase(0, prefix.size());
    warn(text);
  }
};

}  // namespace

int run_train(const TrainRequest& request, std::ostream& out) {
  WarningsAsLines warnings;
  c10::WarningUtils::WarningHandlerGuard warnings_guard(&warnings);
  Trainer t;
  t.r = request;
  TrainRequest& r = t.r;
  r.mode = harness::mode_named(r.mode);
  // Without this call glibc keeps freed tensor memory and RssAnon (what a memory cgroup kills
  // on) follows malloc's high-water mark, not live memory (see Note [Returning freed memory] in
  // src/core/os/process_memory.cc).
  if (!r.keep_freed_memory) return_freed_memory_promptly();
  t.summary.returns_freed_memory = !r.keep_freed_memory;
  // Before LibTorch starts its threads: they must block the signals it takes.
  if (r.mode == "per_file") {
    t.per_file_directory = std::make_unique<SignalCleanedDirectory>(
        r.directory.empty() ? default_spill_directory() : r.directory);
  }
  torch::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  const std::string text = load_corpus(r.corpus);
  if (text.size() < static_cast<std::uint64_t>(r.seq) + 2) {
    throw InvalidArgumentError(
        "the corpus has " + std::to_string(text.size()) +
        " bytes, fewer than --seq + 2; use a longer text or a smaller --seq");
  }
  set_up(t, r.mode, t.per_file_directory ? t.per_file_directory->path() : r.directory);
  torch::Tensor data = torch::from_blob(const_cast<char*>(text.data()),
                                        {static_cast<std::int64_t>(text.size())}, torch::kUInt8)
                           .to(torch::kLong);
  BatchSampler sampler(data, r.batch, r.seq, r.seed);
  train_loop(t, sampler, out);
  torch::manual_seed(r.seed);
  if (r.sample_chars > 0)
    t.summary.sample = generate(t.model, "And God said", r.sample_chars, r.seq);
  compare_with_recompute(t, data);
  print_summary(r, t.summary, out);
  check_output(out);
  return 0;
}

}  // namespace spill::cli
