// BM_Growth: what growing a disk arena costs (Note [Growing the arena] in
// src/core/arena/arena_growth.cc).
//   BM_Growth/grow/<start MiB>/<target MiB>  one grow, timed alone: a fresh arena of the start
//                  size per iteration is overflowed by regions summing target / growth_margin,
//                  they are freed, and the next allocation, which grows the file (statfs,
//                  fallocate, mmap), is timed. Counters: grow_ms (mean), grow_ms_min,
//                  grow_ms_max, grown_to_bytes.
//   BM_Growth/grown_vs_sized/<step MiB>  a step (allocate the regions, write them, wait until
//                  they are on disk and out of the page cache, read them back, free) on an arena
//                  that started at 64 MiB and grew once, against one made at the grown capacity
//                  from the start, and a second one made so too, in rotating order (Note
//                  [Paired steps] in training_step_benchmark.cc). Counters: ratio (median of
//                  grown / sized per iteration; goal <= 1.02), control_ratio (the second sized
//                  arena / the first: the noise floor, Note [A control pair for the grown
//                  arena]), grown_step_ms, sized_step_ms, control_step_ms, capacity_bytes,
//                  grown_/sized_staging_bytes and grown_/sized_staging_waits_per_step.
//   BM_Growth/grown_vs_sized_direct/<step MiB>  the same in direct mode, from an arena of three
//                  pages: its staging pool must grow with it (goal: ratio <= 1.05, as many
//                  staging waits per step as the sized arena).
//   BM_Growth/kept_graph/<steps>  file size / peak live bytes after that many steps with one
//                  graph kept alive (goal: file_over_peak <= growth_margin).
// All in the default spill directory ($SPILL_DIR, else $TMPDIR or /tmp), buffered I/O unless
// named direct.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "bench_common.h"
#include "core/arena/arena_internals.h"
#include "spill/spill.h"

