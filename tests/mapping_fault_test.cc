// A spill file that shrinks behind the arena's back: the reads through its mapping (the copy of a
// resident read, hashed in the same pass) become a spill::IoError instead of a SIGBUS that kills
// the process, or zeros from past the file's end. See Note [SIGBUS on the mapping] in
// src/core/os/platform_posix.cc; the guard itself is platform::read_mapped (an internal header).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "core/arena/arena_internals.h"
#include "core/os/platform.h"
#include "spill/sizing.h"
#include "test_support.h"

using spill_test::pattern;
using spill_test::ScratchDir;
using spill_test::truncate_spill_file;
namespace fs = std::filesystem;

namespace {

spill::ArenaOptions buffered_in(const std::string& dir, bool verify) {
  spill::ArenaOptions o =
      spill_test::engine_options(dir, spill::IoMode::buffered, spill::IoBackend::thread_pool);
  o.capacity_bytes = 16 * spill::MiB;
  o.verify_integrity = verify;
  return o;
}

// A test handler that was there before ours: it jumps back to the test.
sigjmp_buf g_test_jump;
volatile sig_atomic_t g_test_handler_ran = 0;
void test_handler(int, siginfo_t*, void*) {
  g_test_handler_ran = 1;
  siglongjmp(g_test_jump, 1);
}

// A scratch file of two pages, mapped shared, then cut to nothing: every load from the mapping
// raises SIGBUS.
struct ShrunkMapping {
  explicit ShrunkMapping(const std::string& dir) : page(spill::page_size_bytes()) {
    const std::string path = dir + "/mapped";
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    ::unlink(path.c_str());
    REQUIRE(::ftruncate(fd, static_cast<off_t>(2 * page)) == 0);
    void* p = ::mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    REQUIRE(p != MAP_FAILED);
    base = static_cast<char*>(p);
    std::memset(base, 7, 2 * page);
    REQUIRE(::ftruncate(fd, 0) == 0);
  }
  ~ShrunkMapping() {
    ::munmap(base, 2 * page);
    ::close(fd);
  }
  ShrunkMapping(const ShrunkMapping&) = delete;
  ShrunkMapping& operator=(const ShrunkMapping&) = delete;
  std::uint64_t page;
  int fd = -1;
  char* base = nullptr;
};

struct Copy {
  char* dst;
  const char* src;
  std::uint64_t bytes;
  static void run(void* c) {
    auto* self = static_cast<Copy*>(c);
    std::memcpy(self->dst, self->src, self->bytes);
  }
};

}  // namespace

// First in this file: the handler that was installed before the guard's first use is the one
// that faults outside a guarded range reach.
TEST_CASE("mapping: a SIGBUS inside a guarded read is EIO; outside, the earlier handler gets it") {
  struct sigaction current{};
  REQUIRE(::sigaction(SIGBUS, nullptr, &current) == 0);
  if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) {
    MESSAGE("skipped: a SIGBUS handler is already installed in this process");
    return;
  }
  struct sigaction test{};
  test.sa_sigaction = test_handler;
  test.sa_flags = SA_SIGINFO;
  sigemptyset(&test.sa_mask);
  REQUIRE(::sigaction(SIGBUS, &test, nullptr) == 0);

  ScratchDir dir;
  ShrunkMapping m(dir.path());
  std::vector<char> dst(m.page);
  Copy inside{dst.data(), m.base, m.page};
  CHECK(spill::platform::read_mapped(m.base, m.page, &Copy::run, &inside) == EIO);
  CHECK(g_test_handler_ran == 0);  // our guard took it
  // A fault outside every guarded range goes to the handler that was there before.
  if (sigsetjmp(g_test_jump, 1) == 0) {
    volatile char c = m.base[m.page];
    (void)c;
    FAIL("reading a truncated mapping raised no SIGBUS");
  }
  CHECK(g_test_handler_ran == 1);
}

