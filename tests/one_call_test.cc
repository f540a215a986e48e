// The stash's one call each way (Note [One call each way] in src/core/arena/region.cc):
// SpillArena::spill_from, Region::take_into and the read_ahead hint, in every I/O mode and
// backing, with no room, with bad arguments and with a failed write.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <vector>

#include "core/arena/arena_internals.h"
#include "core/io/io_queue.h"
#include "spill/core.h"
#include "test_support.h"

using spill_test::options_in;
using spill_test::pattern;
using spill_test::ScratchDir;

namespace {

// An arena in `dir` for one of the three ways bytes travel.
spill::ArenaOptions way(const std::string& dir, const std::string& name) {
  spill::ArenaOptions o = options_in(dir, 32 * spill::MiB);
  if (name == "direct") o.io = spill::IoMode::direct;
  if (name == "buffered") o.io = spill::IoMode::buffered;
  if (name == "ram") o.backing = spill::Backing::ram;
  return o;
}

// Page-aligned memory, as the stash's direct-mode destinations are.
struct AlignedBytes {
  explicit AlignedBytes(std::size_t n) : size(n) { REQUIRE(::posix_memalign(&data, 4096, n) == 0); }
  ~AlignedBytes() { std::free(data); }
  std::vector<unsigned char> bytes() const {
    const auto* p = static_cast<const unsigned char*>(data);
    return std::vector<unsigned char>(p, p + size);
  }
  void* data = nullptr;
  std::size_t size;
};

}  // namespace

TEST_CASE("one call: spill_from then take_into gives the bytes back and frees the region") {
  ScratchDir dir;
  for (const char* name : {"buffered", "direct", "ram"}) {
    SUBCASE(name) {
      spill::SpillArena arena(way(dir.path(), name));
      const auto src = pattern(3 * spill::MiB + 4096, 11);
      spill::Region r = arena.spill_from(src.data(), src.size());
      REQUIRE(r.valid());
      CHECK(arena.stats().live_regions == 1);
      AlignedBytes dst(src.size());
      const bool ready = r.take_into(dst.data, src.size());
      CHECK(dst.bytes() == src);
      CHECK_FALSE(r.valid());  // freed by take_into
      CHECK(arena.stats().live_regions == 0);
      CHECK(arena.stats().bytes_verified >= src.size());      // checked against the write's hash
      if (std::string(name) == "ram") CHECK(ready);           // host memory never waits
      if (std::string(name) == "direct") CHECK_FALSE(ready);  // read from the disk
    }
  }
}

TEST_CASE("one call: a read ahead into the destination is what take_into completes") {
  ScratchDir dir;
  for (const char* name : {"buffered", "direct", "ram"}) {
    SUBCASE(name) {
      spill::SpillArena arena(way(dir.path(), name));
      const auto src = pattern(2 * spill::MiB, 5);
      spill::Region r = arena.spill_from(src.data(), src.size());
      r.pending().wait();
      AlignedBytes dst(src.size());
      r.read_ahead(dst.data);
      r.pending().wait();  // the read ahead completed: take_into waits for nothing
      const std::uint64_t read_before = arena.stats().bytes_read;
      CHECK(r.take_into(dst.data, src.size()));
      CHECK(arena.stats().bytes_read == read_before);  // not read a second time
      CHECK(dst.bytes() == src);
      CHECK(arena.stats().live_regions == 0);
    }
  }
}

TEST_CASE("one call: a page-cache read ahead, then take_into into other memory") {
  ScratchDir dir;
  spill::SpillArena arena(way(dir.path(), "buffered"));
  const auto src = pattern(spill::MiB, 9);
  spill::Region r = arena.spill_from(src.data(), src.size());
  r.read_ahead();  // no destination: the kernel reads ahead
  std::vector<unsigned char> dst(src.size());
  r.take_into(dst.data(), dst.size());
  CHECK(dst == src);
}

