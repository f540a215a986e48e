// BM_TrainingStep/<mode>/<shape>: one forward + backward of a GPT-style block stack on the CPU.
//   modes   none, recompute (in-RAM checkpointing), ram, disk, per_file
//   shapes  compute: batch 4, seq 256, hidden 256, 4 heads, 4 blocks (realistic FLOPs per byte)
//           io:      batch 64, seq 128, hidden 32, 2 heads, 8 blocks (about 5x the bytes per
//                    FLOP: closer to what a GPU, much faster at the math, sees)
// Counters: step_ms, spilled_bytes per step, peak_rss_anon (RssAnon held after forward, from an
// untimed step: see Note [Memory and time in separate steps]),
// threads (LibTorch's). tests/checkpoint_test shows the modes give identical gradients.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>

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

void training_step(benchmark::State& state, const std::string& mode, Shape shape) {
  spill::models::GptConfig cfg;
  cfg.hidden = shape.hidden;
  cfg.heads = shape.heads;
  cfg.dropout = 0.1;
  torch::manual_seed(0);
  torch::nn::Sequential blocks;
  for (int64_t i = 0; i < shape.layers; ++i) blocks->push_back(spill::models::GptBlock(cfg));
  blocks->train();
  const std::uint64_t capacity = spill::bytes_for_layer_inputs(
      static_cast<std::uint64_t>(shape.layers),
      {static_cast<std::uint64_t>(shape.batch), static_cast<std::uint64_t>(shape.seq),
       static_cast<std::uint64_t>(shape.hidden)},
      torch::kFloat);
  spill::models::ModeSetup m = spill::models::make_mode(mode, capacity, spill_dir());
  const torch::Tensor x0 = torch::randn({shape.batch, shape.seq, shape.hidden});

  auto step = [&] {
    torch::manual_seed(1);
    torch::Tensor x = x0.clone().requires_grad_(true);
    torch::Tensor y = spill::models::run_blocks(blocks, m.stash, x);
    const std::uint64_t after_forward = spill::resident_anonymous_bytes();
    y.square().mean().backward();
    blocks->zero_grad();
    return after_forward;
  };
  // Note [Memory and time in separate steps]
  // RssAnon follows live memory only if freed blocks go back to the system at once, which makes
  // every large allocation fault in fresh pages and doubles step times. So one untimed step
  // measures memory in that mode, then glibc gets a 32 MiB mmap threshold (its own dynamic
  // ceiling, where a long-running process ends up anyway) and the timed steps run in it.
  spill::return_freed_memory_promptly();
  step();  // warm-up: first-use allocations are not the mode's
  spill::return_freed_memory_promptly();
  const std::uint64_t before = spill::resident_anonymous_bytes();
  const std::uint64_t after_forward = step();
  const std::uint64_t peak_growth = after_forward > before ? after_forward - before : 0;
  spill::return_freed_memory_promptly(32ull << 20);
  const std::uint64_t written_before = m.arena ? m.arena->stats().bytes_written : 0;
  double seconds = 0;
  for (auto _ : state) {
    Stopwatch watch;
    step();
    seconds += watch.seconds();
  }
  const double steps = static_cast<double>(state.iterations());
  state.counters["step_ms"] = seconds / steps * 1e3;
  state.counters["spilled_bytes"] =
      m.arena ? static_cast<double>(m.arena->stats().bytes_written - written_before) / steps : 0.0;
  state.counters["peak_rss_anon"] = static_cast<double>(peak_growth);
  state.counters["threads"] = torch::get_num_threads();
}

}  // namespace

void register_training_step_benchmarks() {
  std::vector<Shape> shapes = smoke() ? std::vector<Shape>{kSmokeShape}
                                      : std::vector<Shape>(std::begin(kShapes), std::end(kShapes));
  for (const Shape& shape : shapes) {
    for (const std::string& mode : spill::models::mode_names()) {
      benchmark::RegisterBenchmark(
          ("BM_TrainingStep/" + mode + "/" + shape.name).c_str(),
          [mode, shape](benchmark::State& s) { training_step(s, mode, shape); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  }
}

}  // namespace spill_bench
