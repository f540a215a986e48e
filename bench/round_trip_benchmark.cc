// BM_RoundTrip/<method>/<MiB>: spill one tensor and read it back.
//   arena          the disk SpillArena through the checkpoint wrapper's stash (store + restore;
//                  the restore copies out of the mapping, see Note [Restoring from the mapping] in
//                  src/torch_layer/arena_stash.cc)
//   arena_evicted  the disk arena, its pages dropped from the page cache before the read
//   arena_ram      the RAM arena through the same stash
//   arena_vs_unhashed, arena_ram_vs_unhashed
//                  the round trip of arena (arena_ram) through two arenas, one with
//                  verify_integrity and one without, alternating in every iteration as
//                  BM_Integrity does; counters ratio = hashed ÷ unhashed round-trip throughput
//                  (1 = free; the goal is ≥ 0.9), median_ratio = the median of that ratio per
//                  iteration (steadier on a busy machine), hashed_Bps and unhashed_Bps = bytes
//                  stored + restored per second
//   arena_direct   the disk arena with IoMode::direct: staged O_DIRECT write, O_DIRECT read into
//                  an aligned buffer; counter page_cache_bytes = the region's bytes still in the
//                  page cache afterwards (mincore), which direct I/O keeps at 0
//   per_file       torch::save to a new file, torch::load, delete (the approach replaced)
//   memcpy         copy into a resident buffer and back: the RAM limit
//   direct_io      O_DIRECT pwrite/pread, 4 MiB aligned blocks, 4 in flight: the disk limit
// Counters: write_Bps and read_Bps (each phase timed alone; the read phase ends with every page
// of the result touched); bytes_per_second is the round trip.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "core/arena/arena_internals.h"
#include "direct_io.h"
#include "spill/spill.h"

namespace spill_bench {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

struct PhaseTimes {
  double write_s = 0;
  double read_s = 0;
};

void report(benchmark::State& state, std::uint64_t bytes, const PhaseTimes& t) {
  const double total = static_cast<double>(bytes) * static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<int64_t>(2 * bytes * state.iterations()));
  state.counters["write_Bps"] = benchmark::Counter(total / t.write_s);
  state.counters["read_Bps"] = benchmark::Counter(total / t.read_s);
}

torch::Tensor payload(std::uint64_t bytes) {
  return torch::rand({static_cast<int64_t>(bytes / sizeof(float))});
}

// Reads one byte of every page, so every method's read phase ends with the bytes resident and
// mapped in this process: the zero-copy arena restore pays its page faults here, exactly as a
// recomputation reading the tensor would.
void touch_pages(const void* data, std::uint64_t bytes) {
  const volatile unsigned char* p = static_cast<const volatile unsigned char*>(data);
  unsigned sum = 0;
  const std::uint64_t page = spill::page_size_bytes();
  for (std::uint64_t i = 0; i < bytes; i += page) sum += p[i];
  benchmark::DoNotOptimize(sum);
}

void check_equal(benchmark::State& state, const torch::Tensor& a, const torch::Tensor& b) {
  if (!torch::equal(a, b)) state.SkipWithError("round trip returned different bytes");
}

// ---------------------------------------------------------------------------------------------

// Store + restore through a stash, exactly as spill::checkpoint uses it.
void time_stash_round_trip(benchmark::State& state, spill::TensorStash& stash) {
  const std::uint64_t bytes = static_cast<std::uint64_t>(state.range(0)) * kMiB;
  const torch::Tensor src = payload(bytes);
  torch::Tensor back;
  PhaseTimes t;
  for (auto _ : state) {
    back = torch::Tensor();  // as in training: a restored input dies before the next store
    Stopwatch w;
    auto stored = stash.store(src);
    t.write_s += w.seconds();
    Stopwatch r;
    back = stored->restore();
    touch_pages(back.data_ptr(), bytes);
    t.read_s += r.seconds();
  }
  check_equal(state, src, back);
  report(state, bytes, t);
}

// A buffered arena of one region of `bytes`, reused by every iteration.
spill::SpillArena stash_arena(std::uint64_t bytes, spill::Backing backing, bool verify_integrity) {
  spill::ArenaOptions o;
  o.capacity_bytes = bytes;
  o.backing = backing;
  o.directory = backing == spill::Backing::disk ? spill_dir() : "";
  o.io = spill::IoMode::buffered;
  o.verify_integrity = verify_integrity;
  return spill::SpillArena(o);
}

