// BM_TrainingStep/<mode>/<shape>: one forward + backward of a GPT-style block stack on the CPU.
//   modes   none, recompute (in-RAM checkpointing), ram, disk, per_file
//   shapes  compute: batch 4, seq 256, hidden 256, 4 heads, 4 blocks (realistic FLOPs per byte)
//           io:      batch 64, seq 128, hidden 32, 2 heads, 8 blocks (about 5x the bytes per
//                    FLOP: closer to what a GPU, much faster at the math, sees)
// Counters: step_ms, spilled_bytes per step, peak_rss_anon (RssAnon held after forward, measured
// in a fresh process: see Note [Memory in a fresh process]),
// threads (LibTorch's). tests/checkpoint_test shows the modes give identical gradients.
// BM_TrainingStep/disk_vs_recompute/<shape>: both in one loop, see Note [Paired steps].
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

// The model, data and mode of one benchmark; step() runs forward + backward and returns RssAnon
// right after forward.
class StepRunner {
 public:
  StepRunner(const std::string& mode, const Shape& shape, bool eager_writeback = true)
      : blocks_(make_blocks(shape)),
        mode_(spill::models::make_mode(mode, capacity_for(shape), spill_dir(), eager_writeback)),
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

  std::uint64_t bytes_written() const { return mode_.arena ? mode_.arena->stats().bytes_written : 0; }

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
  spill::models::ModeSetup mode_;
  torch::Tensor x0_;
};

const Shape* find_shape(const std::string& name) {
  if (name == kSmokeShape.name) return &kSmokeShape;
  for (const Shape& s : kShapes) if (name == s.name) return &s;
  return nullptr;
}

// Note [Memory in a fresh process]
// RssAnon follows live memory only when glibc returns every free at once (which doubles step
// times), and only in a process whose heap and per-thread arenas were not shaped by earlier
// benchmarks. So each benchmark measures its memory by running itself once more as a child
// (--memory-probe MODE SHAPE): RssAnon after the forward of the second step, less RssAnon before
// the model was built. The timed steps run in this process under normal malloc.
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
  state.counters["spilled_bytes"] = static_cast<double>(runner.bytes_written() - written_before) / steps;
  state.counters["peak_rss_anon"] = static_cast<double>(held);
  state.counters["threads"] = torch::get_num_threads();
}

// Note [Paired steps]
// This machine's step times drift by 20 % from one benchmark to the next, more than the cost
// being measured. So disk and recompute also run in one benchmark, a step of each per iteration
// in alternating order, and the counter is the median of the per-pair time ratios.
// With eager_writeback false the disk arena leaves writeback to the kernel's flusher: less CPU
// taken from the step on a small machine, more dirty page cache (see ArenaOptions).
void paired_steps(benchmark::State& state, const std::string& a, const std::string& b, Shape shape,
                  bool eager_writeback) {
  StepRunner first(a, shape), second(b, shape, eager_writeback);
  first.step();
  second.step();
  std::vector<double> ratios;
  double a_s = 0, b_s = 0;
  bool a_first = true;
  for (auto _ : state) {
    double ta = 0, tb = 0;
    for (int k = 0; k < 2; ++k) {
      const bool run_a = (k == 0) == a_first;
      Stopwatch w;
      (run_a ? first : second).step();
      (run_a ? ta : tb) = w.seconds();
    }
    a_first = !a_first;
    a_s += ta;
    b_s += tb;
    ratios.push_back(tb / ta);
  }
  std::sort(ratios.begin(), ratios.end());
  const double steps = static_cast<double>(state.iterations());
  state.counters[a + "_step_ms"] = a_s / steps * 1e3;
  state.counters[b + "_step_ms"] = b_s / steps * 1e3;
  state.counters["median_ratio"] = ratios.empty() ? 0.0 : ratios[ratios.size() / 2];
}

}  // namespace

int run_memory_probe(int argc, char** argv) {
  const Shape* shape = argc == 4 ? find_shape(argv[3]) : nullptr;
  if (shape == nullptr) {
    std::fprintf(stderr, "usage: spillarena_bench --memory-probe MODE SHAPE\n");
    return 2;
  }
  // Measured from before the model and the arena exist, so a RAM-backed arena's pages count;
  // the parameters and the input are in every mode's figure alike.
  spill::return_freed_memory_promptly();
  const std::uint64_t before = spill::resident_anonymous_bytes();
  StepRunner runner(argv[2], *shape);
  runner.step();
  spill::return_freed_memory_promptly();
  const std::uint64_t after_forward = runner.step();
  std::printf("%llu\n", static_cast<unsigned long long>(after_forward > before ? after_forward - before : 0));
  return 0;
}

void register_training_step_benchmarks() {
  std::vector<Shape> shapes = smoke() ? std::vector<Shape>{kSmokeShape}
                                      : std::vector<Shape>(std::begin(kShapes), std::end(kShapes));
  for (const Shape& shape : shapes) {
    for (const std::string& mode : spill::models::mode_names()) {
      auto* b = benchmark::RegisterBenchmark(
          ("BM_TrainingStep/" + mode + "/" + shape.name).c_str(),
          [mode, shape](benchmark::State& s) { training_step(s, mode, shape); });
      b->Unit(benchmark::kMillisecond)->UseRealTime();
      if (!smoke()) b->MinTime(5.0);  // steps are long and the machine is noisy
    }
    for (bool eager : {true, false}) {
      const std::string name = eager ? "disk_vs_recompute" : "disk_lazy_writeback_vs_recompute";
      auto* paired = benchmark::RegisterBenchmark(
          ("BM_TrainingStep/" + name + "/" + shape.name).c_str(),
          [shape, eager](benchmark::State& s) { paired_steps(s, "recompute", "disk", shape, eager); });
      paired->Unit(benchmark::kMillisecond)->UseRealTime();
      if (!smoke()) paired->MinTime(10.0);
    }
  }
}

}  // namespace spill_bench
