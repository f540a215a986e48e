// HashPipeline (src/core/hash_pipeline.h): every unit hashed once, never before its bytes are
// copied, some on the pipeline's thread; a copy that stops early; a second run while one holds
// the pipeline goes alone; and the arena's synchronous paths of many chunks on both backings
// (a file's write and read_in_place go through the pipeline; host memory's write and both
// backings' resident reads copy and hash in one pass instead), changed bytes still caught. See
// Note [Hashing beside the copy].
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/hash_pipeline.h"
#include "core/integrity.h"
#include "core/platform.h"
#include "spill/core.h"
#include "test_support.h"

using spill::detail::hash_bytes;
using spill::detail::HashPipeline;

namespace {

constexpr std::uint64_t kSlice = 64 << 10;
constexpr std::uint64_t kUnit = 4 * kSlice;

// Where the pipeline runs beside at all: two CPUs, and not turned off from the environment.
bool two_cpus() {
  const char* off = std::getenv("SPILLARENA_HASH_BESIDE");
  if (off != nullptr && std::string(off) == "0") return false;
  return spill::platform::capabilities().cpus >= 2;
}

// Waits up to 10 s for `done()`; false if it never came.
template <class Done>
bool eventually(Done&& done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

// A copy of `units` units of kUnit bytes in kSlice slices, each slice taking `slice_time`; each
// unit's hash records how many bytes were copied when it ran.
struct Transfer {
  explicit Transfer(std::size_t units, std::chrono::microseconds slice_time = {})
      : src(spill_test::pattern(units * kUnit, 11)),
        dst(src.size()),
        hashes(units, 0),
        times_hashed(units),
        copied_when_hashed(units),
        slice_time(slice_time) {
    for (std::size_t i = 0; i < units; ++i) ready.push_back((i + 1) * kUnit);
  }

  // `fail_at`: the copy of the slice starting there fails. `before_slice(done)` runs first.
  template <class BeforeSlice>
  bool run(HashPipeline& pipeline, std::uint64_t fail_at, BeforeSlice&& before_slice) {
    auto copy = [&](std::uint64_t done, std::uint64_t n) {
      before_slice(done);
      if (done == fail_at) return false;
      std::memcpy(dst.data() + done, src.data() + done, n);
      if (slice_time.count() > 0) std::this_thread::sleep_for(slice_time);
      copied.store(done + n);
      return true;
    };
    auto hash = [&](std::size_t i) {
      copied_when_hashed[i] = copied.load();
      hashes[i] = hash_bytes(dst.data() + i * kUnit, kUnit);
      times_hashed[i].fetch_add(1);
    };
    return pipeline.run(src.size(), kSlice, ready, copy, hash);
  }
  bool run(HashPipeline& pipeline, std::uint64_t fail_at = ~0ull) {
    return run(pipeline, fail_at, [](std::uint64_t) {});
  }

  std::vector<unsigned char> src, dst;
  std::vector<std::uint64_t> ready, hashes;
  std::vector<std::atomic<int>> times_hashed;
  std::vector<std::uint64_t> copied_when_hashed;
  std::atomic<std::uint64_t> copied{0};
  std::chrono::microseconds slice_time;
};

}  // namespace

TEST_CASE("hash pipeline: every unit once, after its bytes, with the one-thread hashes") {
  HashPipeline pipeline;
  Transfer t(24, std::chrono::microseconds(200));
  // The copy of the second unit waits (bounded) for the first unit's hash, which only the
  // pipeline's thread can take while the copy runs.
  bool thread_took_one = false;
  const bool beside = t.run(pipeline, ~0ull, [&](std::uint64_t done) {
    if (done == kUnit + kSlice) {
      thread_took_one = eventually([&] { return t.times_hashed[0].load() == 1; });
    }
  });
  CHECK(beside == two_cpus());
  if (!beside) return;
  CHECK(t.dst == t.src);
  for (std::size_t i = 0; i < t.hashes.size(); ++i) {
    CHECK(t.times_hashed[i].load() == 1);
    CHECK(t.copied_when_hashed[i] >= t.ready[i]);
    CHECK(t.hashes[i] == hash_bytes(t.src.data() + i * kUnit, kUnit));
  }
  CHECK(thread_took_one);
  CHECK(pipeline.units_beside() > 0);
}

TEST_CASE("hash pipeline: a copy that fails hashes only the units finished before it") {
  if (!two_cpus()) return;
  HashPipeline pipeline;
  for (std::uint64_t fail_at : {3 * kUnit + kSlice, 3 * kUnit}) {  // inside a unit, at its start
    Transfer t(8, std::chrono::microseconds(200));
    REQUIRE(t.run(pipeline, fail_at));
    for (std::size_t i = 0; i < 8; ++i) CHECK(t.times_hashed[i].load() == (i < 3 ? 1 : 0));
  }
  // A failed slice is not copied: a unit ending right after it is not hashed.
  Transfer t(8, std::chrono::microseconds(200));
  REQUIRE(t.run(pipeline, 4 * kUnit - kSlice));
  for (std::size_t i = 0; i < 8; ++i) CHECK(t.times_hashed[i].load() == (i < 3 ? 1 : 0));
  // The pipeline is usable again: beside (every unit once) or, if the thread got no CPU during
  // the first run, alone (nothing done: the caller's own path).
  Transfer again(8, std::chrono::microseconds(200));
  const bool beside = again.run(pipeline);
  for (std::size_t i = 0; i < 8; ++i) CHECK(again.times_hashed[i].load() == (beside ? 1 : 0));
}

TEST_CASE("hash pipeline: one unit, or a pipeline held by another run, goes alone") {
  HashPipeline pipeline;
  Transfer one(1);
  CHECK_FALSE(one.run(pipeline));
  CHECK(one.times_hashed[0].load() == 0);  // nothing done: the caller's own path
  if (!two_cpus()) return;
  Transfer holder(16);
  std::atomic<bool> second_tried{false};
  bool second_beside = true;
  std::thread other([&] {
    while (holder.copied.load() == 0) std::this_thread::yield();  // the holder is in its run
    Transfer second(4);
    second_beside = second.run(pipeline);
    second_tried = true;
  });
  bool waited = false;  // the holder's copy waits (bounded) until the second run has tried
  CHECK(holder.run(pipeline, ~0ull, [&](std::uint64_t done) {
    if (done == kSlice) waited = eventually([&] { return second_tried.load(); });
  }));
  other.join();
  CHECK(waited);
  CHECK_FALSE(second_beside);
  for (std::size_t i = 0; i < 16; ++i) CHECK(holder.times_hashed[i].load() == 1);
}

TEST_CASE("hash pipeline: many short runs in a row leave nothing behind") {
  HashPipeline pipeline;
  for (int round = 0; round < 200; ++round) {
    Transfer t(3);
    if (!t.run(pipeline)) continue;  // one CPU, or resting after runs the thread missed
    for (std::size_t i = 0; i < 3; ++i) REQUIRE(t.times_hashed[i].load() == 1);
  }
}

TEST_CASE("hash pipeline: an arena's many-chunk write, read and read_in_place verify") {
  spill_test::ScratchDir dir;
  spill::ArenaOptions o = spill_test::options_in(dir.path(), 64 * spill::MiB);
  o.io = spill::IoMode::buffered;
  SUBCASE("host memory") { o.backing = spill::Backing::ram; }
  SUBCASE("a buffered spill file") { o.backing = spill::Backing::disk; }
  INFO("backing: " << spill::to_string(o.backing));
  spill::SpillArena arena(o);
  const std::size_t n = 20 * spill::MiB + 12345;  // six chunks, the last one short
  const auto src = spill_test::pattern(n, 7);
  spill::Region r = arena.allocate(n);
  r.write(src.data(), n);
  std::vector<unsigned char> dst(n);
  r.read(dst.data(), n);
  CHECK(dst == src);
  CHECK(std::memcmp(r.read_in_place(n), src.data(), n) == 0);
  const auto s = arena.stats();
  CHECK(s.bytes_verified >= 2 * n);

  // One byte changed in the fifth chunk: both reads name it, whichever thread checked it.
  const std::uint64_t changed = 17 * spill::MiB + 3;
  static_cast<unsigned char*>(const_cast<void*>(r.read_in_place(n)))[changed] ^= 1;
  for (int path = 0; path < 2; ++path) {
    try {
      if (path == 0) {
        r.read(dst.data(), n);
      } else {
        (void)r.read_in_place(n);
      }
      FAIL("the changed byte was not caught");
    } catch (const spill::IntegrityError& e) {
      CHECK(e.offset_in_region() == 16 * spill::MiB);
      CHECK(e.bytes() == 4 * spill::MiB);
    }
  }
}
