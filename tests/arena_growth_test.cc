// Sizing: overflow counting, the grow at a moment with no region live, a disk that refuses it,
// and the options' bad values. See Note [Growing the arena] in src/core/arena/arena_growth.cc.
#include <doctest/doctest.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/alloc/slab_allocator.h"
#include "core/arena/arena_internals.h"
#include "core/os/fault_injection.h"
#include "spill/core.h"
#include "test_support.h"

using spill::MiB;
using spill_test::options_in;
using spill_test::pattern;
using spill_test::ScratchDir;
namespace fs = std::filesystem;

namespace {

// Holds `count` regions of `bytes` each, as a forward would, until the end of the step: the empty
// Regions of inputs that found no room too, as the stash keeps them with the inputs it kept.
std::vector<spill::Region> forward(spill::SpillArena& arena, int count, std::uint64_t bytes) {
  std::vector<spill::Region> live;
  for (int i = 0; i < count; ++i) live.push_back(arena.try_allocate(bytes));
  return live;
}

// The inputs of a step that went to the arena.
std::size_t spilled(const std::vector<spill::Region>& step) {
  std::size_t n = 0;
  for (const spill::Region& r : step) n += r.valid() ? 1 : 0;
  return n;
}

// Fails every fallocate with `error` while alive.
struct FailingPreallocate {
  explicit FailingPreallocate(int error) {
    spill::testing::set_fault_hook(
        [error](spill::testing::FaultSite site, std::uint64_t bytes, std::uint64_t) {
          if (site == spill::testing::FaultSite::preallocate)
            return -static_cast<std::int64_t>(error);
          return static_cast<std::int64_t>(bytes);
        });
  }
  ~FailingPreallocate() { spill::testing::set_fault_hook({}); }
};

}  // namespace

TEST_CASE("allocator: grow extends the free range and never shrinks") {
  spill::SlabAllocator slabs(8 * 4096);
  std::optional<spill::Block> a = slabs.allocate(6 * 4096);
  REQUIRE(a);
  CHECK_FALSE(slabs.allocate(4 * 4096));
  slabs.grow(16 * 4096);
  CHECK(slabs.capacity_bytes() == 16 * 4096);
  CHECK(slabs.stats().free_bytes == 10 * 4096);
  CHECK(slabs.stats().largest_free_block == 10 * 4096);  // the old tail joined the new range
  std::optional<spill::Block> b = slabs.allocate(10 * 4096);
  REQUIRE(b);
  CHECK(b->offset == 6 * 4096);
  CHECK(slabs.check_invariants());
  CHECK_THROWS_AS(slabs.grow(4 * 4096), spill::InvalidArgumentError);
  slabs.grow(16 * 4096);  // equal: nothing
  CHECK(slabs.capacity_bytes() == 16 * 4096);
}

TEST_CASE("arena growth: a refused allocation is counted, and the arena grows once empty") {
  ScratchDir dir;
  for (auto backing : {spill::Backing::disk, spill::Backing::ram}) {
    SUBCASE(spill_test::subcase_name(backing).c_str()) {
      spill::SpillArena arena(options_in(dir.path(), 2 * MiB, backing));
      {
        std::vector<spill::Region> step = forward(arena, 8, MiB);
        CHECK(spilled(step) == 2);
        const spill::ArenaStats s = arena.stats();
        CHECK(s.overflows == 6);
        CHECK(s.overflow_bytes == 6 * MiB);
        CHECK(s.capacity_needed_bytes == 8 * MiB);
        CHECK(s.capacity_bytes == 2 * MiB);  // never in the middle of a step
        CHECK(s.grows == 0);
      }
      std::vector<spill::Region> step = forward(arena, 8, MiB);
      const spill::ArenaStats s = arena.stats();
      CHECK(spilled(step) == 8);
      CHECK(s.grows == 1);
      CHECK(s.capacity_bytes == 10 * MiB);  // 8 MiB needed x the 1.25 margin
      CHECK(s.initial_capacity_bytes == 2 * MiB);
      CHECK(s.overflows == 6);  // none more
      // The grown range holds bytes like the first.
      const auto src = pattern(MiB, 3);
      step.back().write(src.data(), src.size());
      std::vector<unsigned char> dst(src.size());
      step.back().read(dst.data(), dst.size());
      CHECK(dst == src);
    }
  }
}

