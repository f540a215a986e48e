// SpillArena and Region: handles, data I/O, stats, errors.
#include <doctest/doctest.h>

#include <cstdio>
#include <numeric>
#include <thread>
#include <vector>

#include "core/alloc/slab_allocator.h"
#include "core/arena/arena_fields.h"
#include "core/os/memory_limits_fields.h"
#include "field_count.h"
#include "spill/core.h"
#include "spill/process_memory.h"
#include "test_support.h"

using spill_test::options_in;
using spill_test::pattern;
using spill_test::ScratchDir;

TEST_CASE("arena: written bytes read back equal") {
  ScratchDir dir;
  for (auto backing : {spill::Backing::disk, spill::Backing::ram}) {
    SUBCASE(spill_test::subcase_name(backing).c_str()) {
      spill::SpillArena arena(options_in(dir.path(), 16 * spill::MiB, backing));
      const auto src = pattern(3 * spill::MiB + 17, 7);
      spill::Region r = arena.allocate(src.size());
      r.write(src.data(), src.size());
      std::vector<unsigned char> dst(src.size());
      r.read(dst.data(), dst.size());
      CHECK(dst == src);
      CHECK(r.offset() % spill::page_size_bytes() == 0);
    }
  }
}

TEST_CASE("arena: a region is freed when its handle dies") {
  ScratchDir dir;
  spill::SpillArena arena(options_in(dir.path(), 8 * spill::MiB));
  {
    spill::Region r = arena.allocate(spill::MiB);
    CHECK(arena.stats().bytes_in_use == spill::MiB);
    CHECK(arena.stats().live_regions == 1);
  }
  CHECK(arena.stats().bytes_in_use == 0);
  CHECK(arena.stats().live_regions == 0);
}

TEST_CASE("arena: a moved-from region throws a typed error and frees nothing twice") {
  ScratchDir dir;
  spill::SpillArena arena(options_in(dir.path(), 8 * spill::MiB));
  spill::Region a = arena.allocate(spill::MiB);
  spill::Region b = std::move(a);
  CHECK_FALSE(a.valid());
  CHECK_THROWS_AS(a.offset(), spill::MovedFromRegionError);
  char byte = 0;
  CHECK_THROWS_AS(a.write(&byte, 1), spill::MovedFromRegionError);
  CHECK_THROWS_AS(a.read(&byte, 1), spill::MovedFromRegionError);
  CHECK(arena.stats().live_regions == 1);
  b.free();
  CHECK_THROWS_AS(b.size(), spill::MovedFromRegionError);
  CHECK(arena.stats().live_regions == 0);
}

TEST_CASE("arena: exhaustion is a typed error with the numbers and the arena stays usable") {
  ScratchDir dir;
  spill::SpillArena arena(options_in(dir.path(), 8 * spill::MiB));
  spill::Region a = arena.allocate(3 * spill::MiB);
  spill::Region b = arena.allocate(3 * spill::MiB);
  try {
    arena.allocate(4 * spill::MiB);
    FAIL("an allocation larger than the free space succeeded");
  } catch (const spill::ArenaExhaustedError& e) {
    CHECK(e.requested_bytes() == 4 * spill::MiB);
    CHECK(e.free_bytes() == 2 * spill::MiB);
    CHECK(e.largest_free_block() == 2 * spill::MiB);
    CHECK(std::string(e.what()).find("4194304") != std::string::npos);
  }
  CHECK(arena.stats().live_regions == 2);
  b.free();
  spill::Region c = arena.allocate(5 * spill::MiB);  // b's 3 MiB and the free 2 MiB coalesce
  CHECK(c.size() == 5 * spill::MiB);
}

TEST_CASE("arena: bad options and zero-byte allocations are typed errors") {
  ScratchDir dir;
  CHECK_THROWS_AS(spill::SpillArena(options_in(dir.path(), 0)), spill::InvalidArgumentError);
  CHECK_THROWS_AS(spill::SpillArena(options_in(dir.path(), spill::kMaxCapacityBytes + 1)),
                  spill::InvalidArgumentError);
  spill::SpillArena arena(options_in(dir.path(), spill::MiB));
  CHECK_THROWS_AS(arena.allocate(0), spill::InvalidArgumentError);
  const std::uint64_t page = spill::page_size_bytes();
  spill::Region r = arena.allocate(page);
  std::vector<char> big(2 * page);
  CHECK_THROWS_AS(r.write(big.data(), big.size()), spill::InvalidArgumentError);
  CHECK_THROWS_AS(r.read(big.data(), 100, page - 6), spill::InvalidArgumentError);
}

