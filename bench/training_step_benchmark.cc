// BM_TrainingStep/<mode>/<shape>: one forward + backward of a GPT-style block stack on the CPU.
//   modes   none, recompute (in-RAM checkpointing), ram, per_file,
//           disk         synchronous buffered spilling, every input (the comparison point)
//           disk_async   buffered, overlapped (keep_last 1, prefetch depth 2): the default
//           disk_direct  direct I/O through the staging pool, overlapped
//   shapes  compute: batch 4, seq 256, hidden 256, 4 heads, 4 blocks (realistic FLOPs per byte)
//           io:      batch 64, seq 128, hidden 32, 2 heads, 8 blocks (about 5x the bytes per
//                    FLOP: closer to what a GPU, much faster at the math, sees)
// Counters: step_ms, spilled_bytes per step, peak_rss_anon (RssAnon held after forward, measured
// in a fresh process: see Note [Memory in a fresh process]),
// threads (LibTorch's). tests/checkpoint_test shows the modes give identical gradients.
// BM_TrainingStep/<disk mode>_vs_recompute/<shape>: paired in one loop, see Note [Paired steps].
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "bench_common.h"
#include "modes.h"
#include "spill/spill.h"
#include "tiny_gpt.h"

namespace spill_bench {
namespace {

struct Shape {
  const char* name;
  int64_t batch, seq, hidden, heads, layers;
};

const Shape kShapes[] = {{"compute", 4, 256, 256, 4, 4}, {"io", 64, 128, 32, 2, 8}};
const Shape kSmokeShape = {"smoke", 2, 16, 16, 2, 2};

const std::vector<std::string>& step_modes() {
  static const std::vector<std::string> modes = {"none",       "recompute",   "ram",     "disk",
                                                 "disk_async", "disk_direct", "per_file"};
  return modes;
}

// The model, data and mode of one benchmark; step() runs forward + backward and returns RssAnon
// right after forward.
class StepRunner {
 public:
  StepRunner(const std::string& mode, const Shape& shape, bool start_writeback_after_write = true)
      : blocks_(make_blocks(shape)),
        mode_(make_step_mode(mode, capacity_for(shape), start_writeback_after_write)),
        x0_(torch::randn({shape.batch, shape.seq, shape.hidden})) {}

  std::uint64_t step() {
    torch::manual_seed(1);
    torch::Tensor x = x0_.clone().requires_grad_(true);
    torch::Tensor y = spill::models::run_blocks(blocks_, mode_.stash, x);
    const std::uint64_t after_forward = spill::resident_anonymous_bytes();
    y.square().mean().backward();
    blocks_->zero_grad();
    return after_forward;
  }

  std::uint64_t bytes_written() const {
    return mode_.arena ? mode_.arena->stats().bytes_written : 0;
  }
  spill::ArenaStats stats() const {
    return mode_.arena ? mode_.arena->stats() : spill::ArenaStats{};
  }
  spill::StashStats stash_stats() const {
    return mode_.stash ? mode_.stash->stats() : spill::StashStats{};
  }

 private:
  static torch::nn::Sequential make_blocks(const Shape& shape) {
    spill::models::GptConfig cfg;
    cfg.hidden = shape.hidden;
    cfg.heads = shape.heads;
    cfg.dropout = 0.1;
    torch::manual_seed(0);
    torch::nn::Sequential blocks;
    for (int64_t i = 0; i < shape.layers; ++i) blocks->push_back(spill::models::GptBlock(cfg));
    blocks->train();
    return blocks;
  }
  static std::uint64_t capacity_for(const Shape& s) {
    return spill::bytes_for_layer_inputs(
        static_cast<std::uint64_t>(s.layers),
        {static_cast<std::uint64_t>(s.batch), static_cast<std::uint64_t>(s.seq),
         static_cast<std::uint64_t>(s.hidden)},
        torch::kFloat);
  }

