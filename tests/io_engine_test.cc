// The I/O engine: queue backends, asynchronous region I/O, direct I/O, lifetimes, errors.
// Torch-free, so it also runs under ThreadSanitizer (tests/tsan_check.sh).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/arena/arena_internals.h"
#include "core/file/spill_file.h"
#include "core/io/io_engine.h"
#include "core/io/staging_pool.h"
#include "io_test_support.h"
#include "spill/core.h"
#include "test_support.h"

using spill_test::HookScope;
using spill_test::options_in;
using spill_test::pattern;
using spill_test::ScratchDir;
using spill_test::subcase_name;

namespace {

constexpr spill::IoMode kModes[] = {spill::IoMode::buffered, spill::IoMode::direct};

// Small: writes of more than one slot must wait for slots.
constexpr std::uint64_t kStagingBytes = 4 * spill::MiB;

std::vector<spill::IoBackend> backends() {
  return {spill::IoBackend::thread_pool, spill::IoBackend::automatic};
}

// What of bytes [offset, offset + bytes) of the file `fd` the page cache holds (cachestat(2),
// Linux 6.5 and later), or nothing where the kernel cannot tell.
struct CacheState {
  std::uint64_t pages = 0;
  std::uint64_t dirty = 0;
  std::uint64_t writeback = 0;
  std::uint64_t evicted = 0;
  std::uint64_t recently_evicted = 0;
};
std::optional<CacheState> cache_state(int fd, std::uint64_t offset, std::uint64_t bytes) {
#ifdef __linux__
  constexpr long kCachestat = 451;  // the same number on every architecture
  struct {
    std::uint64_t offset, bytes;
  } range{offset, bytes};
  CacheState state;
  if (::syscall(kCachestat, fd, &range, &state, 0) == 0) return state;
#endif
  return std::nullopt;
}

}  // namespace

// Each transfer is waited for, or polled with ready() until it says true and its buffer read
// before any wait(), as the header's example uses it: ready() publishes what it reports. The flag
// is read under the completion's lock, which the I/O thread took after moving the bytes; a read
// of it without that lock is a data race that ThreadSanitizer reports here (tests/tsan_check.sh),
// where a wait() would order it.
TEST_CASE("io engine: asynchronous writes and reads round-trip in every mode and backend") {
  ScratchDir dir;
  for (auto mode : kModes) {
    for (auto backend : backends()) {
      for (bool polled : {false, true}) {
        SUBCASE((subcase_name(mode, backend) + (polled ? ", polled with ready()" : "")).c_str()) {
          spill::SpillArena arena(
              options_in(dir.path(), 64 * spill::MiB, mode, backend, kStagingBytes));
          CHECK(arena.io_mode() == mode);
          auto finish = [polled](const spill::Pending& p) {
            if (!polled) return p.wait();
            while (!p.ready()) std::this_thread::yield();
          };
          for (std::size_t bytes : {std::size_t{1}, std::size_t{4097}, 9 * spill::MiB + 13}) {
            CAPTURE(bytes);
            const auto src = pattern(bytes, static_cast<unsigned>(bytes));
            spill::Region r = arena.allocate(bytes);
            spill::Pending w = r.write_async(src.data(), bytes);
            finish(w);
            std::vector<unsigned char> dst(bytes);
            spill::Pending rd = r.read_async(dst.data(), bytes);
            finish(rd);
            CHECK(dst == src);
            CHECK_NOTHROW(rd.wait());
            CHECK_NOTHROW(w.wait());
          }
          CHECK(arena.stats().bytes_in_use == 0);
        }
      }
    }
  }
}

TEST_CASE("io engine: work beside the caller runs on a queue thread; wait throws its error") {
  ScratchDir dir;
  for (auto backend : backends()) {
    SUBCASE(subcase_name(spill::IoMode::buffered, backend).c_str()) {
      spill::detail::SpillFileOptions f;
      f.directory = dir.path();
      f.capacity_bytes = spill::MiB;
      const auto storage = spill::detail::make_spill_file(f);
      spill::detail::IoEngineOptions options;
      options.backend = backend;
      options.staging_bytes = kStagingBytes;
      spill::detail::IoEngine engine(*storage, options, spill::IoMode::buffered);
      std::thread::id ran_on;
      engine.beside([&ran_on] { ran_on = std::this_thread::get_id(); }).wait();
      CHECK(ran_on != std::thread::id());
      CHECK(ran_on != std::this_thread::get_id());
      const spill::Pending failed = engine.beside([] { throw std::runtime_error("beside"); });
      CHECK_THROWS_WITH_AS(failed.wait(), "beside", std::runtime_error);
      CHECK(failed.ready());
    }
  }
}