TEST_CASE("arena: a directory with a NUL byte is refused, not cut short") {
  ScratchDir dir;
  CHECK_THROWS_WITH_AS(
      spill::SpillArena(options_in(dir.path() + std::string(1, '\0') + "x", spill::MiB)),
      doctest::Contains("NUL byte"), spill::InvalidArgumentError);
}

TEST_CASE("arena: the staging pool is capped at the capacity and refused beyond usable memory") {
  ScratchDir dir;
  spill::ArenaOptions o = options_in(dir.path(), spill::MiB);
  o.io = spill::IoMode::direct;
  o.staging_bytes = 64 * spill::MiB;
  CHECK(spill::SpillArena(o).stats().staging_bytes <= spill::MiB);
  const std::uint64_t usable = spill::memory_limits().usable_bytes();
  if (usable == 0 || usable >= spill::kMaxStagingBytes) {
    MESSAGE("usable memory unknown or above 64 GiB: the refusal is not checked here");
    return;
  }
  o.capacity_bytes = spill::kMaxStagingBytes;  // sparse on disk until written
  o.staging_bytes = spill::kMaxStagingBytes;
  CHECK_THROWS_WITH_AS(spill::SpillArena{o}, doctest::Contains("staging_bytes"),
                       spill::InsufficientSpaceError);
}

TEST_CASE("arena: a staging pool below one page is refused, as 0 is, not rounded up") {
  ScratchDir dir;
  spill::ArenaOptions o = options_in(dir.path(), spill::MiB);
  for (std::uint64_t staging : {std::uint64_t{0}, std::uint64_t{1}, spill::kMinStagingBytes - 1,
                                spill::kMaxStagingBytes + 1}) {
    CAPTURE(staging);
    o.staging_bytes = staging;
    CHECK_THROWS_WITH_AS(spill::SpillArena{o}, doctest::Contains("use 4.00 KiB to 64.00 GiB"),
                         spill::InvalidArgumentError);
  }
  o.staging_bytes = spill::kMinStagingBytes;
  CHECK_NOTHROW(spill::SpillArena{o});
}

TEST_CASE("arena: a RAM arena larger than physical memory is refused") {
  CHECK_THROWS_AS(spill::SpillArena(options_in("", 512ull << 40, spill::Backing::ram)),
                  spill::InsufficientSpaceError);
}

TEST_CASE("arena: stats count bytes written and read exactly") {
  ScratchDir dir;
  spill::SpillArena arena(options_in(dir.path(), 8 * spill::MiB));
  const auto src = pattern(100000, 1);
  std::vector<unsigned char> dst(src.size());
  spill::Region r = arena.allocate(src.size());
  r.write(src.data(), src.size());
  r.read(dst.data(), 1000);
  const spill::ArenaStats s = arena.stats();
  CHECK(s.bytes_written == 100000);
  CHECK(s.bytes_read == 1000);
  CHECK(s.bytes_requested == 100000);
  CHECK(s.bytes_in_use == spill::SlabAllocator::rounded_size(100000));
  CHECK(s.capacity_bytes == 8 * spill::MiB);
  CHECK(s.allocations == 1);
}

TEST_CASE("arena: regions outlive the arena object that made them") {
  ScratchDir dir;
  spill::Region r;
  const auto src = pattern(8192, 3);
  {
    spill::SpillArena arena(options_in(dir.path(), spill::MiB));
    r = arena.allocate(src.size());
    r.write(src.data(), src.size());
  }
  CHECK(spill_test::read_back(r, src.size()) == src);
}

TEST_CASE("arena: a bounded page cache still returns every byte") {
  ScratchDir dir;
  spill::ArenaOptions o = options_in(dir.path(), 32 * spill::MiB);
  o.page_cache_limit_bytes = 4 * spill::MiB;
  spill::SpillArena arena(o);
  std::vector<spill::Region> regions;
  for (unsigned i = 0; i < 6; ++i) {
    const auto src = pattern(2 * spill::MiB, i);
    regions.push_back(arena.allocate(src.size()));
    regions.back().write(src.data(), src.size());
  }
  for (unsigned i = 0; i < 6; ++i) {
    std::vector<unsigned char> dst(2 * spill::MiB);
    regions[i].read(dst.data(), dst.size());
    CHECK(dst == pattern(2 * spill::MiB, i));
  }
}