  torch::nn::Sequential blocks_;
  spill::harness::ModeSetup mode_;
  torch::Tensor x0_;
};

const Shape* find_shape(const std::string& name) {
  if (name == kSmokeShape.name) return &kSmokeShape;
  for (const Shape& s : kShapes)
    if (name == s.name) return &s;
  return nullptr;
}

// Note [Memory in a fresh process]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// RssAnon follows live memory only when glibc returns every free at once (which slows the steps
// down; measured in docs/benchmarks.md, "Figures behind design notes"), and only in a process whose
// heap and per-thread arenas were not shaped by earlier benchmarks. So each benchmark measures its
// memory by running itself once more as a child (--memory-probe MODE SHAPE): RssAnon after the
// forward of the second step, less RssAnon before the model was built. The timed steps run in this
// process under normal malloc.
std::uint64_t held_after_forward_in_fresh_process(const std::string& mode, const Shape& shape) {
  // Resolved here: inside popen's shell, /proc/self/exe would be the shell.
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string cmd = "'" + exe + "' --memory-probe " + mode + " " + shape.name;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return 0;
  unsigned long long held = 0;
  if (std::fscanf(pipe, "%llu", &held) != 1) held = 0;
  pclose(pipe);
  return held;
}

void training_step(benchmark::State& state, const std::string& mode, Shape shape) {
  const std::uint64_t held = held_after_forward_in_fresh_process(mode, shape);
  StepRunner runner(mode, shape);
  runner.step();  // warm-up
  const std::uint64_t written_before = runner.bytes_written();
  double seconds = 0;
  for (auto _ : state) {
    Stopwatch watch;
    runner.step();
    seconds += watch.seconds();
  }
  const double steps = static_cast<double>(state.iterations());
  state.counters["step_ms"] = seconds / steps * 1e3;
  state.counters["spilled_bytes"] =
      static_cast<double>(runner.bytes_written() - written_before) / steps;
  state.counters["peak_rss_anon"] = static_cast<double>(held);
  state.counters["threads"] = torch::get_num_threads();
}

// Note [Paired steps]
// ~~~~~~~~~~~~~~~~~~~
// This machine's step times drift from one benchmark to the next by more than the cost being
// measured (docs/benchmarks.md, "What each benchmark measures"). So recompute, synchronous disk and
// the disk variant under test run in one benchmark, a step of each per iteration in rotating order,
// and the counters are medians of per-iteration time ratios: median_ratio = variant / recompute,
// vs_sync = variant / disk. overlap = I/O time hidden / I/O time, where the I/O time is what
// synchronous spilling adds to recompute (disk - recompute) and the hidden part is what the variant
// no longer adds (disk - variant).
double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void paired_steps(benchmark::State& state, const std::string& variant, Shape shape) {
  const std::vector<std::string> names = {"recompute", "disk", variant};
  std::vector<std::unique_ptr<StepRunner>> runners;
  for (const auto& n : names) runners.push_back(std::make_unique<StepRunner>(n, shape));
  for (auto& r : runners) r->step();
  std::vector<double> ratio, vs_sync, overlap, total(names.size(), 0.0);
  std::size_t rotation = 0;
  for (auto _ : state) {
    std::vector<double> t(names.size(), 0.0);
    for (std::size_t k = 0; k < names.size(); ++k) {
      const std::size_t i = (k + rotation) % names.size();
      Stopwatch w;
      runners[i]->step();
      t[i] = w.seconds();
      total[i] += t[i];
    }
    rotation = (rotation + 1) % names.size();
    ratio.push_back(t[2] / t[0]);
    vs_sync.push_back(t[2] / t[1]);
    overlap.push_back(t[1] > t[0] ? (t[1] - t[2]) / (t[1] - t[0]) : 0.0);
  }
  const double steps = static_cast<double>(state.iterations());
  for (std::size_t i = 0; i < names.size(); ++i) {
    state.counters[(i == 2 ? std::string("variant") : names[i]) + "_step_ms"] =
        total[i] / steps * 1e3;
  }
  state.counters["median_ratio"] = median(ratio);
  state.counters["vs_sync"] = median(vs_sync);
  state.counters["overlap"] = median(overlap);
  const spill::StashStats st = runners[2]->stash_stats();
  state.counters["restore_waits"] = static_cast<double>(st.restore_waits);
  state.counters["prefetch_hits"] = static_cast<double>(st.prefetch_hits);
  state.counters["prefetches"] = static_cast<double>(st.prefetches);
  state.counters["staging_waits"] = static_cast<double>(runners[2]->stats().staging_waits);
}

}  // namespace

spill::harness::ModeSetup make_step_mode(const std::string& mode, std::uint64_t capacity,
                                         bool start_writeback_after_write) {
  if (mode.rfind("disk", 0) != 0) {
    return spill::harness::make_mode(mode, capacity, spill_dir(), {start_writeback_after_write});
  }
  spill::ArenaOptions o;
  o.directory = spill_dir();
  o.capacity_bytes = capacity;
  o.start_writeback_after_write = start_writeback_after_write;
  o.io = mode == "disk_direct" ? spill::IoMode::direct : spill::IoMode::buffered;
  const bool synchronous = mode == "disk";
  spill::StashOptions s;
  s.asynchronous = !synchronous;
  s.keep_last = synchronous ? 0 : 1;
  s.prefetch_depth = synchronous ? 1 : 2;
  spill::harness::ModeSetup m;
  m.mode = mode;
  m.arena = std::make_unique<spill::SpillArena>(o);
  m.stash = spill::make_arena_stash(*m.arena, s);
  return m;
}

int run_memory_probe(int argc, char** argv) {
  const Shape* shape = argc == 4 ? find_shape(argv[3]) : nullptr;
  if (shape == nullptr) {
    std::fprintf(stderr, "usage: spillarena_bench --memory-probe MODE SHAPE\n");
    return 2;
  }
  // Measured from before the model and the arena exist, so a RAM arena's pages count;
  // the parameters and the input are in every mode's figure alike.
  spill::return_freed_memory_promptly();
  const std::uint64_t before = spill::resident_anonymous_bytes();
  StepRunner runner(argv[2], *shape);
  runner.step();
  spill::return_freed_memory_promptly();
  const std::uint64_t after_forward = runner.step();
  std::printf("%llu\n",
              static_cast<unsigned long long>(after_forward > before ? after_forward - before : 0));
  return 0;
}

void register_training_step_benchmarks() {
  std::vector<Shape> shapes = smoke() ? std::vector<Shape>{kSmokeShape}
                                      : std::vector<Shape>(std::begin(kShapes), std::end(kShapes));
  for (const Shape& shape : shapes) {
    for (const std::string& mode : step_modes()) {
      auto* b = benchmark::RegisterBenchmark(
          ("BM_TrainingStep/" + mode + "/" + shape.name).c_str(),
          [mode, shape](benchmark::State& s) { training_step(s, mode, shape); });
      b->Unit(benchmark::kMillisecond)->UseRealTime();
      if (!smoke()) b->MinTime(5.0);  // steps are long and the machine is noisy
    }
    for (const std::string variant : {"disk", "disk_async", "disk_direct"}) {
      auto* paired = benchmark::RegisterBenchmark(
          ("BM_TrainingStep/" + variant + "_vs_recompute/" + shape.name).c_str(),
          [shape, variant](benchmark::State& s) { paired_steps(s, variant, shape); });
      paired->Unit(benchmark::kMillisecond)->UseRealTime();
      if (!smoke()) paired->MinTime(10.0);
    }
  }
}

}  // namespace spill_bench