TEST_CASE("arena growth: a live region holds the grow back until the arena is empty") {
  ScratchDir dir;
  spill::SpillArena arena(options_in(dir.path(), 2 * MiB));
  spill::Region kept = arena.allocate(MiB);  // a second graph alive (gradient accumulation)
  {
    std::vector<spill::Region> step = forward(arena, 4, MiB);
    CHECK(arena.stats().overflows == 3);
  }
  std::vector<spill::Region> step = forward(arena, 4, MiB);
  CHECK(arena.stats().grows == 0);
  CHECK(spilled(step) == 1);
  step.clear();
  kept.free();
  step = forward(arena, 4, MiB);
  CHECK(arena.stats().grows == 1);
  CHECK(spilled(step) == 4);
}

TEST_CASE("arena growth: it never shrinks, and grow = false keeps the capacity") {
  ScratchDir dir;
  spill::ArenaOptions o = options_in(dir.path(), 2 * MiB);
  SUBCASE("grown once, smaller steps keep it") {
    spill::SpillArena arena(o);
    forward(arena, 4, MiB);
    forward(arena, 1, MiB);
    forward(arena, 1, MiB);
    CHECK(arena.stats().capacity_bytes == 5 * MiB);
    CHECK(arena.stats().grows == 1);
  }
  SUBCASE("grow = false") {
    o.grow = false;
    spill::SpillArena arena(o);
    forward(arena, 4, MiB);
    CHECK(spilled(forward(arena, 4, MiB)) == 2);
    CHECK(arena.stats().capacity_bytes == 2 * MiB);
    CHECK(arena.stats().overflows == 4);
    CHECK(arena.stats().grows == 0);
  }
  SUBCASE("growth_margin = 1: exactly what the step needed") {
    o.growth_margin = 1.0;
    spill::SpillArena arena(o);
    forward(arena, 3, MiB);
    forward(arena, 3, MiB);
    CHECK(arena.stats().capacity_bytes == 3 * MiB);
  }
}

TEST_CASE("arena growth: allocate still throws ArenaExhaustedError, and counts the overflow") {
  ScratchDir dir;
  spill::SpillArena arena(options_in(dir.path(), MiB));
  CHECK_THROWS_AS(arena.allocate(2 * MiB), spill::ArenaExhaustedError);
  const spill::ArenaStats s = arena.stats();
  CHECK(s.overflows == 1);
  CHECK(s.live_regions == 0);
  CHECK(s.bytes_in_use == 0);
  CHECK(arena.allocate(2 * MiB).valid());  // the next allocation grew it first
}

TEST_CASE("arena growth: one warning for the first overflow, naming the room it needs") {
  ScratchDir dir;
  spill::SpillArena arena(options_in(dir.path(), MiB));
  forward(arena, 3, MiB);
  std::vector<std::string> notices = spill::detail::take_notices(arena);
  REQUIRE(notices.size() == 1);
  CHECK(notices[0].find("no room for an input of 1.00 MiB") != std::string::npos);
  CHECK(notices[0].find(dir.path()) != std::string::npos);
  CHECK(notices[0].find("free now") != std::string::npos);
  forward(arena, 8, MiB);
  CHECK(spill::detail::take_notices(arena).empty());  // once per arena
  SUBCASE("when_full = error warns nothing: the error says it") {
    spill::ArenaOptions o = options_in(dir.path(), MiB);
    o.when_full = spill::WhenFull::error;
    spill::SpillArena strict(o);
    forward(strict, 3, MiB);
    CHECK(spill::detail::take_notices(strict).empty());
  }
}

