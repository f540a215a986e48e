// Errors blame what failed: a process out of file descriptors is told so, never that its
// directory is unusable or that the file system refuses O_DIRECT (issue 19). See Note [Who
// refused O_DIRECT] in src/core/file/spill_file.cc.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include "io_test_support.h"
#include "spill/core.h"
#include "test_support.h"

using spill_test::FaultScope;
using spill_test::list_dir;
using spill_test::ScratchDir;

namespace {

// A 1 MiB arena in `dir`; a 1 MiB staging pool in direct mode.
spill::ArenaOptions small_arena_in(const std::string& dir, spill::IoMode io) {
  return spill_test::options_in(dir, spill::MiB, io, spill::IoBackend::automatic, spill::MiB);
}

int highest_open_descriptor() {
  int highest = 0;
  for (const auto& entry : spill_test::fs::directory_iterator("/proc/self/fd")) {
    highest = std::max(highest, std::stoi(entry.path().filename().string()));
  }
  return highest;
}

// Lowers RLIMIT_NOFILE and takes every descriptor but `left` for its lifetime.
class DescriptorsLeft {
 public:
  explicit DescriptorsLeft(int left) {
    REQUIRE(getrlimit(RLIMIT_NOFILE, &saved_) == 0);
    rlimit lowered = saved_;
    lowered.rlim_cur =
        std::min<rlim_t>(saved_.rlim_cur, static_cast<rlim_t>(highest_open_descriptor() + 64));
    REQUIRE(setrlimit(RLIMIT_NOFILE, &lowered) == 0);
    for (int fd; (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) held_.push_back(fd);
    REQUIRE(errno == EMFILE);
    for (int i = 0; i < left && !held_.empty(); ++i) {
      close(held_.back());
      held_.pop_back();
    }
  }
  ~DescriptorsLeft() {
    for (int fd : held_) close(fd);
    setrlimit(RLIMIT_NOFILE, &saved_);
  }
  DescriptorsLeft(const DescriptorsLeft&) = delete;
  DescriptorsLeft& operator=(const DescriptorsLeft&) = delete;

 private:
  rlimit saved_{};
  std::vector<int> held_;
};

// The arena is refused with a PathError that names EMFILE and the fix, and nothing else.
void check_blames_descriptors(const spill::ArenaOptions& o) {
  try {
    spill::SpillArena arena(o);
    FAIL("the arena was made without a free descriptor");
  } catch (const spill::DirectoryError& e) {
    FAIL("the directory was blamed: " << std::string(e.what()));
  } catch (const spill::PathError& e) {
    const std::string message = e.what();
    CAPTURE(message);
    CHECK(e.error_number() == EMFILE);
    CHECK(e.path() == o.directory);
    CHECK(message.find("no file descriptor left") != std::string::npos);
    CHECK(message.find("ulimit -n") != std::string::npos);
    CHECK(message.find("refuses O_DIRECT") == std::string::npos);
    CHECK(message.find("O_DIRECT is refused") == std::string::npos);
  } catch (const spill::Error& e) {
    FAIL("another error: " << std::string(e.what()));
  }
}

}  // namespace

TEST_CASE("errno: no descriptor left for the spill file is named as such, not the directory") {
  ScratchDir dir;
  FaultScope no_descriptor(
      [](spill::testing::FaultSite site, std::uint64_t bytes, std::uint64_t) -> std::int64_t {
        if (site == spill::testing::FaultSite::open_unnamed) return -EMFILE;
        return static_cast<std::int64_t>(bytes);
      });
  for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
    SUBCASE(spill_test::subcase_name(io).c_str()) {
      check_blames_descriptors(small_arena_in(dir.path(), io));
    }
  }
  CHECK(list_dir(dir.path()).empty());
}

TEST_CASE(
    "errno: no descriptor left for the O_DIRECT reopen is named as such, not the file system") {
  ScratchDir dir;
  {
    DescriptorsLeft one(1);  // the spill file takes it; the direct reopen finds none
    check_blames_descriptors(small_arena_in(dir.path(), spill::IoMode::direct));
  }
  CHECK(list_dir(dir.path()).empty());
  spill::SpillArena works(small_arena_in(dir.path(), spill::IoMode::buffered));  // limits restored
}
