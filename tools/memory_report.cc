// spillarena_memory: anonymous memory held between forward and backward of an N-layer stack,
// per mode, as a Markdown table (the README's memory figures).
//
//   ./build/tools/spillarena_memory [directory] [rows] [hidden] [layers]
//
// Without `layers`, the rows for 4, 8, 16 and 32 layers (the README's table); with it, only that
// many (what `scripts/readme_train_output.sh --check` compares, in seconds).
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <vector>

#include "memory_probe.h"
#include "numbers.h"
#include "spill/core.h"

namespace {

// argv[i] as a count in [1, 1 << 20], or `fallback` when absent; exits 2 on bad input.
std::int64_t count_argument(int argc, char** argv, int i, const char* name, std::int64_t fallback) {
  if (argc <= i) return fallback;
  const auto n = spill::cli::parse_count(name, argv[i], {1, 1u << 20});
  if (!n.ok()) {
    std::cerr << "spillarena_memory: " << n.error << "\n";
    std::exit(2);
  }
  return static_cast<std::int64_t>(n.value);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "";
  const std::int64_t rows = count_argument(argc, argv, 2, "rows", 2048);
  const std::int64_t hidden = count_argument(argc, argv, 3, "hidden", 1024);
  std::vector<int> layer_counts = {4, 8, 16, 32};
  if (argc > 4) layer_counts = {static_cast<int>(count_argument(argc, argv, 4, "layers", 4))};
  spill::return_freed_memory_promptly();
  torch::set_num_threads(static_cast<int>(std::thread::hardware_concurrency()));
  try {
    spill::harness::probe_stack_memory("none", 2, rows, hidden, dir);  // warm-up
    std::cout << "layer input " << rows << " x " << hidden
              << " float32 = " << spill::human_bytes(static_cast<std::uint64_t>(rows * hidden * 4))
              << "; LibTorch threads: " << torch::get_num_threads() << "\n\n"
              << "| layers | mode | RssAnon held after forward | peak RssAnon growth in the step |"
                 " spilled |\n|---:|---|---:|---:|---:|\n";
    for (int layers : layer_counts) {
      for (const char* mode : {"none", "recompute", "ram", "disk"}) {
        auto r = spill::harness::probe_stack_memory(mode, layers, rows, hidden, dir);
        std::cout << "| " << layers << " | " << mode << " | "
                  << spill::human_bytes(r.held_after_forward_bytes) << " | "
                  << spill::human_bytes(r.peak_during_step_bytes) << " | "
                  << spill::human_bytes(r.spilled_bytes) << " |\n";
      }
    }
  } catch (const std::exception& e) {  // spill::Error, or LibTorch's for a too large shape
    std::cerr << "spillarena_memory: " << e.what() << "\n";
    return 1;
  }
}
