// The I/O engine: queue backends, asynchronous region I/O, direct I/O, lifetimes, errors.
// Torch-free, so it also runs under ThreadSanitizer (tests/tsan_check.sh).
#include <doctest/doctest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "io_test_support.h"
#include "spill/core.h"
#include "test_support.h"

using spill_test::HookScope;
using spill_test::ScratchDir;

namespace {

spill::ArenaOptions options_in(const std::string& dir, std::uint64_t capacity, spill::IoMode io,
                               spill::IoBackend backend) {
  spill::ArenaOptions o;
  o.directory = dir;
  o.capacity_bytes = capacity;
  o.io = io;
  o.io_backend = backend;
  o.staging_bytes = 4 * spill::MiB;  // small: writes of more than one slot must wait for slots
  return o;
}

std::vector<unsigned char> pattern(std::size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
  return v;
}


std::vector<spill::IoBackend> backends() {
  return {spill::IoBackend::thread_pool, spill::IoBackend::automatic};
}

}  // namespace

TEST_CASE("io engine: asynchronous writes and reads round-trip in every mode and backend") {
  ScratchDir dir;
  for (auto mode : {spill::IoMode::buffered, spill::IoMode::direct}) {
    for (auto backend : backends()) {
      CAPTURE(spill::to_string(mode));
      CAPTURE(spill::to_string(backend));
      spill::SpillArena arena(options_in(dir.path(), 64 * spill::MiB, mode, backend));
      CHECK(arena.io_mode() == mode);
      for (std::size_t bytes : {std::size_t{1}, std::size_t{4097}, 9 * spill::MiB + 13}) {
        const auto src = pattern(bytes, static_cast<unsigned>(bytes));
        spill::Region r = arena.allocate(bytes);
        spill::Pending w = r.write_async(src.data(), bytes);
        w.wait();
        std::vector<unsigned char> dst(bytes);
        r.read_async(dst.data(), bytes).wait();
        CHECK(dst == src);
      }
      CHECK(arena.stats().bytes_in_use == 0);
    }
  }
}

TEST_CASE("io engine: stats say which backend and mode run, and why") {
  ScratchDir dir;
  spill::SpillArena pool(options_in(dir.path(), spill::MiB, spill::IoMode::buffered,
                                    spill::IoBackend::thread_pool));
  CHECK(pool.stats().io_backend == spill::IoBackend::thread_pool);
  CHECK(pool.stats().io_mode == spill::IoMode::buffered);
  spill::SpillArena automatic(options_in(dir.path(), spill::MiB, spill::IoMode::automatic,
                                         spill::IoBackend::automatic));
  const spill::ArenaStats s = automatic.stats();
  CHECK(s.io_backend != spill::IoBackend::automatic);
  CHECK(s.io_mode == spill::IoMode::buffered);  // 1 MiB fits in any machine's memory
  CHECK(s.io_note.find("automatic: buffered") != std::string::npos);
}

TEST_CASE("io engine: direct I/O leaves none of the spilled bytes in the page cache") {
  ScratchDir dir;
  spill::SpillArena arena(options_in(dir.path(), 32 * spill::MiB, spill::IoMode::direct,
                                     spill::IoBackend::automatic));
  const auto src = pattern(16 * spill::MiB, 3);
  spill::Region r = arena.allocate(src.size());
  r.write_async(src.data(), src.size()).wait();
  CHECK_FALSE(r.resident());
  CHECK(arena.stats().staging_bytes == 4 * spill::MiB);
  CHECK(arena.stats().staging_waits > 0);  // 16 MiB through 4 MiB of staging
  std::vector<unsigned char> dst(src.size());
  r.read(dst.data(), dst.size());
  CHECK(dst == src);
  CHECK_FALSE(r.resident());
}

TEST_CASE("io engine: a region is not reused while its write is queued") {
  ScratchDir dir;
  HookScope slow([](spill::IoOp) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    return 0;
  });
  for (auto mode : {spill::IoMode::buffered, spill::IoMode::direct}) {
    spill::SpillArena arena(
        options_in(dir.path(), spill::MiB, mode, spill::IoBackend::thread_pool));
    const auto a = pattern(spill::MiB, 1);
    const auto b = pattern(spill::MiB, 2);
    spill::Pending first;
    {
      spill::Region r = arena.allocate(a.size());
      first = r.write_async(a.data(), a.size());
      CHECK_FALSE(first.ready());
    }  // freeing waits for the write
    CHECK(first.ready());
    spill::Region again = arena.allocate(b.size());  // the same block, now safe to reuse
    again.write(b.data(), b.size());
    CHECK(spill_test::read_back(again, b.size()) == b);
  }
}