TEST_CASE("arena growth: a refused fallocate changes nothing, warns once, leaves nothing") {
  ScratchDir dir;
  spill::SpillArena arena(options_in(dir.path(), 2 * MiB));
  forward(arena, 4, MiB);
  spill::detail::take_notices(arena);
  {
    FailingPreallocate full(ENOSPC);
    std::vector<spill::Region> step = forward(arena, 4, MiB);
    CHECK(spilled(step) == 2);
    step.clear();
    forward(arena, 4, MiB);
  }
  spill::ArenaStats s = arena.stats();
  CHECK(s.capacity_bytes == 2 * MiB);
  CHECK(s.grows == 0);
  CHECK(s.grow_failures == 2);
  CHECK(s.grow_note.find("No space left on device") != std::string::npos);
  const std::vector<std::string> notices = spill::detail::take_notices(arena);
  REQUIRE(notices.size() == 1);
  CHECK(notices[0].find("could not grow from 2.00 MiB") != std::string::npos);
  CHECK(spill_test::list_dir(dir.path()).empty());
  // The disk has room again: the next step boundary grows.
  forward(arena, 4, MiB);
  CHECK(arena.stats().grows == 1);
}

TEST_CASE("arena growth: a disk without the space is checked before fallocate") {
  spill_test::LoopMount disk(16);
  if (!disk.ok()) {
    MESSAGE("skipped: " << disk.reason());
    return;
  }
  spill::SpillArena arena(options_in(disk.path(), 4 * MiB));
  forward(arena, 20, MiB);  // needs 25 MiB with the margin, 20 exactly: neither fits in 16
  std::vector<spill::Region> step = forward(arena, 20, MiB);
  const spill::ArenaStats s = arena.stats();
  CHECK(spilled(step) == 4);
  CHECK(s.grow_failures == 1);
  CHECK(s.capacity_bytes == 4 * MiB);
  CHECK(s.grow_note.find(disk.path()) != std::string::npos);
  CHECK(s.grow_note.find("free") != std::string::npos);
  const std::vector<std::string> notices = spill::detail::take_notices(arena);
  REQUIRE(notices.size() == 2);  // the overflow, then the refused grow
  CHECK(notices[1].find("could not grow") != std::string::npos);
  CHECK(spill_test::list_dir(disk.path()) == std::set<std::string>{"lost+found"});
}

TEST_CASE("arena growth: bad sizing values get typed errors naming them") {
  ScratchDir dir;
  spill::ArenaOptions o = options_in(dir.path(), MiB);
  for (double margin :
       {0.99, 0.0, -1.0, 16.5, std::nan(""), std::numeric_limits<double>::infinity()}) {
    o.growth_margin = margin;
    CHECK_THROWS_WITH_AS(spill::SpillArena{o}, doctest::Contains("growth_margin"),
                         spill::InvalidArgumentError);
  }
  o.growth_margin = 1.25;
  o.capacity_bytes = 0;
  CHECK_THROWS_AS(spill::SpillArena{o}, spill::InvalidArgumentError);
  o.capacity_bytes = MiB;
  spill::SpillArena arena(o);
  CHECK_THROWS_WITH_AS(arena.try_allocate(spill::kMaxCapacityBytes + 1),
                       doctest::Contains("larger than any arena can be"),
                       spill::InvalidArgumentError);
  CHECK(arena.stats().overflows == 0);
}

TEST_CASE("arena growth: a grow refused by a file size limit names the limit, not the disk") {
  ScratchDir dir;
  spill::SpillArena arena(options_in(dir.path(), MiB));
  forward(arena, 2, MiB);
  spill::detail::take_notices(arena);
  FailingPreallocate too_large(EFBIG);
  forward(arena, 2, MiB);
  const std::vector<std::string> notices = spill::detail::take_notices(arena);
  REQUIRE(notices.size() == 1);
  CHECK(notices[0].find("could not grow from 1.00 MiB to 2.00 MiB (a step needed 2.00 MiB)") !=
        std::string::npos);
  CHECK(notices[0].find("ulimit -f") != std::string::npos);
}

