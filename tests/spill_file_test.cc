// The spill file as the arena creates it: vetted directory, no name, preallocated, gone after.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <vector>

#include "spill/core.h"
#include "test_support.h"

using spill_test::list_dir;
using spill_test::LoopMount;
using spill_test::options_in;
using spill_test::ScratchDir;

namespace {
std::uint64_t free_bytes(const std::string& dir) {
  struct statfs s;
  REQUIRE(statfs(dir.c_str(), &s) == 0);
  return static_cast<std::uint64_t>(s.f_bavail) * s.f_bsize;
}
}  // namespace

TEST_CASE("spill file: has no name in the directory and leaves it unchanged") {
  ScratchDir dir;
  const auto before = list_dir(dir.path());
  {
    spill::SpillArena arena(options_in(dir.path(), 8 * spill::MiB));
    spill::Region r = arena.allocate(spill::MiB);
    std::vector<char> bytes(spill::MiB, 'x');
    r.write(bytes.data(), bytes.size());
    CHECK(list_dir(dir.path()) == before);
  }
  CHECK(list_dir(dir.path()) == before);
}

TEST_CASE("spill file: nothing is left on disk after kill -9") {
  ScratchDir dir;
  const auto before = list_dir(dir.path());
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    spill::SpillArena arena(options_in(dir.path(), 16 * spill::MiB));
    spill::Region r = arena.allocate(spill::MiB);
    raise(SIGKILL);
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  CHECK(list_dir(dir.path()) == before);
}

TEST_CASE("spill file: a directory in RAM (tmpfs) is refused unless allowed") {
  if (!spill_test::fs::exists("/dev/shm")) {
    MESSAGE("skipped: no /dev/shm on this machine");
    return;
  }
  try {
    spill::SpillArena arena(options_in("/dev/shm", spill::MiB));
    FAIL("a tmpfs directory was accepted");
  } catch (const spill::MemoryBackedDirectoryError& e) {
    CHECK(e.path() == "/dev/shm");
    CHECK(e.file_system_type() == "tmpfs");
    CHECK(std::string(e.what()).find("allow_memory_backed_directory") != std::string::npos);
  }
  spill::ArenaOptions allowed = options_in("/dev/shm", spill::MiB);
  allowed.allow_memory_backed_directory = true;
  spill::SpillArena arena(allowed);
  CHECK(arena.file_system_type() == "tmpfs");
}

TEST_CASE("spill file: a missing directory is refused with its path") {
  ScratchDir dir;
  const std::string missing = dir.path() + "/does-not-exist";
  try {
    spill::SpillArena arena(options_in(missing, spill::MiB));
    FAIL("a missing directory was accepted");
  } catch (const spill::DirectoryError& e) {
    CHECK(e.path() == missing);
    CHECK(e.error_number() == ENOENT);
    CHECK(std::string(e.what()).find(missing) != std::string::npos);
  }
}

TEST_CASE("spill file: a regular file as directory is refused") {
  ScratchDir dir;
  const std::string file = dir.path() + "/plain";
  {
    std::ofstream(file) << "x";
  }
  CHECK_THROWS_AS(spill::SpillArena(options_in(file, spill::MiB)), spill::DirectoryError);
}

TEST_CASE("spill file: an unwritable directory is refused") {
  if (geteuid() == 0) {
    MESSAGE("skipped: root may write anywhere");
    return;
  }
  ScratchDir dir;
  spill_test::fs::permissions(
      dir.path(), spill_test::fs::perms::owner_read | spill_test::fs::perms::owner_exec);
  CHECK_THROWS_AS(spill::SpillArena(options_in(dir.path(), spill::MiB)), spill::DirectoryError);
  spill_test::fs::permissions(dir.path(), spill_test::fs::perms::owner_all);
}

TEST_CASE("spill file: more capacity than free space is refused before anything is written") {
  ScratchDir dir;
  const std::uint64_t free_now = free_bytes(dir.path());
  const auto before = list_dir(dir.path());
  try {
    spill::SpillArena arena(options_in(dir.path(), free_now + spill::GiB));
    FAIL("an arena larger than the free space was accepted");
  } catch (const spill::InsufficientSpaceError& e) {
    CHECK(e.needed_bytes() >= free_now + spill::GiB);
    CHECK(e.available_bytes() > 0);
    CHECK(std::string(e.what()).find(std::to_string(e.needed_bytes())) != std::string::npos);
  }
  CHECK(list_dir(dir.path()) == before);
}

TEST_CASE("spill file: the file is preallocated, not sparse") {
  LoopMount mount(64);
  if (!mount.ok()) {
    MESSAGE("skipped: " << mount.reason());
    return;
  }
  const std::uint64_t before = free_bytes(mount.path());
  spill::SpillArena arena(options_in(mount.path(), 24 * spill::MiB));
  CHECK(free_bytes(mount.path()) <= before - 24 * spill::MiB);
}

