// Faults at the platform seam, injected through core/os/fault_injection.h: short counts, EIO,
// ENOSPC and end of file in pwrite/pread and in io_uring pieces, through the synchronous path,
// both queue backends and both I/O modes, and (with LibTorch) through spill::checkpoint. See
// Note [Fault injection at the seam] in src/core/os/fault_injection.cc.
#ifdef SPILLARENA_TEST_WITH_TORCH
#include <torch/torch.h>  // before doctest: c10 defines a CHECK of its own, doctest's must win
#endif
#include <doctest/doctest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/arena/arena_internals.h"
#include "core/os/fault_injection.h"
#include "io_test_support.h"
#include "spill/core.h"
#include "test_support.h"

#ifdef SPILLARENA_TEST_WITH_TORCH
#include "gpt_test_support.h"
#endif

using spill::testing::FaultSite;
using spill_test::Deadline;
using spill_test::FaultScope;
using spill_test::pattern;
using spill_test::ScratchDir;

namespace {

constexpr int kDeadlineSeconds = 60;

struct Setup {
  spill::IoMode mode;
  spill::IoBackend backend;
};

std::string name(const Setup& s) {
  static const std::map<std::pair<spill::IoMode, spill::IoBackend>, std::string> names = {
      {{spill::IoMode::buffered, spill::IoBackend::thread_pool}, "buffered, thread pool"},
      {{spill::IoMode::buffered, spill::IoBackend::io_uring}, "buffered, io_uring"},
      {{spill::IoMode::direct, spill::IoBackend::thread_pool}, "direct, thread pool"},
      {{spill::IoMode::direct, spill::IoBackend::io_uring}, "direct, io_uring"}};
  return names.at({s.mode, s.backend});
}

std::vector<Setup> setups() {
  return {{spill::IoMode::buffered, spill::IoBackend::thread_pool},
          {spill::IoMode::buffered, spill::IoBackend::io_uring},
          {spill::IoMode::direct, spill::IoBackend::thread_pool},
          {spill::IoMode::direct, spill::IoBackend::io_uring}};
}

spill::ArenaOptions setup_options(const std::string& dir, const Setup& s) {
  return spill_test::options_in(dir, 64 * spill::MiB, s.mode, s.backend, 4 * spill::MiB);
}

// The arena of a setup, or nothing (with the reason) where io_uring cannot be set up here.
std::optional<spill::SpillArena> arena_or_skip(const spill::ArenaOptions& o, const Setup& s) {
  try {
    return spill::SpillArena(o);
  } catch (const spill::IoError& e) {
    MESSAGE("skipped (" << name(s) << "): " << e.what());
    return std::nullopt;
  }
}

std::optional<spill::SpillArena> arena_for(const std::string& dir, const Setup& s) {
  return arena_or_skip(setup_options(dir, s), s);
}

using OptionsFor = spill::ArenaOptions (*)(const std::string& dir, const Setup& s);

// Runs `body(setup, arena)` for every setup, each in a subcase of its own with a fresh arena of
// `options(dir, setup)`; setups this machine cannot serve (no io_uring) are skipped with the
// reason.
template <class Body>
void for_each_setup(const std::string& dir, OptionsFor options, Body body) {
  for (const Setup& s : setups()) {
    SUBCASE(name(s).c_str()) {
      if (auto arena = arena_or_skip(options(dir, s), s)) body(s, *arena);
    }
  }
}

// Runs `body(arena, error)` for EIO and ENOSPC in every setup, each in a subcase of its own with
// a fresh arena.
template <class Body>
void for_each_setup_and_error(const std::string& dir, OptionsFor options, Body body) {
  for (int error : {EIO, ENOSPC}) {
    SUBCASE(spill_test::errno_name(error).c_str()) {
      auto with_error = [&](const Setup&, spill::SpillArena& arena) { body(arena, error); };
      for_each_setup(dir, options, with_error);
    }
  }
}

std::uint64_t round_up(std::uint64_t bytes, std::uint64_t unit) {
  return (bytes + unit - 1) / unit * unit;
}

// A destination aligned for direct reads, so they land without staging.
struct AlignedBuffer {
  explicit AlignedBuffer(std::size_t n)
      : bytes(n),
        data(static_cast<unsigned char*>(
            std::aligned_alloc(spill::page_size_bytes(), round_up(n, spill::page_size_bytes())))) {}
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  bool equals(const std::vector<unsigned char>& v) const {
    return v.size() == bytes && std::memcmp(data, v.data(), bytes) == 0;
  }
  std::size_t bytes;
  unsigned char* data;
};

// What the calls of one kind inside a file range were granted: how many, and how many bytes.
struct Granted {
  std::atomic<std::uint64_t> calls{0};
  std::atomic<std::uint64_t> bytes{0};
};

// Wraps `inner`, counting the read and write calls inside [begin, end) of the file.
spill::testing::FaultHook counting(spill::testing::FaultHook inner, std::uint64_t begin,
                                   std::uint64_t end, Granted* writes, Granted* reads) {
  return [=](FaultSite site, std::uint64_t bytes, std::uint64_t offset) {
    const std::int64_t v = inner(site, bytes, offset);
    if (offset >= begin && offset < end && v > 0) {
      Granted* g = spill_test::is_write(site)  ? writes
                   : spill_test::is_read(site) ? reads
                                               : nullptr;
      if (g != nullptr) {
        ++g->calls;
        g->bytes += static_cast<std::uint64_t>(v);
      }
    }
    return v;
  };
}

// Every read and write call of `sites` fails with `error` and moves nothing.
spill::testing::FaultHook failing(bool (*sites)(FaultSite), int error) {
  return [=](FaultSite site, std::uint64_t bytes, std::uint64_t) {
    return sites(site) ? -static_cast<std::int64_t>(error) : static_cast<std::int64_t>(bytes);
  };
}

constexpr const char* kWriteLost = "the injected write error was lost";
constexpr const char* kReadLost = "the injected read error was lost";

// The spill::IoError `fn` throws. A call that throws none fails the test case with `lost`.
template <class Fn>
spill::IoError expect_io_error(Fn&& fn, const char* lost) {
  try {
    fn();
  } catch (const spill::IoError& e) {
    return e;
  }
  FAIL(std::string(lost));         // a const char* would print as an address
  return spill::IoError(0, lost);  // not reached: FAIL ends the test case
}

void check_error(const spill::IoError& e, spill::IoOp op, int error, const spill::Region& r) {
  CHECK(e.error_number() == error);
  CHECK(e.op() == op);
  CHECK(e.offset() >= r.offset());
  CHECK(e.offset() < r.offset() + r.size());
  CHECK(e.bytes() > 0);
  CHECK(e.bytes() <= r.size());
  CHECK(std::string(e.what()).find(std::strerror(error)) != std::string::npos);
}

// A buffered arena on the thread pool: Region::write is the synchronous write_at (pwrite) on the
// calling thread, and Region::read of pages dropped from the cache waits for read_at (pread) on
// a pool thread, one per 4 MiB piece.
constexpr Setup kSynchronous{spill::IoMode::buffered, spill::IoBackend::thread_pool};

// Drops `r`'s pages from the page cache, so that a read of it reaches pread (a buffered read of
// resident pages, Region::read or read_async, copies them from the mapping: no hook sees it).
// Pages still dirty or under writeback (a loaded machine) stay resident: drop until none is left.
void evict(spill::Region& r) {
  for (int tries = 0;
       tries < 100 && (spill::detail::drop_cached_pages(r), spill::detail::resident_bytes(r) > 0);
       ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(spill::detail::resident_bytes(r) == 0);
}

// Writes `src` into `r`, drops its pages from the page cache, and reads them back from the disk.
std::vector<unsigned char> round_trip(spill::Region& r, const std::vector<unsigned char>& src) {
  r.write(src.data(), src.size());
  spill::detail::drop_cached_pages(r);
  std::vector<unsigned char> dst(src.size());
  r.read(dst.data(), dst.size());
  return dst;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Short counts
// ---------------------------------------------------------------------------------------------

TEST_CASE("faults: pwrite and pread moving one byte per call still round-trip (synchronous)") {
  ScratchDir dir;
  Deadline deadline("synchronous short counts", kDeadlineSeconds);
  auto arena = arena_for(dir.path(), kSynchronous);
  REQUIRE(arena);
  const std::uint64_t page = spill::page_size_bytes();
  for (std::uint64_t bytes : {std::uint64_t{1}, page + 1, 3 * page + 5}) {
    CAPTURE(bytes);
    const auto src = pattern(bytes, static_cast<unsigned>(bytes));
    spill::Region r = arena->allocate(bytes);
    Granted writes, reads;
    FaultScope one_byte(counting(spill_test::unit_counts(1), 0, ~0ull, &writes, &reads));
    CHECK(round_trip(r, src) == src);
    CHECK(writes.calls == bytes);  // one pwrite per byte, each byte once
    CHECK(writes.bytes == bytes);
    CHECK(reads.calls == bytes);
    CHECK(reads.bytes == bytes);
  }
  Granted writes, reads;
  FaultScope halves(counting(spill_test::half_counts(1), 0, ~0ull, &writes, &reads));
  const auto big = pattern(spill::MiB + 13, 5);
  spill::Region r = arena->allocate(big.size());
  CHECK(round_trip(r, big) == big);
  CHECK(writes.calls > 10);
  CHECK(writes.bytes == big.size());
  CHECK(reads.bytes == big.size());
}

TEST_CASE("faults: short counts in both backends and modes are completed and round-trip") {
  ScratchDir dir;
  Deadline deadline("queued short counts", kDeadlineSeconds);
  for_each_setup(dir.path(), setup_options, [&](const Setup& s, spill::SpillArena& arena) {
    const std::uint64_t unit = s.mode == spill::IoMode::direct ? arena.io_alignment() : 1;
    for (std::size_t bytes : {std::size_t{1}, spill::page_size_bytes() + 1, 9 * spill::MiB + 13}) {
      CAPTURE(bytes);
      const auto src = pattern(bytes, static_cast<unsigned>(bytes) + 1);
      spill::Region r = arena.allocate(bytes);
      Granted writes, reads;
      auto shape =
          bytes < spill::MiB ? spill_test::unit_counts(unit) : spill_test::half_counts(unit);
      FaultScope faults(counting(shape, r.offset(), r.offset() + r.size(), &writes, &reads));
      r.write_async(src.data(), bytes).wait();
      if (s.mode == spill::IoMode::buffered) evict(r);
      AlignedBuffer dst(bytes);
      r.read_async(dst.data, bytes).wait();
      CHECK(dst.equals(src));
      // Every byte asked for once: the remainder of each short call, and nothing twice.
      const std::uint64_t moved = s.mode == spill::IoMode::direct ? round_up(bytes, unit) : bytes;
      CHECK(writes.bytes == moved);
      CHECK(reads.bytes == moved);
      if (moved > unit) {  // cut short: more calls than the 4 MiB pieces the engine queued
        const std::uint64_t pieces = round_up(moved, 4 * spill::MiB) / (4 * spill::MiB);
        CHECK(writes.calls > pieces);
        CHECK(reads.calls > pieces);
      }
    }
    CHECK(arena.stats().bytes_in_use == 0);
  });
}

TEST_CASE("faults: a buffered read_async of resident pages is copied here, past every read hook") {
  ScratchDir dir;
  Deadline deadline("resident read_async", kDeadlineSeconds);
  for_each_setup(dir.path(), setup_options, [&](const Setup& s, spill::SpillArena& arena) {
    const auto src = pattern(9 * spill::MiB + 13, 8);
    spill::Region r = arena.allocate(src.size());
    r.write_async(src.data(), src.size()).wait();
    Granted writes, reads;
    FaultScope count(counting(spill_test::unit_counts(src.size()), r.offset(),
                              r.offset() + r.size(), &writes, &reads));  // every call whole
    AlignedBuffer dst(src.size());
    // Written pages stay in the cache unless memory is short; then the read is queued.
    const bool copied =
        s.mode == spill::IoMode::buffered && spill::detail::resident_bytes(r) >= src.size();
    spill::Pending p = r.read_async(dst.data, src.size());
    if (copied) CHECK(p.ready());  // nothing queued: read_async made the copy
    p.wait();
    CHECK(dst.equals(src));
    const std::uint64_t queued =
        s.mode == spill::IoMode::direct ? round_up(src.size(), arena.io_alignment()) : src.size();
    CHECK(reads.bytes == (copied ? 0 : queued));
  });
}

TEST_CASE("faults: a call that moves nothing (end of file) is EIO, never an endless loop") {
  ScratchDir dir;
  Deadline deadline("end of file", kDeadlineSeconds);
  auto zero = [](FaultSite site, std::uint64_t bytes, std::uint64_t) -> std::int64_t {
    const bool data = spill_test::is_read(site) || spill_test::is_write(site);
    return data ? 0 : static_cast<std::int64_t>(bytes);
  };
  const auto src = pattern(8192, 3);
  {
    auto arena = arena_for(dir.path(), kSynchronous);
    REQUIRE(arena);
    spill::Region r = arena->allocate(src.size());
    r.write(src.data(), src.size());
    evict(r);
    FaultScope eof(zero);
    std::vector<unsigned char> dst(src.size());
    CHECK_THROWS_WITH_AS(r.write(src.data(), src.size()), doctest::Contains("write of 8192"),
                         spill::IoError);
    CHECK_THROWS_WITH_AS(r.read(dst.data(), dst.size()), doctest::Contains("read of 8192"),
                         spill::IoError);
  }
  for_each_setup(dir.path(), setup_options, [&](const Setup& s, spill::SpillArena& arena) {
    spill::Region r = arena.allocate(src.size());
    r.write_async(src.data(), src.size()).wait();
    if (s.mode == spill::IoMode::buffered) evict(r);
    {
      FaultScope eof(zero);
      AlignedBuffer dst(src.size());
      const auto read = [&] { r.read_async(dst.data, src.size()).wait(); };
      check_error(expect_io_error(read, "an empty read passed"), spill::IoOp::read, EIO, r);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

TEST_CASE("faults: EIO and ENOSPC of the synchronous pwrite and pread are typed IoErrors") {
  ScratchDir dir;
  Deadline deadline("synchronous errors", kDeadlineSeconds);
  auto arena = arena_for(dir.path(), kSynchronous);
  REQUIRE(arena);
  const auto src = pattern(3 * spill::page_size_bytes(), 1);
  for (int error : {EIO, ENOSPC}) {
    SUBCASE(spill_test::errno_name(error).c_str()) {
      // A fresh region: a failed read lasts until its region is freed.
      spill::Region r = arena->allocate(src.size());
      r.write(src.data(), src.size());
      spill::detail::drop_cached_pages(r);
      {
        FaultScope fail(failing(spill_test::is_write, error));
        const spill::IoError e =
            expect_io_error([&] { r.write(src.data(), src.size()); }, kWriteLost);
        CHECK(e.error_number() == error);
        CHECK(e.op() == spill::IoOp::write);
        CHECK(e.offset() == r.offset());
        CHECK(e.bytes() == src.size());
      }
      FaultScope fail(failing(spill_test::is_read, error));
      std::vector<unsigned char> dst(src.size());
      const spill::IoError e = expect_io_error([&] { r.read(dst.data(), dst.size()); }, kReadLost);
      CHECK(e.error_number() == error);
      CHECK(e.op() == spill::IoOp::read);
      CHECK(e.offset() == r.offset());
      CHECK(e.bytes() == src.size());
    }
  }
}

TEST_CASE("faults: EIO and ENOSPC on write surface as IoError in every backend and mode") {
  ScratchDir dir;
  Deadline deadline("write errors", kDeadlineSeconds);
  for_each_setup_and_error(dir.path(), setup_options, [](spill::SpillArena& arena, int error) {
    const auto src = pattern(spill::MiB + 7, 2);
    FaultScope fail(failing(spill_test::is_write, error));
    {
      spill::Region r = arena.allocate(src.size());
      const spill::IoError e =
          expect_io_error([&] { r.write_async(src.data(), src.size()).wait(); }, kWriteLost);
      check_error(e, spill::IoOp::write, error, r);
      // Until r is freed, every write and read of the arena reports its failure: a synchronous
      // read hands out none of the bytes the failed write left.
      std::vector<unsigned char> dst(src.size());
      const spill::IoError later =
          expect_io_error([&] { r.read(dst.data(), dst.size()); }, kWriteLost);
      CHECK(later.offset() == e.offset());
    }  // r freed: its failure is forgotten
    // The synchronous Region::write: pwrite on this thread (buffered) or a queued write that
    // it waits for (direct); either way the errno arrives here, typed, for this region.
    spill::Region again = arena.allocate(src.size());
    const spill::IoError sync =
        expect_io_error([&] { again.write(src.data(), src.size()); }, kWriteLost);
    check_error(sync, spill::IoOp::write, error, again);
  });
}

TEST_CASE("faults: EIO and ENOSPC on read surface as IoError in every backend and mode") {
  ScratchDir dir;
  Deadline deadline("read errors", kDeadlineSeconds);
  for_each_setup_and_error(dir.path(), setup_options, [](spill::SpillArena& arena, int error) {
    const auto src = pattern(spill::MiB + 7, 4);
    spill::Region r = arena.allocate(src.size());
    r.write(src.data(), src.size());
    spill::detail::drop_cached_pages(r);  // buffered reads of resident pages never call pread
    FaultScope fail(failing(spill_test::is_read, error));
    AlignedBuffer dst(src.size());
    const spill::IoError e =
        expect_io_error([&] { r.read_async(dst.data, src.size()).wait(); }, kReadLost);
    check_error(e, spill::IoOp::read, error, r);
  });
}

TEST_CASE("faults: a failed read returns only after every piece of it finished") {
  ScratchDir dir;
  Deadline deadline("pieces of a failed read", kDeadlineSeconds);
  auto arena = arena_for(dir.path(), {spill::IoMode::buffered, spill::IoBackend::thread_pool});
  REQUIRE(arena);
  const auto src = pattern(9 * spill::MiB, 6);  // three pieces: 4 + 4 + 1 MiB
  spill::Region r = arena->allocate(src.size());
  r.write(src.data(), src.size());
  spill::detail::drop_cached_pages(r);
  const std::uint64_t first = r.offset();
  FaultScope slow_tail([first](FaultSite site, std::uint64_t bytes, std::uint64_t offset) {
    if (!spill_test::is_read(site)) return static_cast<std::int64_t>(bytes);
    if (offset == first) return -static_cast<std::int64_t>(EIO);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return static_cast<std::int64_t>(bytes);
  });
  auto dst = std::make_unique<std::vector<unsigned char>>(src.size());
  spill::Pending p = r.read_async(dst->data(), src.size());
  CHECK_THROWS_AS(p.wait(), spill::IoError);
  CHECK(p.ready());  // else the later pieces would still write into *dst, freed below
  dst.reset();
}

// ---------------------------------------------------------------------------------------------
// Recovery
// ---------------------------------------------------------------------------------------------

// Note [A small write is made at once] (src/core/arena/arena_core.cc): a buffered write_async of
// at most a slice is a pwrite on the calling thread. Its Pending is ready when the call returns,
// and its failure is kept as a queued write's is: thrown by wait(), then by every later write and
// read of the arena until the region is freed.
TEST_CASE("faults: a small buffered write_async is made at once; its failure lasts until freed") {
  ScratchDir dir;
  Deadline deadline("small write_async", kDeadlineSeconds);
  for (spill::IoBackend backend : {spill::IoBackend::thread_pool, spill::IoBackend::io_uring}) {
    const Setup s{spill::IoMode::buffered, backend};
    for (std::uint64_t bytes :
         {std::uint64_t{1}, std::uint64_t{4096 + 7}, std::uint64_t{512} << 10}) {
      SUBCASE((name(s) + ", " + std::to_string(bytes) + " bytes").c_str()) {
        std::optional<spill::SpillArena> arena = arena_for(dir.path(), s);
        if (!arena) return;
        const auto src = pattern(bytes, 5);
        std::uint64_t failed_offset = 0;
        {
          spill::Region r = arena->allocate(src.size());
          failed_offset = r.offset();
          spill::Pending written = [&] {
            FaultScope fail(failing(spill_test::is_write, EIO));
            return r.write_async(src.data(), src.size());
          }();  // the fault is gone: only what the write recorded can fail from here on
          CHECK(written.ready());
          check_error(expect_io_error([&] { written.wait(); }, kWriteLost), spill::IoOp::write, EIO,
                      r);
          std::vector<unsigned char> dst(src.size());
          const spill::IoError later = expect_io_error([&] { r.read(dst.data(), dst.size()); },
                                                       kWriteLost);  // never its wrong bytes
          CHECK(later.offset() == failed_offset);
          CHECK_THROWS_AS(arena->allocate(1).write_async(src.data(), 1), spill::IoError);
        }  // freed: the failure with it
        spill::Region again = arena->allocate(src.size());
        spill::Pending written = again.write_async(src.data(), src.size());
        CHECK(written.ready());
        written.wait();
        std::vector<unsigned char> dst(src.size());
        again.read(dst.data(), dst.size());
        CHECK(dst == src);
        CHECK(arena->stats().integrity_failures == 0);
        CHECK(arena->stats().bytes_verified == src.size());
      }
    }
  }
}

TEST_CASE("faults: once the fault is gone, regions are freed, allocated and written again") {
  ScratchDir dir;
  Deadline deadline("recovery", kDeadlineSeconds);
  for_each_setup(dir.path(), setup_options, [&](const Setup&, spill::SpillArena& arena) {
    const auto src = pattern(2 * spill::MiB + 9, 8);
    std::uint64_t failed_offset = 0;
    {
      FaultScope fail(failing(spill_test::is_write, EIO));
      spill::Region r = arena.allocate(src.size());
      failed_offset = r.offset();
      CHECK_THROWS_AS(r.write_async(src.data(), src.size()).wait(), spill::IoError);
      CHECK_THROWS_AS(r.write(src.data(), src.size()), spill::IoError);
    }  // the region whose bytes are wrong is freed here
    const spill::ArenaStats after_failure = arena.stats();
    CHECK(after_failure.bytes_in_use == 0);
    CHECK(after_failure.live_regions == 0);
    CHECK(after_failure.allocations == after_failure.frees);
    CHECK(after_failure.free_bytes == after_failure.capacity_bytes);
    spill::Region again = arena.allocate(src.size());
    CHECK(again.offset() == failed_offset);  // the same block, reused (LIFO)
    again.write_async(src.data(), src.size()).wait();
    again.write(src.data(), src.size());
    AlignedBuffer dst(src.size());
    again.read_async(dst.data, src.size()).wait();
    CHECK(dst.equals(src));
    std::vector<unsigned char> sync_dst(src.size());
    again.read(sync_dst.data(), sync_dst.size());
    CHECK(sync_dst == src);
    CHECK(arena.stats().live_regions == 1);
    CHECK(arena.stats().bytes_in_use == again.size());
  });
}

#ifdef SPILLARENA_TEST_WITH_TORCH
// ---------------------------------------------------------------------------------------------
// Through spill::checkpoint
// ---------------------------------------------------------------------------------------------

namespace {

spill::ArenaOptions step_options(const std::string& dir, const Setup& s) {
  spill::ArenaOptions o = setup_options(dir, s);
  o.capacity_bytes = 16 * spill::MiB;
  o.staging_bytes = spill::MiB;
  return o;
}

}  // namespace

using namespace spill_test::gpt;

// Three GPT blocks, an input and the references of a step (tests/reference_check.h), to compare
// against.
struct GptCase {
  GptCase(unsigned seed, std::vector<std::int64_t> input_shape)
      : blocks(gpt_blocks(3)),
        x0(seeded_input(seed, input_shape)),
        references(gpt_references(blocks, x0)) {}
  // `asynchronous` false: every write completes in store(), so backward reads every input back
  // (overlapped, backward may take an input still being written back from memory and read none).
  Grads step(spill::SpillArena& arena, bool asynchronous = true) {
    spill::StashOptions every_input;  // every layer input is spilled
    every_input.keep_last = 0;
    every_input.asynchronous = asynchronous;
    return gpt_step(blocks, spill::make_arena_stash(arena, every_input), x0);
  }
  torch::nn::Sequential blocks;  // declared first: the references are computed with it
  torch::Tensor x0;
  StepReferences references;
};

// A step whose spill writes (op write) or restore reads (op read) fail with `error` throws that
// IoError; the arena then holds no region, and the next step is bit-identical to the references.
void check_failed_step_then_exact(GptCase& c, spill::SpillArena& arena, spill::IoOp op, int error) {
  const bool write = op == spill::IoOp::write;
  {
    FaultScope fail(failing(write ? spill_test::is_write : spill_test::is_read, error));
    const auto step = [&] { c.step(arena, /*asynchronous=*/write); };
    const spill::IoError e = expect_io_error(step, write ? kWriteLost : kReadLost);
    CHECK(e.error_number() == error);
    CHECK(e.op() == op);
  }
  CHECK(arena.stats().live_regions == 0);
  c.references.check(c.step(arena));
  CHECK(arena.stats().bytes_in_use == 0);
}

// What each checkpoint fault case starts from: a scratch directory, a deadline, a GptCase.
struct CheckpointFaults {
  ScratchDir dir;
  Deadline deadline{"checkpoint faults", 4 * kDeadlineSeconds};
  GptCase c{8, {2, 16, 64}};
};

TEST_CASE_FIXTURE(CheckpointFaults,
                  "faults: a spill write failing fails the training step; the next step is exact") {
  for_each_setup_and_error(dir.path(), step_options, [&](spill::SpillArena& arena, int error) {
    check_failed_step_then_exact(c, arena, spill::IoOp::write, error);
  });
}

TEST_CASE_FIXTURE(CheckpointFaults,
                  "faults: a read failing in backward fails the step; the next step is exact") {
  // Buffered CPU restores view the mapping and call no pread; direct restores read.
  for_each_setup(dir.path(), step_options, [&](const Setup& s, spill::SpillArena& arena) {
    if (s.mode != spill::IoMode::direct) return;
    check_failed_step_then_exact(c, arena, spill::IoOp::read, EIO);
  });
}

TEST_CASE_FIXTURE(
    CheckpointFaults,
    "faults: short counts under every spill and restore keep gradients bit-identical") {
  for_each_setup(dir.path(), step_options, [&](const Setup& s, spill::SpillArena& arena) {
    const std::uint64_t unit = s.mode == spill::IoMode::direct ? arena.io_alignment() : 1;
    Granted writes, reads;
    FaultScope halves(counting(spill_test::half_counts(unit), 0, ~0ull, &writes, &reads));
    c.references.check(c.step(arena));
    CHECK(writes.calls > 3);  // three spills, each cut short at least once
    CHECK(arena.stats().bytes_in_use == 0);
  });
}
#endif
