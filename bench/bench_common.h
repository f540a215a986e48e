// Shared by the benchmark files: the spill directory, the smoke switch, a stopwatch.
#pragma once

#include <chrono>
#include <cstdlib>
#include <string>

#include "modes.h"
#include "spill/arena.h"

namespace spill_bench {

// SPILLARENA_BENCH_SMOKE=1: register only the smallest case of each benchmark (CI proves they
// run; it never judges timings).
inline bool smoke() {
  const char* s = std::getenv("SPILLARENA_BENCH_SMOKE");
  return s != nullptr && *s != '\0' && std::string(s) != "0";
}

inline std::string spill_dir() { return spill::default_spill_directory(); }

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

// A mode of spill::harness::make_mode, or one of the disk variants the step benchmarks compare:
// disk (synchronous, buffered, every input spilled), disk_async (buffered, overlapped: keep_last 1,
// prefetch depth 2), disk_direct (direct I/O through the staging pool, overlapped).
spill::harness::ModeSetup make_step_mode(const std::string& mode, std::uint64_t capacity,
                                         bool start_writeback_after_write = true);

void register_round_trip_benchmarks();
void register_allocator_benchmarks();
void register_training_step_benchmarks();
void register_regime_benchmarks();
void register_accelerator_benchmarks();
void register_integrity_benchmarks();
void register_growth_benchmarks();
void register_io_backend_benchmarks();
// The child side of the memory probe (see Note [Memory in a fresh process] in
// bench/training_step_benchmark.cc): argv = {exe, --memory-probe, MODE, SHAPE}.
int run_memory_probe(int argc, char** argv);
// The child of BM_Regime: argv = {exe, --regime-child, IO, LAYERS, ROWS, HIDDEN, STEPS, DIR}.
int run_regime_child(int argc, char** argv);
// The child of BM_AcceleratorStep that measures a mode's host memory: argv = {exe,
// --accelerator-child, MODE}. See Note [Peak host memory of a step] in
// bench/accelerator_benchmark.cc.
int run_accelerator_child(int argc, char** argv);

}  // namespace spill_bench