TEST_CASE("io engine: destroying an arena with work in flight drains it") {
  ScratchDir dir;
  HookScope slow([](spill::IoOp) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return 0;
  });
  const auto src = pattern(2 * spill::MiB, 5);
  std::vector<spill::Pending> writes;
  {
    spill::SpillArena arena(options_in(dir.path(), 16 * spill::MiB, spill::IoMode::direct,
                                       spill::IoBackend::thread_pool));
    std::vector<spill::Region> regions;
    for (int i = 0; i < 6; ++i) {
      regions.push_back(arena.allocate(src.size()));
      writes.push_back(regions.back().write_async(src.data(), src.size()));
    }
  }
  for (const auto& w : writes) CHECK(w.ready());
}

TEST_CASE("io engine: a failed write surfaces as a typed error with op, offset, bytes, errno") {
  ScratchDir dir;
  for (auto backend : backends()) {
    for (int injected : {EIO, ENOSPC}) {
      CAPTURE(spill::to_string(backend));
      HookScope fail([&](spill::IoOp op) { return op == spill::IoOp::write ? injected : 0; });
      spill::SpillArena arena(
          options_in(dir.path(), 8 * spill::MiB, spill::IoMode::buffered, backend));
      const auto src = pattern(spill::MiB, 9);
      spill::Region r = arena.allocate(src.size());
      spill::Pending w = r.write_async(src.data(), src.size());
      try {
        w.wait();
        FAIL("the injected error was lost");
      } catch (const spill::IoError& e) {
        CHECK(e.error_number() == injected);
        CHECK(e.op() == spill::IoOp::write);
        CHECK(e.offset() == r.offset());
        CHECK(e.bytes() == src.size());
        CHECK(std::string(e.what()).find("write of 1048576 bytes") != std::string::npos);
      }
      // The arena's next submission reports it too: the failure is never lost.
      CHECK_THROWS_AS(r.write_async(src.data(), src.size()), spill::IoError);
    }
  }
}

TEST_CASE("io engine: a real file-size limit (EFBIG) names ulimit, not the file system") {
  ScratchDir dir;
  HookScope too_big([](spill::IoOp op) { return op == spill::IoOp::write ? EFBIG : 0; });
  spill::SpillArena arena(
      options_in(dir.path(), spill::MiB, spill::IoMode::buffered, spill::IoBackend::thread_pool));
  const auto src = pattern(8192, 3);
  spill::Region r = arena.allocate(src.size());
  try {
    r.write_async(src.data(), src.size()).wait();
    FAIL("the injected EFBIG was lost");
  } catch (const spill::IoError& e) {
    CHECK(e.error_number() == EFBIG);
    CHECK(std::string(e.what()).find("ulimit -f") != std::string::npos);
    CHECK(std::string(e.what()).find("file system") == std::string::npos);
  }
}

TEST_CASE("io engine: many threads writing and reading with random delays lose nothing") {
  ScratchDir dir;
  HookScope jitter(spill_test::random_delays(1, 2000));
  for (auto mode : {spill::IoMode::buffered, spill::IoMode::direct}) {
    for (auto backend : backends()) {
      spill::SpillArena arena(options_in(dir.path(), 64 * spill::MiB, mode, backend));
      std::atomic<int> mismatches{0};
      auto worker = [&](unsigned id) {
        for (unsigned i = 0; i < 12; ++i) {
          const auto src = pattern(300 * 1024 + id * spill::page_size_bytes() + i, id * 100 + i);
          spill::Region r = arena.allocate(src.size());
          spill::Pending w = r.write_async(src.data(), src.size());
          w.wait();
          std::vector<unsigned char> dst(src.size());
          r.read_async(dst.data(), dst.size()).wait();
          if (dst != src) ++mismatches;
        }
      };
      std::vector<std::thread> threads;
      for (unsigned t = 0; t < 4; ++t) threads.emplace_back(worker, t);
      for (auto& t : threads) t.join();
      CHECK(mismatches == 0);
      CHECK(arena.stats().live_regions == 0);
    }
  }
}

TEST_CASE("io engine: a staging budget of 0 or above 64 GiB is a typed error naming it") {
  ScratchDir dir;
  for (std::uint64_t staging : {std::uint64_t{0}, spill::kMaxStagingBytes + 1, ~std::uint64_t{0}}) {
    auto o = options_in(dir.path(), spill::MiB, spill::IoMode::direct, spill::IoBackend::automatic);
    o.staging_bytes = staging;
    CHECK_THROWS_WITH_AS(spill::SpillArena{o}, doctest::Contains("staging_bytes"),
                         spill::InvalidArgumentError);
  }
  CHECK(spill_test::list_dir(dir.path()).empty());
}