TEST_CASE("one call: no room is an empty region or ArenaExhaustedError, as when_full says") {
  ScratchDir dir;
  spill::ArenaOptions o = options_in(dir.path(), spill::MiB);
  o.grow = false;
  const auto src = pattern(2 * spill::MiB, 3);
  SUBCASE("keep_in_memory") {
    spill::SpillArena arena(o);
    spill::Region r = arena.spill_from(src.data(), src.size());
    CHECK_FALSE(r.valid());
    CHECK(arena.stats().overflows == 1);
    CHECK(arena.stats().bytes_written == 0);  // nothing queued
  }
  SUBCASE("error") {
    o.when_full = spill::WhenFull::error;
    spill::SpillArena arena(o);
    CHECK_THROWS_AS(arena.spill_from(src.data(), src.size()), spill::ArenaExhaustedError);
    CHECK(arena.stats().live_regions == 0);
    CHECK(arena.stats().bytes_written == 0);
  }
}

TEST_CASE("one call: bad arguments are typed errors and leave the region as it was") {
  ScratchDir dir;
  spill::SpillArena arena(options_in(dir.path(), 8 * spill::MiB));
  const auto src = pattern(spill::MiB, 1);
  spill::Region r = arena.spill_from(src.data(), src.size());
  std::vector<unsigned char> dst(2 * spill::MiB);
  CHECK_THROWS_AS(r.take_into(dst.data(), 2 * spill::MiB), spill::InvalidArgumentError);
  CHECK(r.valid());
  CHECK_THROWS_AS(arena.spill_from(src.data(), 0), spill::InvalidArgumentError);
  spill::Region moved = std::move(r);
  CHECK_THROWS_AS(r.take_into(dst.data(), 1), spill::MovedFromRegionError);
  CHECK_THROWS_AS(r.read_ahead(), spill::MovedFromRegionError);
  CHECK_THROWS_AS(r.pending(), spill::MovedFromRegionError);
  moved.take_into(dst.data(), spill::MiB);
  CHECK(std::vector<unsigned char>(dst.begin(), dst.begin() + spill::MiB) == src);
}

TEST_CASE("one call: a failed write is thrown by take_into, and the region stays allocated") {
  ScratchDir dir;
  spill::testing::set_io_test_hook(
      [](spill::IoOp op) { return op == spill::IoOp::write ? EIO : 0; });
  spill::SpillArena arena(options_in(dir.path(), 8 * spill::MiB));
  spill::testing::set_io_test_hook({});
  const auto src = pattern(spill::MiB, 2);
  spill::Region r = arena.spill_from(src.data(), src.size());
  std::vector<unsigned char> dst(src.size());
  CHECK_THROWS_AS(r.take_into(dst.data(), dst.size()), spill::IoError);
  CHECK(r.valid());
  CHECK(arena.stats().live_regions == 1);
}

// Note [A RAM restore is a view]: the RAM arena's bytes where they are, checked first.
TEST_CASE("one call: a RAM region's bytes in place are checked, and refused for a disk arena") {
  ScratchDir dir;
  const auto src = pattern(spill::MiB, 4);
  spill::SpillArena ram(way(dir.path(), "ram"));
  spill::Region r = ram.spill_from(src.data(), src.size());
  const auto* in_place =
      static_cast<const unsigned char*>(spill::detail::host_bytes(r, src.size()));
  CHECK(std::vector<unsigned char>(in_place, in_place + src.size()) == src);
  const_cast<unsigned char*>(in_place)[100] ^= 1;  // changed behind the arena's back
  CHECK_THROWS_AS(spill::detail::host_bytes(r, src.size()), spill::IntegrityError);
  CHECK_THROWS_AS(spill::detail::host_bytes(r, r.size() + 1), spill::InvalidArgumentError);
  spill::SpillArena disk(way(dir.path(), "buffered"));
  spill::Region d = disk.spill_from(src.data(), src.size());
  CHECK_THROWS_AS(spill::detail::host_bytes(d, src.size()), spill::InvalidArgumentError);
}
