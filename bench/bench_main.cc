// spillarena_bench: every comparison in one binary and one run. See docs/benchmarks.md.
//
//   SPILL_DIR=/mnt/nvme build/bench/spillarena_bench --benchmark_format=json > results.json
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <iostream>
#include <string>
#include <thread>

#include "bench_common.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--memory-probe") {
    torch::set_num_threads(static_cast<int>(std::thread::hardware_concurrency()));
    return spill_bench::run_memory_probe(argc, argv);
  }
  if (argc > 1 && std::string(argv[1]) == "--regime-child") {
    torch::set_num_threads(static_cast<int>(std::thread::hardware_concurrency()));
    return spill_bench::run_regime_child(argc, argv);
  }
  if (argc > 1 && std::string(argv[1]) == "--accelerator-child") {
    torch::set_num_threads(static_cast<int>(std::thread::hardware_concurrency()));
    return spill_bench::run_accelerator_child(argc, argv);
  }
  const int threads = static_cast<int>(std::thread::hardware_concurrency());
  torch::set_num_threads(threads);
  benchmark::AddCustomContext("libtorch_threads", std::to_string(torch::get_num_threads()));
  benchmark::AddCustomContext("spill_dir", spill_bench::spill_dir());
  benchmark::AddCustomContext("smoke", spill_bench::smoke() ? "1" : "0");
  spill_bench::register_round_trip_benchmarks();
  spill_bench::register_allocator_benchmarks();
  spill_bench::register_training_step_benchmarks();
  spill_bench::register_regime_benchmarks();
  spill_bench::register_accelerator_benchmarks();
  spill_bench::register_integrity_benchmarks();
  spill_bench::register_growth_benchmarks();
  spill_bench::register_io_backend_benchmarks();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