TEST_CASE("arena growth: the RAM backing's warning speaks of memory, not of a file") {
  spill::SpillArena arena(options_in("", MiB, spill::Backing::ram));
  forward(arena, 2, MiB);
  const std::vector<std::string> notices = spill::detail::take_notices(arena);
  REQUIRE(notices.size() == 1);
  CHECK(notices[0].find("the arena in RAM (1.00 MiB)") != std::string::npos);
  CHECK(notices[0].find("the arena grows") != std::string::npos);
  CHECK(notices[0].find("file") == std::string::npos);
}

TEST_CASE("arena growth: overflows of the largest regions saturate; the grow asks for 1 PiB") {
  ScratchDir dir;
  spill::ArenaOptions o = options_in(dir.path(), MiB);
  o.backing = spill::Backing::ram;  // the grow is refused (more than physical memory), not tried
  spill::SpillArena arena(o);
  std::vector<spill::Region> held;
  held.push_back(arena.allocate(MiB / 2));
  for (int i = 0; i < 40000; ++i) CHECK_FALSE(arena.try_allocate(spill::kMaxCapacityBytes));
  const spill::ArenaStats s = arena.stats();
  CHECK(s.overflows == 40000);
  CHECK(s.capacity_needed_bytes == spill::kMaxCapacityBytes + MiB / 2);  // saturated, no wrap
  CHECK(s.overflow_bytes == std::numeric_limits<std::uint64_t>::max());  // 40000 PiB: saturated
  held.clear();
  CHECK(arena.allocate(MiB / 2).valid());
  CHECK(arena.stats().grow_failures == 1);
  CHECK(arena.stats().grow_note.find("1.00 PiB") != std::string::npos);
  CHECK(arena.stats().capacity_bytes == MiB);
}

// Issue 37's first reproduction: a region held for the whole run (a graph kept alive) and 1000
// inputs of 4 KiB that overflowed and were freed, one at a time. At most 12 KiB was ever live.
TEST_CASE("arena growth: an overflow freed leaves the demand; the file stays within the margin") {
  ScratchDir dir;
  spill::SpillArena arena(options_in(dir.path(), 8 * 1024));
  spill::Region pinned = arena.allocate(8 * 1024);
  for (int i = 0; i < 1000; ++i) {
    spill::Region overflowed = arena.try_allocate(4096);
    REQUIRE_FALSE(overflowed);
  }  // each dropped: the input it stood for was restored or freed
  CHECK(arena.stats().overflows == 1000);
  CHECK(arena.stats().capacity_needed_bytes == 12 * 1024);
  pinned.free();
  spill::Region next = arena.allocate(4096);  // the empty moment: the grow
  const spill::ArenaStats s = arena.stats();
  CHECK(s.grows == 1);
  CHECK(s.capacity_bytes == 16 * 1024);  // 12 KiB x 1.25, in whole pages
  CHECK(s.capacity_bytes <= 1.25 * s.capacity_needed_bytes + 4096);
}

TEST_CASE("arena growth: an overflow still held counts until its empty Region dies") {
  ScratchDir dir;
  spill::SpillArena arena(options_in(dir.path(), 8 * 1024));
  spill::Region kept = arena.try_allocate(16 * 1024);  // a graph kept alive holds its input
  REQUIRE_FALSE(kept);
  for (int step = 0; step < 50; ++step) {
    std::vector<spill::Region> regions = forward(arena, 2, 4096);
    CHECK(spilled(regions) == 2);
  }
  // What was live at once: the 16 KiB still held and one step's 8 KiB, never 50 steps' worth.
  // Two grows: to 20 KiB for the 16 KiB held, then to 24 KiB x 1.25 in whole pages.
  CHECK(arena.stats().capacity_needed_bytes == 24 * 1024);
  CHECK(arena.stats().capacity_bytes == 32 * 1024);
  CHECK(arena.stats().grows == 2);
  kept = spill::Region();   // the graph dies: its bytes leave the sum
  forward(arena, 6, 4096);  // 24 KiB live, as before: no grow (40 KiB, a third, had it stayed)
  forward(arena, 6, 4096);
  CHECK(arena.stats().grows == 2);
  CHECK(arena.stats().capacity_bytes == 32 * 1024);
  kept.free();  // an empty Region frees as a no-op
}

