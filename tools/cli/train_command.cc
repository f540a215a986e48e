#include "train_command.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "clock.h"
#include "corpus.h"
#include "modes.h"
#include "platform.h"
#include "progress.h"
#include "spill/spill.h"
#include "tiny_gpt.h"

namespace spill::cli {
namespace {

std::string load_corpus(const std::string& path) {
  if (path.empty()) return std::string(embedded_corpus());
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgumentError("cannot read --corpus '" + path + "'; check the path");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
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

std::uint64_t checked_capacity(const TrainRequest& r) {
  const std::uint64_t needed = needed_capacity(r);
  if (r.capacity == 0) return needed;
  if (r.capacity < needed && (r.mode == "disk" || r.mode == "ram")) {
    throw InvalidArgumentError(
        "--capacity " + std::to_string(r.capacity) + " bytes is too small for this model: a step "
        "stashes " + std::to_string(r.layers) + " block inputs, " + bytes_with_units(needed) +
        "; raise --capacity to at least that, or omit it");
  }
  return r.capacity;
}

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

struct StepRecord {
  double loss = 0;
  double seconds = 0;
  std::uint64_t io_bytes = 0;
};

std::string progress_text(const TrainRequest& r, std::int64_t step, const StepRecord& s,
                          double mean_s, const SpillArena* arena) {
  std::ostringstream t;
  t << std::fixed << std::setprecision(3) << "step " << step << "/" << r.steps << "  loss "
    << s.loss << std::setprecision(0) << "  "
    << static_cast<double>(r.batch * r.seq) / s.seconds << " tok/s";
  if (arena) {
    const ArenaStats a = arena->stats();
    t << "  arena " << human_bytes(a.bytes_in_use) << " / peak " << human_bytes(a.peak_bytes_in_use);
  }
  t << std::setprecision(2) << "  spill " << static_cast<double>(s.io_bytes) / s.seconds / 1e9
    << " GB/s  ETA " << std::setprecision(0) << mean_s * static_cast<double>(r.steps - step)
    << " s";
  return t.str();
}

nlohmann::json arena_json(const ArenaStats& a) {
  return {{"capacity_bytes", a.capacity_bytes},       {"peak_bytes_in_use", a.peak_bytes_in_use},
          {"bytes_in_use", a.bytes_in_use},           {"allocations", a.allocations},
          {"frees", a.frees},                         {"reuse_hits", a.reuse_hits},
          {"bytes_written", a.bytes_written},         {"bytes_read", a.bytes_read},
          {"largest_free_block", a.largest_free_block}};
}

struct Summary {
  std::vector<double> losses;
  double step_ms_mean = 0;
  double tokens_per_s = 0;
  std::uint64_t peak_rss_anon = 0;
  std::uint64_t spilled_per_step = 0;
  std::string sample;
};

void print_summary(const TrainRequest& r, const Summary& s, const SpillArena* arena,
                   std::ostream& out) {
  if (r.json) {
    nlohmann::json j = {{"mode", r.mode},
                        {"steps", r.steps},
                        {"threads", torch::get_num_threads()},
                        {"losses", s.losses},
                        {"first_loss", s.losses.front()},
                        {"final_loss", s.losses.back()},
                        {"step_ms_mean", s.step_ms_mean},
                        {"tokens_per_s", s.tokens_per_s},
                        {"peak_rss_anon_bytes", s.peak_rss_anon},
                        {"spilled_bytes_per_step", s.spilled_per_step},
                        {"sample", s.sample}};
    j["arena"] = arena ? arena_json(arena->stats()) : nlohmann::json(nullptr);
    out << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return;
  }
  out << std::fixed << std::setprecision(3) << "\nsummary (" << r.mode << ", "
      << torch::get_num_threads() << " LibTorch threads)\n"
      << "  loss            " << s.losses.front() << " -> " << s.losses.back() << "\n"
      << std::setprecision(1) << "  time per step   " << s.step_ms_mean << " ms ("
      << std::setprecision(0) << s.tokens_per_s << " tokens/s)\n"
      << "  peak RssAnon    " << human_bytes(s.peak_rss_anon) << "\n"
      << "  spilled / step  " << human_bytes(s.spilled_per_step) << "\n";
  if (arena) {
    const ArenaStats a = arena->stats();
    out << "  arena           capacity " << human_bytes(a.capacity_bytes) << ", peak in use "
        << human_bytes(a.peak_bytes_in_use) << ", " << a.allocations << " allocations, "
        << a.reuse_hits << " reuse hits, written " << human_bytes(a.bytes_written) << ", read "
        << human_bytes(a.bytes_read) << "\n";
  }
  out << "  sample          " << s.sample << "\n";
}

}  // namespace

std::string check_train_request(const TrainRequest& r) {
  if (r.hidden % r.heads != 0) {
    return "--hidden " + std::to_string(r.hidden) + " is not a multiple of --heads " +
           std::to_string(r.heads) + "; choose a hidden size divisible by the head count";
  }
  if (!(r.lr > 0)) return "--lr must be positive, e.g. --lr 3e-3";
  if (r.dropout < 0 || r.dropout >= 1) {
    return "--dropout must be in [0, 1), got " + std::to_string(r.dropout);
  }
  return "";
}

void run_train(const TrainRequest& request, std::ostream& out) {
  TrainRequest r = request;
  if (r.mode == "per-file") r.mode = "per_file";
  torch::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  const std::string text = load_corpus(r.corpus);
  if (static_cast<std::int64_t>(text.size()) < r.seq + 2) {
    throw InvalidArgumentError("the corpus has " + std::to_string(text.size()) +
                               " bytes, fewer than --seq + 2; use a longer text or a smaller --seq");
  }
  const std::uint64_t capacity = checked_capacity(r);
  models::ModeSetup mode = models::make_mode(r.mode, capacity, r.directory);

  torch::manual_seed(r.seed);
  models::GptConfig cfg{256, r.hidden, r.heads, r.layers, r.seq, r.dropout};
  models::TinyGpt model(cfg);
  model->train();
  torch::optim::AdamW opt(model->parameters(),
                          torch::optim::AdamWOptions(r.lr).weight_decay(0.01));
  torch::Tensor data =
      torch::from_blob(const_cast<char*>(text.data()), {static_cast<std::int64_t>(text.size())},
                       torch::kUInt8).to(torch::kLong);
  BatchSampler sampler(data, r.batch, r.seq, r.seed);

  ProgressLine progress(out, !r.json && platform::stdout_is_terminal());
  Summary summary;
  double total_s = 0;
  const std::int64_t every = std::max<std::int64_t>(1, r.steps / 10);
  for (std::int64_t step = 1; step <= r.steps; ++step) {
    const std::uint64_t io_before =
        mode.arena ? mode.arena->stats().bytes_written + mode.arena->stats().bytes_read : 0;
    const auto t0 = Clock::now();
    auto [inputs, targets] = sampler.next();
    opt.zero_grad();
    torch::Tensor loss = models::next_token_loss(model->forward(inputs, mode.stash), targets);
    summary.peak_rss_anon = std::max(summary.peak_rss_anon, resident_anonymous_bytes());
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();
    StepRecord rec{loss.item<double>(), seconds_since(t0), 0};
    rec.io_bytes = mode.arena
                       ? mode.arena->stats().bytes_written + mode.arena->stats().bytes_read - io_before
                       : 0;
    summary.losses.push_back(rec.loss);
    total_s += rec.seconds;
    if (!r.json) {
      const bool milestone = step == 1 || step % every == 0 || step == r.steps;
      progress.update(progress_text(r, step, rec, total_s / static_cast<double>(step), mode.arena.get()),
                      milestone);
    }
  }
  progress.finish();
  summary.step_ms_mean = total_s / static_cast<double>(r.steps) * 1e3;
  summary.tokens_per_s = static_cast<double>(r.batch * r.seq * r.steps) / total_s;
  summary.spilled_per_step =
      mode.arena ? mode.arena->stats().bytes_written / static_cast<std::uint64_t>(r.steps) : 0;
  torch::manual_seed(r.seed);
  summary.sample = generate(model, "And God said", r.sample_chars, r.seq);
  print_summary(r, summary, mode.arena.get(), out);
}

}  // namespace spill::cli