namespace spill_bench {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

spill::SpillArena disk_arena(std::uint64_t capacity_bytes,
                             spill::IoMode io = spill::IoMode::buffered) {
  spill::ArenaOptions o;
  o.directory = spill_dir();
  o.capacity_bytes = capacity_bytes;
  o.io = io;
  return spill::SpillArena(o);
}

// Asks `arena` for `total_bytes` in regions of at most `region_bytes`, all live at once: what
// fits is held, the rest overflows and is held in memory (its empty Region kept, as the stash
// keeps it). Returns when every region is freed again, so the next allocation grows the arena
// to what this asked for times its growth_margin.
void overflow(spill::SpillArena& arena, std::uint64_t total_bytes, std::uint64_t region_bytes) {
  std::vector<spill::Region> held;
  for (std::uint64_t done = 0; done < total_bytes; done += region_bytes) {
    held.push_back(arena.try_allocate(std::min(region_bytes, total_bytes - done)));
  }
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ---------------------------------------------------------------------------------------------

void grow_once(benchmark::State& state) {
  const std::uint64_t start = static_cast<std::uint64_t>(state.range(0)) * kMiB;
  const std::uint64_t target = static_cast<std::uint64_t>(state.range(1)) * kMiB;
  const double margin = spill::ArenaOptions{}.growth_margin;
  const auto asked = static_cast<std::uint64_t>(static_cast<double>(target) / margin);
  std::vector<double> grow_ms;
  std::uint64_t grown_to = 0;
  for (auto _ : state) {
    spill::SpillArena arena = disk_arena(start);
    overflow(arena, asked, 16 * kMiB);
    Stopwatch w;
    spill::Region first = arena.allocate(spill::page_size_bytes());  // grows first
    const double seconds = w.seconds();
    state.SetIterationTime(seconds);
    grow_ms.push_back(seconds * 1e3);
    const spill::ArenaStats s = arena.stats();
    if (s.grows != 1) state.SkipWithError(("no grow: " + s.grow_note).c_str());
    grown_to = s.capacity_bytes;
  }
  state.counters["grow_ms"] = mean(grow_ms);
  state.counters["grow_ms_min"] = *std::min_element(grow_ms.begin(), grow_ms.end());
  state.counters["grow_ms_max"] = *std::max_element(grow_ms.begin(), grow_ms.end());
  state.counters["grown_to_bytes"] = static_cast<double>(grown_to);
}

// ---------------------------------------------------------------------------------------------

// One training-like step on an arena: regions allocated, written, put on disk and out of the
// page cache (the read comes from the disk, as a spilled input's does when memory is short),
// read back, freed. Returns its seconds.
class Step {
 public:
  Step(std::uint64_t step_bytes, std::uint64_t region_bytes)
      : step_bytes_(step_bytes),
        region_bytes_(region_bytes),
        src_(region_bytes),
        dst_(region_bytes) {
    for (std::size_t i = 0; i < src_.size(); ++i) src_[i] = static_cast<char>(i * 131 + 7);
  }

  double run(spill::SpillArena& arena) {
    Stopwatch w;
    std::vector<spill::Region> regions;
    for (std::uint64_t done = 0; done < step_bytes_; done += region_bytes_) {
      regions.push_back(arena.allocate(region_bytes_));
      regions.back().write(src_.data(), region_bytes_);
    }
    for (const spill::Region& r : regions) spill::detail::drop_cached_pages(r);
    for (spill::Region& r : regions) {
      r.read_ahead();
      r.read(dst_.data(), region_bytes_);
    }
    regions.clear();
    return w.seconds();
  }

  bool read_back_what_was_written() const {
    return std::memcmp(src_.data(), dst_.data(), region_bytes_) == 0;
  }

 private:
  std::uint64_t step_bytes_, region_bytes_;
  std::vector<char> src_, dst_;
};

// Note [A control pair for the grown arena]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Two disk arenas made alike and stepped in rotation came out 0.92-1.02x of each other per
// repetition on the 2-core test VM (docs/benchmarks.md, "Growing the arena"): as far apart as the
// 2 % a grown arena may cost. So a second arena sized right from the start steps in the same
// rotation, and control_ratio (that arena / the first) says how far apart two arenas that cannot
// differ come out: ratio means something only next to it.
void grown_vs_sized(benchmark::State& state, std::uint64_t start_bytes, std::uint64_t region_bytes,
                    spill::IoMode io) {
  const std::uint64_t step_bytes = static_cast<std::uint64_t>(state.range(0)) * kMiB;
  Step step(step_bytes, region_bytes);
  spill::SpillArena grown = disk_arena(start_bytes, io);
  overflow(grown, step_bytes, region_bytes);
  try {
    step.run(grown);  // the grow step: not counted
  } catch (const spill::ArenaExhaustedError&) {
    // The grow was refused (no space): grows stays 0 and grow_note says why, below.
  }
  const spill::ArenaStats g = grown.stats();
  // A tiny arena may grow twice: once mid-step, when every input so far overflowed (no region
  // live), and once after the step.
  if (g.grows == 0) return state.SkipWithError(("no grow: " + g.grow_note).c_str());
  spill::SpillArena sized = disk_arena(g.capacity_bytes, io);
  spill::SpillArena control = disk_arena(g.capacity_bytes, io);
  // Their first writes into preallocated blocks, as the grow step was for the grown arena.
  step.run(sized);
  step.run(control);
  spill::SpillArena* arenas[] = {&grown, &sized, &control};
  std::vector<double> ratio, control_ratio, seconds[3];
  std::size_t rotation = 0;
  for (auto _ : state) {
    double t[3];
    for (std::size_t k = 0; k < 3; ++k) {  // each goes first in a third of the iterations
      const std::size_t i = (k + rotation) % 3;
      t[i] = step.run(*arenas[i]);
      seconds[i].push_back(t[i]);
    }
    rotation = (rotation + 1) % 3;
    ratio.push_back(t[0] / t[1]);
    control_ratio.push_back(t[2] / t[1]);
  }
  if (!step.read_back_what_was_written()) state.SkipWithError("a region read back differently");
  state.counters["ratio"] = median(ratio);
  state.counters["control_ratio"] = median(control_ratio);
  state.counters["grown_step_ms"] = mean(seconds[0]) * 1e3;
  state.counters["sized_step_ms"] = mean(seconds[1]) * 1e3;
  state.counters["control_step_ms"] = mean(seconds[2]) * 1e3;
  state.counters["capacity_bytes"] = static_cast<double>(g.capacity_bytes);
  const double steps = static_cast<double>(std::max<std::size_t>(1, ratio.size()));
  state.counters["grown_staging_bytes"] = static_cast<double>(grown.stats().staging_bytes);
  state.counters["sized_staging_bytes"] = static_cast<double>(sized.stats().staging_bytes);
  // Writes that found every slot busy, per step (direct mode; 0 in buffered mode). The grow step
  // and the sized arenas' first steps are outside the loop, but in the totals: subtracted.
  const double grown_waits = static_cast<double>(grown.stats().staging_waits - g.staging_waits);
  state.counters["grown_staging_waits_per_step"] = grown_waits / steps;
  state.counters["sized_staging_waits_per_step"] =
      static_cast<double>(sized.stats().staging_waits) / (steps + 1);
}

// ---------------------------------------------------------------------------------------------

// Issue 37's second reproduction, as a figure: a graph kept alive for the whole run (a traceback
// in a notebook) holds `layers` inputs, of which all but the first two overflowed; `steps` steps
// store and free `layers` inputs each while it lives, so the arena never empties; then the graph
// dies and the next step grows the file. Counters: capacity_bytes (the file then), peak_live_bytes
// (the most bytes live at once — regions plus overflowed inputs still held — counted here, page
// rounded, independently of the arena's own figure), file_over_peak (goal <= growth_margin),
// growth_margin, capacity_needed_bytes (the arena's figure).
void kept_graph(benchmark::State& state) {
  const int steps = static_cast<int>(state.range(0));
  constexpr int kLayers = 8;
  constexpr std::uint64_t kInput = 64 * 1024;  // whole pages: rounding cannot blur the figure
  spill::ArenaStats s;
  std::uint64_t peak_live = 0;
  for (auto _ : state) {
    spill::SpillArena arena = disk_arena(2 * kInput);
    std::uint64_t live = 0;
    auto store = [&](std::vector<spill::Region>* held) {
      held->push_back(arena.try_allocate(kInput));
      live += kInput;
      peak_live = std::max(peak_live, live);
    };
    std::vector<spill::Region> kept;
    for (int i = 0; i < kLayers; ++i) store(&kept);
    for (int step = 0; step < steps; ++step) {
      std::vector<spill::Region> inputs;
      for (int i = 0; i < kLayers; ++i) store(&inputs);
      while (!inputs.empty()) {  // backward frees them, last first
        inputs.pop_back();
        live -= kInput;
      }
    }
    kept.clear();
    live -= kLayers * kInput;
    std::vector<spill::Region> inputs;
    for (int i = 0; i < kLayers; ++i) store(&inputs);  // the first step of an empty arena
    s = arena.stats();
  }
  if (s.grows != 1) return state.SkipWithError(("no single grow: " + s.grow_note).c_str());
  state.counters["capacity_bytes"] = static_cast<double>(s.capacity_bytes);
  state.counters["peak_live_bytes"] = static_cast<double>(peak_live);
  state.counters["file_over_peak"] =
      static_cast<double>(s.capacity_bytes) / static_cast<double>(peak_live);
  state.counters["growth_margin"] = spill::ArenaOptions{}.growth_margin;
  state.counters["capacity_needed_bytes"] = static_cast<double>(s.capacity_needed_bytes);
}

}  // namespace

void register_growth_benchmarks() {
  const bool small = smoke();
  auto* grow = benchmark::RegisterBenchmark("BM_Growth/grow", grow_once);
  grow->Args(small ? std::vector<int64_t>{1, 4} : std::vector<int64_t>{64, 1024})
      ->Iterations(small ? 1 : 8)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  const std::uint64_t start = small ? kMiB : 64 * kMiB;
  const std::uint64_t region = small ? kMiB : 16 * kMiB;
  auto* pair = benchmark::RegisterBenchmark(
      "BM_Growth/grown_vs_sized", [start, region](benchmark::State& s) {
        grown_vs_sized(s, start, region, spill::IoMode::buffered);
      });
  pair->Arg(small ? 4 : 256)->Unit(benchmark::kMillisecond)->UseRealTime();
  if (!small) pair->MinTime(20.0);  // the disk is noisy: many rotations
  // From three pages, as an automatic arena starts where the disk had no room at first: the
  // staging pool must grow with it (Note [The staging pool follows the arena]).
  auto* direct = benchmark::RegisterBenchmark(
      "BM_Growth/grown_vs_sized_direct", [region](benchmark::State& s) {
        grown_vs_sized(s, 3 * spill::page_size_bytes(), region, spill::IoMode::direct);
      });
  direct->Arg(small ? 4 : 128)->Unit(benchmark::kMillisecond)->UseRealTime();
  if (!small) direct->MinTime(20.0);
  benchmark::RegisterBenchmark("BM_Growth/kept_graph", kept_graph)
      ->Arg(small ? 10 : 1000)
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
}

}  // namespace spill_bench
