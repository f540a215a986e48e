// BM_Allocator/...: SlabAllocator latency and fragmentation.
//   fixed        allocate + free of one 64 KiB block: the hot path of every layer
//   layer_stack  a training step's pattern: 32 layer inputs allocated, then freed newest first
//   varying      random sizes (4 KiB .. 16 MiB) over a live set of ~64 blocks, random frees
// Time per iteration is one allocate + one free for fixed; items_per_second counts allocate+free
// pairs (layer_stack) or single operations (varying). Varying also reports the fragmentation
// capacity_needed_over_peak_live = high-water offset / peak live bytes (requested, and reserved).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "bench_common.h"
#include "core/alloc/slab_allocator.h"

namespace spill_bench {
namespace {

void allocator_fixed(benchmark::State& state) {
  spill::SlabAllocator slabs(1ull << 30);
  for (auto _ : state) {
    auto b = slabs.allocate(64 * 1024);
    benchmark::DoNotOptimize(b);
    slabs.free(*b);
  }
  state.SetItemsProcessed(state.iterations());
}

void allocator_layer_stack(benchmark::State& state) {
  spill::SlabAllocator slabs(64ull << 30);
  std::vector<spill::Block> stack;
  for (auto _ : state) {
    for (int l = 0; l < 32; ++l) stack.push_back(*slabs.allocate(48ull << 20));
    while (!stack.empty()) {
      slabs.free(stack.back());
      stack.pop_back();
    }
  }
  state.SetItemsProcessed(state.iterations() * 32);
}

void allocator_varying(benchmark::State& state) {
  const std::uint64_t capacity = 1ull << 40;  // offsets only: the allocator touches no memory
  std::uint64_t ops = 0;
  double capacity_over_requested = 0, capacity_over_reserved = 0;
  for (auto _ : state) {
    spill::SlabAllocator slabs(capacity);
    std::mt19937_64 rng(1);
    std::vector<spill::Block> live;
    std::uint64_t peak_requested = 0;
    for (int i = 0; i < state.range(0); ++i) {
      if (live.size() < 64 && (live.empty() || rng() % 2 == 0)) {
        const std::uint64_t bytes = 4096 + rng() % (16ull << 20);
        live.push_back(*slabs.allocate(bytes));
      } else {
        std::swap(live[rng() % live.size()], live.back());
        slabs.free(live.back());
        live.pop_back();
      }
      peak_requested = std::max(peak_requested, slabs.stats().bytes_requested);
      ++ops;
    }
    const spill::AllocatorStats s = slabs.stats();
    capacity_over_requested = static_cast<double>(s.high_water_bytes) / peak_requested;
    capacity_over_reserved = static_cast<double>(s.high_water_bytes) / s.peak_bytes_in_use;
  }
  state.SetItemsProcessed(static_cast<int64_t>(ops));
  state.counters["capacity_needed_over_peak_live"] = capacity_over_requested;
  state.counters["capacity_needed_over_peak_reserved"] = capacity_over_reserved;
}

}  // namespace

void register_allocator_benchmarks() {
  benchmark::RegisterBenchmark("BM_Allocator/fixed", allocator_fixed);
  benchmark::RegisterBenchmark("BM_Allocator/layer_stack", allocator_layer_stack);
  benchmark::RegisterBenchmark("BM_Allocator/varying", allocator_varying)
      ->Arg(smoke() ? 1000 : 200000)
      ->Unit(benchmark::kMillisecond);
}

}  // namespace spill_bench