// Note [Room is found from the descriptor] in src/core/file/spill_file.cc.
TEST_CASE("arena growth: a removed directory or a relative one after chdir still grows") {
  ScratchDir dir;
  const std::string sub = dir.path() + "/spill";
  SUBCASE("removed") {
    fs::create_directory(sub);
    spill::SpillArena arena(options_in(sub, 8 * 1024));
    fs::remove_all(sub);  // the file has no name: nothing keeps the directory
    forward(arena, 4, 4096);
    forward(arena, 4, 4096);
    CHECK(arena.stats().grows == 1);
    CHECK(arena.stats().grow_failures == 0);
    CHECK(arena.directory() == sub);
  }
  SUBCASE("relative, then chdir") {
    fs::create_directory(sub);
    const fs::path before = fs::current_path();
    fs::current_path(dir.path());
    spill::SpillArena arena(options_in("spill", 8 * 1024));
    fs::current_path("/");
    forward(arena, 4, 4096);
    forward(arena, 4, 4096);
    fs::current_path(before);
    CHECK(arena.stats().grows == 1);
    CHECK(arena.stats().grow_failures == 0);
    CHECK(arena.directory() == dir.path() + "/spill");  // absolute, captured once for messages
  }
}

// Note [The staging pool follows the arena] in src/core/io/io_engine.cc.
TEST_CASE("arena growth: a direct-mode arena's staging pool grows with it") {
  ScratchDir dir;
  spill::ArenaOptions o = options_in(dir.path(), 12 * 1024, spill::IoMode::direct);
  std::unique_ptr<spill::SpillArena> arena;
  try {
    arena = std::make_unique<spill::SpillArena>(o);
  } catch (const spill::Error& e) {
    MESSAGE("skipped: no O_DIRECT here: " << e.what());
    return;
  }
  CHECK(arena->stats().staging_bytes == 12 * 1024);
  forward(*arena, 1, 8 * MiB);
  std::vector<spill::Region> step = forward(*arena, 1, 8 * MiB);
  REQUIRE(spilled(step) == 1);
  o.capacity_bytes = arena->stats().capacity_bytes;
  spill::SpillArena preallocated(o);
  CHECK(arena->stats().staging_bytes == preallocated.stats().staging_bytes);
  CHECK(arena->stats().staging_bytes == 8 * MiB);  // 10 MiB of capacity in whole 4 MiB slots
  const std::vector<char> src = pattern<char>(8 * MiB + 1, 3);  // unaligned: through staging
  step[0].write(src.data() + 1, 8 * MiB);
  std::vector<char> dst(8 * MiB);
  step[0].read(dst.data(), dst.size());
  CHECK(std::equal(dst.begin(), dst.end(), src.begin() + 1));
}

TEST_CASE("arena growth: reals in messages are short and exact") {
  CHECK(spill::format_real(1.25) == "1.25");
  CHECK(spill::format_real(1.0000001) == "1.0000001");
  CHECK(spill::format_real(1e308) == "1e+308");
  CHECK(spill::format_real(16.0) == "16");
  CHECK(spill::format_real(std::nan("")) == "nan");
  ScratchDir dir;
  spill::ArenaOptions o = options_in(dir.path(), MiB);
  o.growth_margin = 1e308;
  try {
    spill::SpillArena arena(o);
    FAIL("growth_margin 1e308 was accepted");
  } catch (const spill::InvalidArgumentError& e) {
    const std::string what = e.what();
    CHECK(what.find("growth_margin = 1e+308 ") != std::string::npos);
    CHECK(what.size() < 160);
  }
}

TEST_CASE("arena growth: when_full error says a step may fail more than once before it fits") {
  ScratchDir dir;
  spill::ArenaOptions o = options_in(dir.path(), 8 * 1024);
  o.when_full = spill::WhenFull::error;
  spill::SpillArena arena(o);
  spill::Region a = arena.allocate(8 * 1024);
  CHECK_THROWS_WITH_AS(arena.allocate(4096), doctest::Contains("may fail several times"),
                       spill::ArenaExhaustedError);
}