TEST_CASE("spill file: a real disk full at construction is a typed error and leaves nothing") {
  LoopMount mount(64);
  if (!mount.ok()) {
    MESSAGE("skipped: " << mount.reason());
    return;
  }
  // Fill most of the file system, then ask for more than is left.
  spill::SpillArena hog(options_in(mount.path(), 40 * spill::MiB));
  const std::uint64_t left = free_bytes(mount.path());
  const auto before = list_dir(mount.path());
  try {
    spill::SpillArena arena(options_in(mount.path(), 32 * spill::MiB));
    FAIL("an arena larger than the disk was accepted");
  } catch (const spill::InsufficientSpaceError& e) {
    CHECK(e.needed_bytes() == 32 * spill::MiB);
    CHECK(e.available_bytes() == left);
    CHECK(e.path() == mount.path());
  }
  CHECK(list_dir(mount.path()) == before);
  CHECK(free_bytes(mount.path()) == left);
  // What fits still works.
  spill::SpillArena small(options_in(mount.path(), left / 2));
  CHECK(small.allocate(spill::MiB).size() == spill::MiB);
}

TEST_CASE("spill file: a read-only file system is refused, even for root") {
  LoopMount mount(16, "mkfs.ext4", "loop,ro");
  if (!mount.ok()) {
    MESSAGE("skipped: " << mount.reason());
    return;
  }
  try {
    spill::SpillArena arena(options_in(mount.path(), spill::MiB));
    FAIL("a read-only directory was accepted");
  } catch (const spill::DirectoryError& e) {
    CHECK(e.error_number() == EROFS);
    CHECK(std::string(e.what()).find("not writable") != std::string::npos);
  }
}

TEST_CASE("spill file: a file system that cannot preallocate is refused, never made sparse") {
  // ext2 files have no extents; the kernel's fallocate refuses them (EOPNOTSUPP).
  LoopMount mount(32, "mkfs.ext2");
  if (!mount.ok()) {
    MESSAGE("skipped: " << mount.reason());
    return;
  }
  const auto before = list_dir(mount.path());
  try {
    spill::SpillArena arena(options_in(mount.path(), 4 * spill::MiB));
    // Accepted only where the kernel really preallocated: every block of the file allocated.
    const int fd = spill_test::reopen_spill_file(mount.path());
    REQUIRE(fd >= 0);
    struct stat s;
    REQUIRE(fstat(fd, &s) == 0);
    close(fd);
    CHECK(static_cast<std::uint64_t>(s.st_blocks) * 512 >= 4 * spill::MiB);
    MESSAGE("this kernel preallocates on ext2; the file has all its blocks");
  } catch (const spill::PreallocationError& e) {
    CHECK(e.error_number() == EOPNOTSUPP);
    CHECK(std::string(e.what()).find("SIGBUS") != std::string::npos);
  }
  CHECK(list_dir(mount.path()) == before);
}

namespace {
// An overlay mounted in a scratch directory whose upper layer is on tmpfs (`upper_in_ram`) or on
// the scratch directory's own disk; ok() is false without root or overlayfs.
class OverlayMount {
 public:
  explicit OverlayMount(bool upper_in_ram) {
    const std::string d = scratch_.path();
    merged_ = d + "/merged";
    const std::string layers = upper_in_ram ? d + "/ram" : d + "/disk";
    std::string cmd = "mkdir -p " + d + "/lower " + merged_ + " " + layers;
    if (upper_in_ram) cmd += " && mount -t tmpfs tmpfs " + layers;
    cmd += " && mkdir " + layers + "/upper " + layers +
           "/work && mount -t overlay overlay -o lowerdir=" + d + "/lower,upperdir=" + layers +
           "/upper,workdir=" + layers + "/work " + merged_ + " 2>/dev/null";
    ok_ = geteuid() == 0 && std::system(cmd.c_str()) == 0;
    ram_ = upper_in_ram ? layers : "";
  }
  ~OverlayMount() {
    std::system(("umount " + merged_ + " 2>/dev/null").c_str());
    if (!ram_.empty()) std::system(("umount " + ram_ + " 2>/dev/null").c_str());
  }
  bool ok() const { return ok_; }
  const std::string& path() const { return merged_; }

 private:
  ScratchDir scratch_;
  std::string merged_;
  std::string ram_;
  bool ok_ = false;
};
}  // namespace

TEST_CASE("spill file: an overlay whose upper layer is in RAM is refused; one on disk is not") {
  OverlayMount in_ram(true);
  OverlayMount on_disk(false);
  if (!in_ram.ok() || !on_disk.ok()) {
    MESSAGE("skipped: mounting tmpfs and overlay needs root and overlayfs");
    return;
  }
  try {
    spill::SpillArena arena(options_in(in_ram.path(), spill::MiB));
    FAIL("an overlay over tmpfs was accepted as a disk");
  } catch (const spill::MemoryBackedDirectoryError& e) {
    CHECK(e.file_system_type() == "overlayfs (upper layer on tmpfs)");
  }
  CHECK(list_dir(in_ram.path()).empty());
  spill::SpillArena arena(options_in(on_disk.path(), spill::MiB));
  CHECK(arena.file_system_type() == "overlayfs");
}