TEST_CASE("io engine: stats say which backend and mode run, and why") {
  ScratchDir dir;
  spill::SpillArena pool(options_in(dir.path(), spill::MiB, spill::IoMode::buffered,
                                    spill::IoBackend::thread_pool, kStagingBytes));
  CHECK(pool.stats().io_backend == spill::IoBackend::thread_pool);
  CHECK(pool.stats().io_mode == spill::IoMode::buffered);
  spill::SpillArena automatic(options_in(dir.path(), spill::MiB, spill::IoMode::automatic,
                                         spill::IoBackend::automatic, kStagingBytes));
  const spill::ArenaStats s = automatic.stats();
  CHECK(s.io_backend != spill::IoBackend::automatic);
  CHECK(s.io_mode == spill::IoMode::buffered);  // 1 MiB fits in any machine's memory
  CHECK(s.io_note.find("automatic: buffered") != std::string::npos);
}

TEST_CASE("io engine: direct I/O leaves none of the spilled bytes in the page cache") {
  ScratchDir dir;
  spill::SpillArena arena(options_in(dir.path(), 32 * spill::MiB, spill::IoMode::direct,
                                     spill::IoBackend::automatic, kStagingBytes));
  // From one byte past a page boundary, whatever the allocator gives (ThreadSanitizer's aligns
  // large blocks to pages): an aligned source would skip staging (the case below).
  const std::uint64_t bytes = 16 * spill::MiB;
  const auto buffer = pattern(bytes + 4096, 3);
  const auto address = reinterpret_cast<std::uintptr_t>(buffer.data());
  const unsigned char* src = buffer.data() + (4096 - address % 4096) % 4096 + 1;
  spill::Region r = arena.allocate(bytes);
  r.write_async(src, bytes).wait();
  CHECK_FALSE(spill::detail::resident(r));
  CHECK(arena.stats().staging_bytes == 4 * spill::MiB);
  CHECK(arena.stats().staging_waits > 0);  // 16 MiB through 4 MiB of staging
  std::vector<unsigned char> dst(bytes);
  r.read(dst.data(), dst.size());
  CHECK(std::memcmp(dst.data(), src, bytes) == 0);
  CHECK_FALSE(spill::detail::resident(r));
}

// Note [Writing from an aligned source] in src/core/io/io_engine.cc: a page-aligned source (a host
// pool block) needs no staging slot but for its tail; its integrity hash is taken from the
// source itself, and the read back checks it.
TEST_CASE("io engine: an aligned source is written from where it is, only its tail staged") {
  ScratchDir dir;
  for (auto backend : backends()) {
    SUBCASE(subcase_name(spill::IoMode::direct, backend).c_str()) {
      spill::SpillArena arena(
          options_in(dir.path(), 64 * spill::MiB, spill::IoMode::direct, backend, kStagingBytes));
      REQUIRE(arena.options().verify_integrity);
      const std::uint64_t bytes = 16 * spill::MiB + 100;     // 4 staging slots' worth and a tail
      const std::uint64_t room = (bytes / 4096 + 2) * 4096;  // aligned_alloc: a multiple
      const auto src = pattern(room, 5);
      struct Free {
        void operator()(unsigned char* p) const { std::free(p); }
      };
      std::unique_ptr<unsigned char, Free> aligned(
          static_cast<unsigned char*>(std::aligned_alloc(4096, room)));
      REQUIRE(aligned != nullptr);
      std::memcpy(aligned.get(), src.data(), room);
      for (const std::uint64_t skew : {std::uint64_t{0}, std::uint64_t{1}}) {
        CAPTURE(skew);
        const std::uint64_t waits_before = arena.stats().staging_waits;
        spill::Region r = arena.allocate(bytes);
        r.write_async(aligned.get() + skew, bytes).wait();
        const std::uint64_t waits = arena.stats().staging_waits - waits_before;
        if (skew == 0) {
          CHECK(waits == 0);  // the tail alone took a slot
        } else {
          CHECK(waits > 0);  // 16 MiB copied through 4 MiB of slots
        }
        std::vector<unsigned char> dst(bytes);
        r.read(dst.data(), bytes);  // checks the hashes taken at write time
        CHECK(std::memcmp(dst.data(), src.data() + skew, bytes) == 0);
      }
      CHECK(arena.stats().integrity_failures == 0);
    }
  }
}

