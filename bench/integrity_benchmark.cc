// BM_Integrity/<MiB>: what ArenaOptions::verify_integrity costs. Two RAM arenas, one
// hashing and one not, each write a region of <MiB> and read it back, alternating within every
// iteration (the same bytes, the same cache state). Counters: ratio = time with hashing / time
// without; hash_Bps = bytes hashed (written and verified) / extra time, the rate behind the
// "~20 GB/s per core" of ArenaOptions::verify_integrity's comment.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "bench_common.h"
#include "spill/spill.h"

namespace spill_bench {
namespace {

spill::SpillArena ram_arena(std::uint64_t bytes, bool verify) {
  spill::ArenaOptions o;
  o.capacity_bytes = bytes;
  o.backing = spill::Backing::ram;
  o.verify_integrity = verify;
  return spill::SpillArena(o);
}

double round_trip_seconds(spill::Region& region, const std::vector<char>& src,
                          std::vector<char>& dst) {
  Stopwatch w;
  region.write(src.data(), src.size());
  region.read(dst.data(), dst.size());
  return w.seconds();
}

void integrity(benchmark::State& state) {
  const std::uint64_t bytes = static_cast<std::uint64_t>(state.range(0)) * spill::MiB;
  spill::SpillArena hashed = ram_arena(bytes, true);
  spill::SpillArena plain = ram_arena(bytes, false);
  spill::Region with = hashed.allocate(bytes);
  spill::Region without = plain.allocate(bytes);
  std::vector<char> src(bytes, 7), dst(bytes);
  round_trip_seconds(with, src, dst);  // warm-up: pages of both mappings and buffers touched
  round_trip_seconds(without, src, dst);
  const std::uint64_t hashed_before = hashed.stats().bytes_hashed;
  double on = 0, off = 0;
  for (auto _ : state) {
    on += round_trip_seconds(with, src, dst);
    off += round_trip_seconds(without, src, dst);
  }
  if (std::memcmp(src.data(), dst.data(), bytes) != 0) state.SkipWithError("bytes differ");
  state.counters["ratio"] = on / off;
  const double hashed_bytes = static_cast<double>(hashed.stats().bytes_hashed - hashed_before);
  if (on > off) state.counters["hash_Bps"] = hashed_bytes / (on - off);
  state.SetBytesProcessed(static_cast<int64_t>(4 * bytes * state.iterations()));
}

}  // namespace

void register_integrity_benchmarks() {
  auto* b = benchmark::RegisterBenchmark("BM_Integrity", integrity);
  if (smoke()) {
    b->Arg(1);
  } else {
    b->Arg(16)->Arg(256);
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace spill_bench