TEST_CASE("arena: regions may be written, read and freed from several threads") {
  ScratchDir dir;
  spill::SpillArena arena(options_in(dir.path(), 64 * spill::MiB));
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  const std::uint64_t page = spill::page_size_bytes();
  for (unsigned t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (unsigned i = 0; i < 50; ++i) {
        const auto src = pattern(64 * 1024 + t * page + i, t * 100 + i);
        spill::Region r = arena.allocate(src.size());
        r.write(src.data(), src.size());
        std::vector<unsigned char> dst(src.size());
        r.read(dst.data(), dst.size());
        if (dst != src) ++failures[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(std::accumulate(failures.begin(), failures.end(), 0) == 0);
  CHECK(arena.stats().bytes_in_use == 0);
  CHECK(arena.stats().allocations == 200);
}

TEST_CASE("arena: the default directory is SPILL_DIR when set") {
  ScratchDir dir;
  setenv("SPILL_DIR", dir.path().c_str(), 1);
  spill::ArenaOptions o;
  o.capacity_bytes = spill::MiB;
  spill::SpillArena arena(o);
  CHECK(arena.directory() == dir.path());
  unsetenv("SPILL_DIR");
  CHECK(spill::default_spill_directory() != dir.path());
}

TEST_CASE("arena: the default directory avoids a memory-backed TMPDIR") {
  const spill::DirectoryInfo var_tmp = spill::inspect_directory("/var/tmp");
  if (!spill_test::fs::exists("/dev/shm") || !var_tmp.usable || var_tmp.memory_backed) {
    MESSAGE("skipped: needs /dev/shm and a disk-backed /var/tmp");
    return;
  }
  const char* old_tmpdir = std::getenv("TMPDIR");
  const std::string saved = old_tmpdir ? old_tmpdir : "";
  unsetenv("SPILL_DIR");
  setenv("TMPDIR", "/dev/shm", 1);
  CHECK(spill::default_spill_directory() == "/var/tmp");
  if (old_tmpdir)
    setenv("TMPDIR", saved.c_str(), 1);
  else
    unsetenv("TMPDIR");
}

TEST_CASE("arena: a moved-from arena throws a typed error instead of crashing") {
  ScratchDir dir;
  spill::SpillArena a(options_in(dir.path(), spill::MiB));
  spill::SpillArena b = std::move(a);
  const std::uint64_t page = spill::page_size_bytes();
  CHECK_THROWS_AS(a.allocate(page), spill::Error);
  CHECK_THROWS_AS(a.stats(), spill::Error);
  CHECK_THROWS_AS(a.directory(), spill::Error);
  CHECK(b.allocate(page).size() == page);
}

TEST_CASE("arena: automatic I/O counts the stash's host pool beside the arena") {
  ScratchDir dir;
  spill::ArenaOptions o = options_in(dir.path(), spill::MiB);
  o.host_pool_bytes = 4 * spill::MiB;
  spill::SpillArena with_pool(o);
  CHECK(with_pool.stats().io_note.find("the arena (1048576 bytes (1.00 MiB)) plus the host pool "
                                       "(4194304 bytes (4.00 MiB))") != std::string::npos);
  o.host_pool_bytes = spill::kAutomaticHostPool;  // sized later, from what is left
  spill::SpillArena automatic_pool(o);
  CHECK(automatic_pool.stats().io_note.find("host pool") == std::string::npos);
}

TEST_CASE("arena: visit_fields names every field of ArenaOptions, ArenaStats, MemoryLimits once") {
  const auto visit_fields = [](const auto& s, auto&& visit) {
    spill::detail::visit_fields(s, visit);
  };
  spill_test::check_visits_every_field(spill::ArenaOptions{}, visit_fields);
  spill_test::check_visits_every_field(spill::ArenaStats{}, visit_fields);
  spill_test::check_visits_every_field(spill::MemoryLimits{}, visit_fields);
}

TEST_CASE("arena: a virtual file system gets one refusal, from the arena and from inspection") {
  for (const char* dir : {"/proc", "/proc/self", "/sys"}) {
    CAPTURE(dir);
    const spill::DirectoryInfo d = spill::inspect_directory(dir);
    CHECK_FALSE(d.usable);
    CHECK(d.problem.find("stores no files (a virtual file system)") != std::string::npos);
    CHECK(d.problem.find("create it") == std::string::npos);
    CHECK_THROWS_WITH_AS(spill::SpillArena(options_in(dir, spill::MiB)),
                         doctest::Contains(d.problem.c_str()), spill::DirectoryError);
  }
}

TEST_CASE("arena: the advice for an unusable directory fits its errno") {
  ScratchDir dir;
  const spill::DirectoryInfo missing = spill::inspect_directory(dir.path() + "/missing");
  CHECK(missing.problem.find("does not exist; create it") != std::string::npos);
  const std::string file = dir.path() + "/file";
  std::fclose(std::fopen(file.c_str(), "w"));
  const spill::DirectoryInfo not_dir = spill::inspect_directory(file);
  CHECK(not_dir.problem.find("is not a directory") != std::string::npos);
  CHECK(not_dir.problem.find("create it") == std::string::npos);
  CHECK(spill::empty_directory_refusal("omit --dir")
            .find("an empty path names no directory; "
                  "omit --dir for the default") == 0);
}