spill::StashOptions round_trip_stash_options() {
  spill::StashOptions s;
  s.asynchronous = false;  // a round trip waits for both halves anyway
  s.keep_last = 0;         // every store goes to the arena
  return s;
}

void round_trip_stash(benchmark::State& state, spill::Backing backing) {
  const std::uint64_t bytes = static_cast<std::uint64_t>(state.range(0)) * kMiB;
  spill::SpillArena arena = stash_arena(bytes, backing, true);
  time_stash_round_trip(state, *spill::make_arena_stash(arena, round_trip_stash_options()));
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

// The unhashed twin of round_trip_stash, measured in the same loop (see the file's comment).
void round_trip_vs_unhashed(benchmark::State& state, spill::Backing backing) {
  const std::uint64_t bytes = static_cast<std::uint64_t>(state.range(0)) * kMiB;
  spill::SpillArena hashed = stash_arena(bytes, backing, true);
  spill::SpillArena plain = stash_arena(bytes, backing, false);
  const auto with = spill::make_arena_stash(hashed, round_trip_stash_options());
  const auto without = spill::make_arena_stash(plain, round_trip_stash_options());
  const torch::Tensor src = payload(bytes);
  torch::Tensor back;
  const auto round_trip = [&](spill::TensorStash& stash) {
    back = torch::Tensor();  // as in training: a restored input dies before the next store
    Stopwatch w;
    back = stash.store(src)->restore();
    touch_pages(back.data_ptr(), bytes);
    return w.seconds();
  };
  round_trip(*with);  // warm-up: both files' pages and the restore buffers touched
  round_trip(*without);
  std::vector<double> on, off, ratios;
  for (auto _ : state) {
    on.push_back(round_trip(*with));
    off.push_back(round_trip(*without));
    ratios.push_back(off.back() / on.back());
  }
  check_equal(state, src, back);
  const double on_s = std::accumulate(on.begin(), on.end(), 0.0);
  const double off_s = std::accumulate(off.begin(), off.end(), 0.0);
  const double moved = 2.0 * static_cast<double>(bytes) * static_cast<double>(on.size());
  state.counters["ratio"] = off_s / on_s;
  state.counters["median_ratio"] = median(ratios);
  state.counters["hashed_Bps"] = moved / on_s;
  state.counters["unhashed_Bps"] = moved / off_s;
}

// A disk arena of exactly `bytes` in the spill directory, with the given I/O mode.
spill::SpillArena disk_arena(std::uint64_t bytes, spill::IoMode io) {
  spill::ArenaOptions o;
  o.capacity_bytes = bytes;
  o.directory = spill_dir();
  o.io = io;
  return spill::SpillArena(o);
}

void round_trip_arena_evicted(benchmark::State& state) {
  const std::uint64_t bytes = static_cast<std::uint64_t>(state.range(0)) * kMiB;
  spill::SpillArena arena = disk_arena(bytes, spill::IoMode::buffered);
  const torch::Tensor src = payload(bytes);
  torch::Tensor back = torch::empty_like(src);
  PhaseTimes t;
  for (auto _ : state) {
    spill::Region region = arena.allocate(bytes);
    Stopwatch w;
    region.write(src.data_ptr(), bytes);
    t.write_s += w.seconds();
    state.PauseTiming();
    // Written back and out of the cache: the read hits the disk.
    spill::detail::drop_cached_pages(region);
    state.ResumeTiming();
    Stopwatch r;
    region.read_ahead();
    region.read(back.data_ptr(), bytes);
    touch_pages(back.data_ptr(), bytes);
    t.read_s += r.seconds();
  }
  check_equal(state, src, back);
  report(state, bytes, t);
}

void round_trip_arena_direct(benchmark::State& state) {
  const std::uint64_t bytes = static_cast<std::uint64_t>(state.range(0)) * kMiB;
  spill::SpillArena arena = disk_arena(bytes, spill::IoMode::direct);
  const torch::Tensor src = payload(bytes);
  torch::Tensor raw =
      torch::empty({static_cast<int64_t>(bytes + arena.io_alignment())}, torch::kUInt8);
  const auto pad = (arena.io_alignment() -
                    reinterpret_cast<std::uintptr_t>(raw.data_ptr()) % arena.io_alignment()) %
                   arena.io_alignment();
  char* back = static_cast<char*>(raw.data_ptr()) + pad;  // aligned: no staging on the read
  PhaseTimes t;
  std::uint64_t cached = 0;
  for (auto _ : state) {
    spill::Region region = arena.allocate(bytes);
    Stopwatch w;
    region.write(src.data_ptr(), bytes);
    t.write_s += w.seconds();
    Stopwatch r;
    region.read(back, bytes);
    touch_pages(back, bytes);
    t.read_s += r.seconds();
    cached = std::max(cached, spill::detail::resident_bytes(region));
  }
  if (std::memcmp(src.data_ptr(), back, bytes) != 0) state.SkipWithError("direct arena mismatch");
  report(state, bytes, t);
  state.counters["page_cache_bytes"] = static_cast<double>(cached);
  state.counters["staging_waits"] = static_cast<double>(arena.stats().staging_waits);
}

void round_trip_per_file(benchmark::State& state) {
  time_stash_round_trip(state, *spill::make_per_file_stash(spill_dir()));
}

void round_trip_memcpy(benchmark::State& state) {
  const std::uint64_t bytes = static_cast<std::uint64_t>(state.range(0)) * kMiB;
  const torch::Tensor src = payload(bytes);
  std::vector<char> buffer(bytes, 1);  // resident
  torch::Tensor back = torch::empty_like(src);
  PhaseTimes t;
  for (auto _ : state) {
    Stopwatch w;
    std::memcpy(buffer.data(), src.data_ptr(), bytes);
    t.write_s += w.seconds();
    Stopwatch r;
    std::memcpy(back.data_ptr(), buffer.data(), bytes);
    touch_pages(back.data_ptr(), bytes);
    t.read_s += r.seconds();
    benchmark::ClobberMemory();
  }
  check_equal(state, src, back);
  report(state, bytes, t);
}

// ---------------------------------------------------------------------------------------------
// O_DIRECT: the disk's own limit
// ---------------------------------------------------------------------------------------------

void round_trip_direct_io(benchmark::State& state) {
  const std::uint64_t bytes = static_cast<std::uint64_t>(state.range(0)) * kMiB;
  DirectFile file(spill_dir(), bytes);
  if (!file.ok()) {
    state.SkipWithError("O_DIRECT is not supported in the spill directory");
    return;
  }
  const int fd = file.fd();
  AlignedBuffer src(bytes), back(bytes);
  std::memset(src.data(), 7, bytes);
  PhaseTimes t;
  for (auto _ : state) {
    Stopwatch w;
    int e = direct_transfer(fd, src.data(), bytes, true);
    t.write_s += w.seconds();
    Stopwatch r;
    e = e != 0 ? e : direct_transfer(fd, back.data(), bytes, false);
    touch_pages(back.data(), bytes);
    t.read_s += r.seconds();
    if (e != 0) {
      state.SkipWithError(std::strerror(e));
      break;
    }
  }
  if (std::memcmp(src.data(), back.data(), bytes) != 0) state.SkipWithError("direct I/O mismatch");
  report(state, bytes, t);
}

}  // namespace

void register_round_trip_benchmarks() {
  const std::vector<int64_t> sizes =
      smoke() ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 16, 64, 256};
  auto add = [&](const std::string& method, auto fn) {
    for (int64_t mib : sizes) {
      benchmark::RegisterBenchmark(("BM_RoundTrip/" + method).c_str(), fn)
          ->Arg(mib)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  };
  add("arena", [](benchmark::State& s) { round_trip_stash(s, spill::Backing::disk); });
  add("arena_evicted", round_trip_arena_evicted);
  add("arena_ram", [](benchmark::State& s) { round_trip_stash(s, spill::Backing::ram); });
  add("arena_vs_unhashed",
      [](benchmark::State& s) { round_trip_vs_unhashed(s, spill::Backing::disk); });
  add("arena_ram_vs_unhashed",
      [](benchmark::State& s) { round_trip_vs_unhashed(s, spill::Backing::ram); });
  add("arena_direct", round_trip_arena_direct);
  add("per_file", round_trip_per_file);
  add("memcpy", round_trip_memcpy);
  add("direct_io", round_trip_direct_io);
}

}  // namespace spill_bench