TEST_CASE("io engine: a region is not reused while its write is queued") {
  ScratchDir dir;
  HookScope slow([](spill::IoOp) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    return 0;
  });
  for (auto mode : kModes) {
    SUBCASE(subcase_name(mode).c_str()) {
      spill::SpillArena arena(
          options_in(dir.path(), spill::MiB, mode, spill::IoBackend::thread_pool, kStagingBytes));
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
}

// Every write and read belongs to a Region, and a Region waits for its own before its block is
// freed: by the time the arena's last handle goes, no data operation is left to drain. What no
// one waits for are the page-cache hints a synchronous buffered write queues (Note [Bounded page
// cache] in src/core/io/io_engine.cc); only the drain runs them before the spill file closes. With
// a page-cache limit of one region, each write queues the drop of the region before, and a drop
// waits for the region's writeback: once the arena is gone, none of those pages may be dirty.
// The drops must still be queued when the arena goes. The thread pool's are held behind slow
// writes, one per worker; io_uring's hints have one thread of their own, which falls behind the
// writes. Whether a missing drain leaves a drop behind is a race, lost in some rounds only: the
// case runs several.
TEST_CASE("io engine: destroying an arena with work in flight drains it") {
  constexpr std::uint64_t kRegionBytes = 8 * spill::MiB;  // each drop writes back 8 MiB
  constexpr int kWorkers = 4;                             // of the thread pool
  constexpr int kWrites = 12;
  constexpr int kRounds = 2;
  ScratchDir dir;
  for (auto backend : backends()) {
    SUBCASE(subcase_name(backend).c_str()) {
      HookScope slow([backend](spill::IoOp op) {
        if (backend == spill::IoBackend::thread_pool && op == spill::IoOp::write) {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        return 0;
      });
      auto o = options_in(dir.path(), 128 * spill::MiB, spill::IoMode::buffered, backend);
      o.start_writeback_after_write = false;  // a page is then clean only if its drop ran
      o.page_cache_limit_bytes = kRegionBytes;
      const auto src = pattern(kRegionBytes, 5);
      const auto page = pattern(spill::page_size_bytes(), 6);
      for (int round = 0; round < kRounds; ++round) {
        CAPTURE(round);
        int file = -1;
        std::vector<std::uint64_t> dropped;  // offsets of the regions whose drop was queued
        {
          spill::SpillArena arena(o);
          file = spill_test::reopen_spill_file(dir.path());
          REQUIRE(file >= 0);
          std::vector<spill::Region> regions;
          for (int i = 0; i < kWorkers; ++i) {
            regions.push_back(arena.allocate(page.size()));
            regions.back().write_async(page.data(), page.size());
          }
          for (int i = 0; i < kWrites; ++i) {
            regions.push_back(arena.allocate(src.size()));
            regions.back().write(src.data(), src.size());
            if (i + 1 < kWrites) dropped.push_back(regions.back().offset());
          }
        }
        for (std::uint64_t offset : dropped) {
          const std::optional<CacheState> state = cache_state(file, offset, kRegionBytes);
          if (!state) {
            MESSAGE("skipped: this kernel has no cachestat(2) to tell dirty pages");
            break;
          }
          CAPTURE(offset);
          CHECK(state->dirty == 0);
          CHECK(state->writeback == 0);
        }
        ::close(file);
      }
    }
  }
}

TEST_CASE("io engine: a failed write surfaces as a typed error with op, offset, bytes, errno") {
  ScratchDir dir;
  for (auto backend : backends()) {
    for (int injected : {EIO, ENOSPC}) {
      SUBCASE(subcase_name(backend, spill_test::errno_name(injected)).c_str()) {
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
    CHECK(std::string(e.what()).find("check the disk") == std::string::npos);  // not a disk fault
    CHECK(std::string(e.what()).find("ext4, xfs or btrfs") == std::string::npos);
  }
}

TEST_CASE("io engine: many threads writing and reading with random delays lose nothing") {
  ScratchDir dir;
  HookScope jitter(spill_test::random_delays(1, 2000));
  for (auto mode : kModes) {
    for (auto backend : backends()) {
      SUBCASE(subcase_name(mode, backend).c_str()) {
        spill::SpillArena arena(
            options_in(dir.path(), 64 * spill::MiB, mode, backend, kStagingBytes));
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

// Note [The staging pool follows the arena] in src/core/io/io_engine.cc.
TEST_CASE("staging pool: resizes only with every slot free, and keeps its counters") {
  spill::detail::StagingPool pool(2 * 4096, 4096);
  spill::detail::StagingPool::Slot a = pool.acquire();
  spill::detail::StagingPool::Slot b = pool.acquire();
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    pool.release(a.index);
  });
  spill::detail::StagingPool::Slot c = pool.acquire();  // waits for the release: one wait
  releaser.join();
  CHECK(pool.waits() == 1);
  CHECK_FALSE(pool.resize(8 * 4096, 2 * 4096));  // two slots in use: unchanged
  CHECK(pool.budget_bytes() == 2 * 4096);
  pool.release(b.index);
  pool.release(c.index);
  REQUIRE(pool.resize(8 * 4096, 2 * 4096));
  CHECK(pool.budget_bytes() == 8 * 4096);
  CHECK(pool.slot_bytes() == 2 * 4096);
  CHECK(pool.waits() == 1);  // the counters are the pool's, not its memory's
  std::vector<spill::detail::StagingPool::Slot> slots;
  for (int i = 0; i < 4; ++i) slots.push_back(pool.acquire());  // four slots now, no wait
  CHECK(pool.waits() == 1);
  for (auto& s : slots) std::memset(s.data, 0xab, pool.slot_bytes());  // all of them writable
  for (auto& s : slots) pool.release(s.index);
}

// Note [Writeback of what stays] in src/core/io/io_engine.cc: a region written and freed while
// the arena holds less than kWritebackAfterBytes never goes to the disk (its pages stay dirty
// until the kernel's own writeback), while the oldest held region beyond that budget is written
// back. cachestat(2) tells the pages apart.
TEST_CASE("io engine: writeback starts for what stays beyond the budget, not for what was freed") {
  constexpr std::uint64_t kSmall = spill::MiB;
  constexpr std::uint64_t kLarge = 8 * spill::MiB;
  constexpr std::uint64_t kBudget = spill::detail::IoEngine::kWritebackAfterBytes;
  ScratchDir dir;
  for (auto backend : backends()) {
    SUBCASE(subcase_name(backend).c_str()) {
      auto o = options_in(dir.path(), 2 * kBudget + 8 * kLarge, spill::IoMode::buffered, backend);
      const auto small = pattern(kSmall, 3);
      const auto large = pattern(kLarge, 4);
      int file = -1;
      std::uint64_t held_offset = 0, freed_offset = 0;
      // A file of our own, dirtied first: if the kernel's flusher (oldest first) wrote the freed
      // region back meanwhile (other tests writing at the same time), it wrote this back too.
      ScratchDir elsewhere;  // not beside the spill file, which is found by its directory
      const std::string control_path = elsewhere.path() + "/control";
      const int control = ::open(control_path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
      REQUIRE(control >= 0);
      REQUIRE(::pwrite(control, small.data(), kSmall, 0) == static_cast<ssize_t>(kSmall));
      {
        spill::SpillArena arena(o);
        file = spill_test::reopen_spill_file(dir.path());
        REQUIRE(file >= 0);
        spill::Region held = arena.allocate(kSmall);
        held.write(small.data(), kSmall);
        held_offset = held.offset();
        spill::Region freed = arena.allocate(kSmall);
        freed.write(small.data(), kSmall);
        freed_offset = freed.offset();
        spill::Region guard = arena.allocate(kSmall);  // keeps the hole from the 8 MiB regions
        freed.free();                                  // within the budget
        std::vector<spill::Region> more;  // held: beyond the budget, `held` is the oldest
        for (std::uint64_t n = 0; n <= kBudget; n += kLarge) {
          more.push_back(arena.allocate(kLarge));
          more.back().write(large.data(), kLarge);
        }
      }  // the arena drains its queued writebacks
      const std::optional<CacheState> freed = cache_state(file, freed_offset, kSmall);
      if (!freed) {
        MESSAGE("skipped: this kernel has no cachestat(2) to tell dirty pages");
        ::close(file);
        return;
      }
      const std::optional<CacheState> untouched = cache_state(control, 0, kSmall);
      ::close(control);
      ::unlink(control_path.c_str());
      if (untouched && untouched->dirty == kSmall / spill::page_size_bytes()) {
        CHECK(freed->dirty == kSmall / spill::page_size_bytes());  // never written back
      } else {
        MESSAGE("the kernel wrote dirty pages back meanwhile: the freed region's check is moot");
      }
      std::optional<CacheState> held = cache_state(file, held_offset, kSmall);
      for (int i = 0; i < 200 && held && held->dirty + held->writeback > 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // its writeback completes
        held = cache_state(file, held_offset, kSmall);
      }
      REQUIRE(held);
      CHECK(held->dirty == 0);
      ::close(file);
    }
  }
}