// Cut inside the region's last page, which stays in the page cache (zeroed past the new end): the
// read copies from the mapping, where loads past the end return zeros without a SIGBUS, so only
// the size check before the copy stands between the caller and those zeros.
TEST_CASE("mapping: a resident read of a spill file cut inside its last page throws IoError") {
  for (bool verify : {true, false}) {
    SUBCASE(verify ? "verify_integrity" : "no verify_integrity") {
      ScratchDir dir;
      spill::SpillArena arena(buffered_in(dir.path(), verify));
      const std::size_t n = 5 * spill::MiB + 13;  // 13 bytes in the last page
      const auto src = pattern(n, 1);
      spill::Region before = arena.allocate(spill::MiB);
      spill::Region r = spill_test::written_region(arena, src);
      std::vector<unsigned char> dst(n);
      r.read(dst.data(), n);
      CHECK(dst == src);
      truncate_spill_file(dir.path(), r.offset() + n - 5);  // the region's last 5 bytes are gone
      // Every page still in memory: the read copies from the mapping rather than pread it.
      REQUIRE(spill::detail::resident_bytes(r) >= n);
      try {
        r.read(dst.data(), n);
        FAIL("a read of a truncated file handed out bytes from past its end");
      } catch (const spill::IoError& e) {
        CHECK(e.error_number() == EIO);
        CHECK(e.op() == spill::IoOp::read);
        CHECK(e.offset() == r.offset());
        CHECK(e.bytes() == n);
        const std::string message = e.what();
        CHECK(message.find("truncated") != std::string::npos);
        CHECK(message.find(dir.path()) != std::string::npos);
        CHECK(message.find("new SpillArena") != std::string::npos);
      }
      // What still lies inside the file is still readable.
      CHECK(spill_test::read_back(before, spill::MiB) == std::vector<unsigned char>(spill::MiB));
      r.read(dst.data(), n - 5);
      CHECK(std::equal(dst.begin(), dst.end() - 5, src.begin()));
    }
  }
}

// A file cut before the read is found by its size before anything is copied: 3 MiB is one hash
// chunk, 9 MiB three (each copied and hashed in one pass, Note [Copying and hashing in one pass]
// in src/core/integrity/integrity.cc), cut in the first chunk or in the last only.
TEST_CASE("mapping: a resident read of a truncated spill file throws IoError, not SIGBUS") {
  struct Cut {
    std::size_t bytes;
    std::size_t kept;
  };
  for (Cut cut : {Cut{3 * spill::MiB + 5, spill::MiB}, Cut{9 * spill::MiB + 5, spill::MiB},
                  Cut{9 * spill::MiB + 5, 8 * spill::MiB + 4096}}) {
    for (bool verify : {true, false}) {
      SUBCASE((std::to_string(cut.bytes) + " bytes, " + std::to_string(cut.kept) + " kept" +
               (verify ? ", verify_integrity" : ""))
                  .c_str()) {
        ScratchDir dir;
        spill::SpillArena arena(buffered_in(dir.path(), verify));
        const std::size_t n = cut.bytes;
        const auto src = pattern(n, 2);
        spill::Region r = spill_test::written_region(arena, src);
        truncate_spill_file(dir.path(), r.offset() + cut.kept);
        std::vector<unsigned char> dst(n);
        CHECK_THROWS_AS(r.read(dst.data(), n), spill::IoError);
        // The last MiB: past the cut in every case.
        CHECK_THROWS_AS(r.read(dst.data(), spill::MiB, n - spill::MiB), spill::IoError);
      }
    }
  }
}

// A file cut while resident reads copy it: the size check passed, and the copy from the mapping
// (hashed in the same pass) faults on the caller's thread, whose SIGBUS guard turns it into
// IoError. Timing decides where the cut lands (the rounds spread it over a read's duration; with
// the copy unguarded, 5 of 5 runs died of SIGBUS when it still ran slice by slice, so some land
// mid-copy); no round may kill the process.
TEST_CASE("mapping: a spill file cut while a resident read copies it is IoError, not SIGBUS") {
  for (bool verify : {true, false}) {
    SUBCASE(verify ? "verify_integrity" : "no verify_integrity") {
      for (int round = 0; round < 16; ++round) {
        ScratchDir dir;
        spill::SpillArena arena(buffered_in(dir.path(), verify));
        const std::size_t n = 12 * spill::MiB + 5;
        const auto src = pattern(n, 3);
        spill::Region r = spill_test::written_region(arena, src);
        const int fd = spill_test::reopen_spill_file(dir.path());
        REQUIRE(fd >= 0);
        std::thread cutter([&] {
          std::this_thread::sleep_for(std::chrono::microseconds(300 * round));
          (void)::ftruncate(fd, static_cast<off_t>(r.offset() + spill::MiB));
        });
        std::vector<unsigned char> dst(n);
        bool failed = false;
        for (int i = 0; i < 10000 && !failed; ++i) {
          try {
            r.read(dst.data(), n);
            REQUIRE(std::memcmp(dst.data(), src.data(), n) == 0);
          } catch (const spill::IoError& e) {
            CHECK(e.error_number() == EIO);
            failed = true;
          }
        }
        cutter.join();
        ::close(fd);
        CHECK(failed);
      }
    }
  }
}
