// BM_IoBackend/<mode>/<regions>/<MiB>: the two I/O backends on the same work (Note [The I/O
// queue] in src/core/io/io_queue.cc). Two disk arenas in the default spill directory, one on
// io_uring and one on the thread pool, take turns (the order rotated each iteration, Note
// [Paired steps] in training_step_benchmark.cc) at the spill's traffic: <regions> regions of
// <MiB> queued with write_async all at once, waited for, out of the page cache (direct: never
// in it; buffered: written back and dropped), then read back with read_async all at once and
// freed. Counters: uring_ms and pool_ms (mean round), ratio (median of io_uring ÷ thread pool per
// iteration: below 1, io_uring is faster), control_ratio (a second thread-pool arena ÷ the
// first: the noise floor). Skipped, saying why, where io_uring cannot be set up.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "bench_common.h"
#include "core/arena/arena_internals.h"
#include "spill/spill.h"

namespace spill_bench {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

spill::SpillArena backend_arena(spill::IoBackend backend, spill::IoMode io,
                                std::uint64_t capacity_bytes) {
  spill::ArenaOptions o;
  o.directory = spill_dir();
  o.capacity_bytes = capacity_bytes;
  o.io = io;
  o.io_backend = backend;
  o.staging_bytes = 64 * kMiB;
  o.verify_integrity = false;  // the backends, not the hashing
  o.grow = false;
  return spill::SpillArena(o);
}

class PageAligned {
 public:
  explicit PageAligned(std::uint64_t bytes)
      : data_(static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096))) {}
  ~PageAligned() { std::free(data_); }
  PageAligned(const PageAligned&) = delete;
  PageAligned& operator=(const PageAligned&) = delete;
  char* data() const { return data_; }

 private:
  char* data_;
};

// One round of the spill's traffic; its wall time in seconds.
double round_trip(spill::SpillArena& arena, int regions, std::uint64_t bytes,
                  const PageAligned& src, const PageAligned& dst) {
  Stopwatch w;
  std::vector<spill::Region> held;
  std::vector<spill::Pending> pending;
  for (int i = 0; i < regions; ++i) {
    held.push_back(arena.allocate(bytes));
    pending.push_back(held.back().write_async(src.data() + i * bytes, bytes));
  }
  for (auto& p : pending) p.wait();
  pending.clear();
  if (arena.io_mode() == spill::IoMode::buffered) {
    for (auto& r : held) spill::detail::drop_cached_pages(r);
  }
  for (int i = 0; i < regions; ++i) {
    pending.push_back(held[i].read_async(dst.data() + i * bytes, bytes));
  }
  for (auto& p : pending) p.wait();
  return w.seconds();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

void io_backends(benchmark::State& state, spill::IoMode io) {
  const int regions = static_cast<int>(state.range(0));
  const std::uint64_t bytes = static_cast<std::uint64_t>(state.range(1)) * kMiB;
  const std::uint64_t capacity = static_cast<std::uint64_t>(regions) * bytes;
  spill::SpillArena uring = backend_arena(spill::IoBackend::io_uring, io, capacity);
  if (uring.stats().io_backend != spill::IoBackend::io_uring) {
    state.SkipWithError(("io_uring unavailable: " + uring.stats().io_note).c_str());
    return;
  }
  spill::SpillArena pool = backend_arena(spill::IoBackend::thread_pool, io, capacity);
  spill::SpillArena control = backend_arena(spill::IoBackend::thread_pool, io, capacity);
  std::vector<spill::SpillArena*> order = {&uring, &pool, &control};
  // Page-aligned, so direct mode reads and writes in place, as from the stash's host pool.
  PageAligned src(capacity), dst(capacity);
  std::memset(src.data(), 1, capacity);
  std::memset(dst.data(), 0, capacity);
  std::vector<double> uring_s, pool_s, ratio, control_ratio;
  for (auto _ : state) {
    double t[3] = {0, 0, 0};
    for (spill::SpillArena* arena : order) {
      const auto index = static_cast<std::size_t>(arena == &uring ? 0 : arena == &pool ? 1 : 2);
      t[index] = round_trip(*arena, regions, bytes, src, dst);
    }
    std::rotate(order.begin(), order.begin() + 1, order.end());
    state.SetIterationTime(t[0] + t[1] + t[2]);
    uring_s.push_back(t[0]);
    pool_s.push_back(t[1]);
    ratio.push_back(t[0] / t[1]);
    control_ratio.push_back(t[2] / t[1]);
  }
  state.counters["uring_ms"] = 1000 * mean(uring_s);
  state.counters["pool_ms"] = 1000 * mean(pool_s);
  state.counters["ratio"] = median(ratio);
  state.counters["control_ratio"] = median(control_ratio);
  state.SetBytesProcessed(static_cast<int64_t>(6 * capacity * state.iterations()));
}

}  // namespace

void register_io_backend_benchmarks() {
  const bool small = smoke();
  for (const auto& [name, io] :
       {std::pair<const char*, spill::IoMode>{"direct", spill::IoMode::direct},
        {"buffered", spill::IoMode::buffered}}) {
    auto* b = benchmark::RegisterBenchmark(
        (std::string("BM_IoBackend/") + name).c_str(),
        [io = io](benchmark::State& state) { io_backends(state, io); });
    if (small) {
      b->Args({2, 1})->Iterations(1);
    } else {
      b->Args({16, 16})->Args({64, 1})->Iterations(6);
    }
    b->UseManualTime()->Unit(benchmark::kMillisecond);
  }
}

}  // namespace spill_bench
