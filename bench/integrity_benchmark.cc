// BM_Integrity/<path>/<MiB>: what ArenaOptions::verify_integrity costs on resident data. Two
// arenas, one hashing and one not, each write a region of <MiB> and read it back, alternating
// within every iteration (the same bytes, the same cache state). Paths:
//   ram       a RAM arena: Region::write + Region::read (two memcpys)
//   copy      a buffered disk arena: Region::write (pwrite) + Region::read (resident pages,
//             copied from the mapping: the stash's restore on a buffered disk arena)
//   stash     a buffered disk arena as the stash uses it: write_async + wait, Region::read of
//             the resident pages, and a full read of the copy (store + restore + recomputation)
//   direct    a direct (O_DIRECT) disk arena: write_async + wait from an unaligned source (each
//             4 MiB copied into a staging slot), read_async + wait; the disk sets the wall time,
//             so cpu_ratio is the figure to read
//   async     a buffered disk arena: write_async + wait, read_async + wait (pool or io_uring)
// The path ids are those of earlier runs (2 was in_place, a zero-copy read since removed), so the
// filters in docs/benchmarks.md still pick the same paths.
// Counters: ratio = hashed ÷ unhashed round-trip throughput (1 = free; the goal is ≥ 0.9);
// median_ratio = the median of that ratio per iteration (steadier while other work takes the
// CPUs now and then); hashed_Bps and unhashed_Bps = bytes written + bytes read per second; hash_Bps
// = bytes hashed (written and verified) ÷ the extra time. See Note [Hashing while the bytes are in
// cache] and Note [Copying and hashing in one pass] in src/core/integrity/integrity.cc.
#include <benchmark/benchmark.h>

#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bench_common.h"
#include "spill/spill.h"

namespace spill_bench {
namespace {

enum class Path { ram = 0, copy = 1, async = 3, stash = 4, direct = 5 };

const char* path_name(Path path) {
  switch (path) {
    case Path::ram:
      return "ram";
    case Path::copy:
      return "copy";
    case Path::async:
      return "async";
    case Path::stash:
      return "stash";
    case Path::direct:
      return "direct";
  }
  return "?";
}

spill::SpillArena arena_for(Path path, std::uint64_t bytes, bool verify) {
  spill::ArenaOptions o;
  o.capacity_bytes = bytes;
  o.backing = path == Path::ram ? spill::Backing::ram : spill::Backing::disk;
  o.directory = path == Path::ram ? "" : spill_dir();
  o.io = path == Path::direct ? spill::IoMode::direct : spill::IoMode::buffered;
  o.verify_integrity = verify;
  return spill::SpillArena(o);
}

// Reads every byte, as a recomputation reads its restored input.
std::uint64_t read_all(const void* data, std::uint64_t bytes) {
  const auto* words = static_cast<const std::uint64_t*>(data);
  std::uint64_t x = 0;
  for (std::uint64_t i = 0; i < bytes / sizeof(std::uint64_t); ++i) x ^= words[i];
  return x;
}

// CPU time of the whole process (the I/O engine's threads included).
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Times {
  double wall = 0;
  double cpu = 0;
  Times& operator+=(const Times& o) {
    wall += o.wall;
    cpu += o.cpu;
    return *this;
  }
};

Times round_trip(Path path, spill::Region& region, const std::vector<char>& src,
                 std::vector<char>& dst) {
  const std::uint64_t bytes = src.size();
  const double cpu = process_cpu_seconds();
  Stopwatch w;
  switch (path) {
    case Path::ram:
    case Path::copy:
      region.write(src.data(), bytes);
      region.read(dst.data(), bytes);
      break;
    case Path::async:
    case Path::direct:
      region.write_async(src.data(), bytes).wait();
      region.read_async(dst.data(), bytes).wait();
      break;
    case Path::stash:
      region.write_async(src.data(), bytes).wait();
      region.read(dst.data(), bytes);
      benchmark::DoNotOptimize(read_all(dst.data(), bytes));
      break;
  }
  return Times{w.seconds(), process_cpu_seconds() - cpu};
}

void integrity(benchmark::State& state) {
  const Path path = static_cast<Path>(state.range(0));
  const std::uint64_t bytes = static_cast<std::uint64_t>(state.range(1)) * spill::MiB;
  spill::SpillArena hashed = arena_for(path, bytes, true);
  spill::SpillArena plain = arena_for(path, bytes, false);
  spill::Region with = hashed.allocate(bytes);
  spill::Region without = plain.allocate(bytes);
  std::vector<char> src(bytes), dst(bytes);
  for (std::uint64_t i = 0; i < bytes; ++i) src[i] = static_cast<char>(i * 131 >> 5);
  if (path == Path::direct && reinterpret_cast<std::uintptr_t>(src.data()) % 4096 == 0) {
    // glibc serves a vector this large from a mapping of its own, 16 bytes past a page start.
    return state.SkipWithError("the source is page-aligned here: direct writes would not stage");
  }
  round_trip(path, with, src, dst);  // warm-up: pages of both files and buffers touched
  round_trip(path, without, src, dst);
  const std::uint64_t hashed_before = hashed.stats().bytes_hashed;
  Times on, off;
  std::vector<double> ratios;
  for (auto _ : state) {
    const Times hashed_once = round_trip(path, with, src, dst);
    const Times unhashed_once = round_trip(path, without, src, dst);
    on += hashed_once;
    off += unhashed_once;
    ratios.push_back(unhashed_once.wall / hashed_once.wall);
  }
  std::sort(ratios.begin(), ratios.end());
  if (std::memcmp(src.data(), dst.data(), bytes) != 0) state.SkipWithError("bytes differ");
  const double moved = 2.0 * static_cast<double>(bytes) * static_cast<double>(state.iterations());
  state.counters["ratio"] = off.wall / on.wall;
  state.counters["median_ratio"] = ratios.empty() ? 0 : ratios[ratios.size() / 2];
  state.counters["cpu_ratio"] = off.cpu / on.cpu;
  state.counters["hashed_Bps"] = moved / on.wall;
  state.counters["unhashed_Bps"] = moved / off.wall;
  const double hashed_bytes = static_cast<double>(hashed.stats().bytes_hashed - hashed_before);
  if (on.wall > off.wall) state.counters["hash_Bps"] = hashed_bytes / (on.wall - off.wall);
  state.SetLabel(path_name(path));
}

}  // namespace

void register_integrity_benchmarks() {
  auto* b = benchmark::RegisterBenchmark("BM_Integrity", integrity);
  b->ArgNames({"path", "MiB"});
  for (Path p : {Path::ram, Path::copy, Path::async, Path::stash, Path::direct}) {
    if (smoke()) {
      b->Args({static_cast<std::int64_t>(p), 1});
      continue;
    }
    for (std::int64_t mib : {16, 64, 256}) b->Args({static_cast<std::int64_t>(p), mib});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace spill_bench
