// Helpers shared by the tests: arena options, the bytes written, subcase names for loops over
// settings, the spill file reopened, scratch directories, directory listings, a small
// loop-mounted ext4 file system for real "disk full" cases.
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "spill/arena.h"
#include "spill/units.h"

namespace spill_test {

namespace fs = std::filesystem;

// Options for an arena of `capacity_bytes` in `dir` that moves bytes through `io` and `backend`
// with a staging pool of `staging_bytes`; every other option is ArenaOptions' default.
inline spill::ArenaOptions options_in(
    const std::string& dir, std::uint64_t capacity_bytes,
    spill::IoMode io = spill::ArenaOptions{}.io,
    spill::IoBackend backend = spill::ArenaOptions{}.io_backend,
    std::uint64_t staging_bytes = spill::ArenaOptions{}.staging_bytes) {
  spill::ArenaOptions o;
  o.directory = dir;
  o.capacity_bytes = capacity_bytes;
  o.io = io;
  o.io_backend = backend;
  o.staging_bytes = staging_bytes;
  return o;
}

// ... on `backing`, with the default I/O settings.
inline spill::ArenaOptions options_in(const std::string& dir, std::uint64_t capacity_bytes,
                                      spill::Backing backing) {
  spill::ArenaOptions o = options_in(dir, capacity_bytes);
  o.backing = backing;
  return o;
}

// An arena for the engine's tests: 32 MiB, a 1 MiB staging pool, the given I/O settings.
inline spill::ArenaOptions engine_options(const std::string& dir, spill::IoMode io,
                                          spill::IoBackend backend,
                                          spill::Backing backing = spill::Backing::disk) {
  spill::ArenaOptions o = options_in(dir, 32 * spill::MiB, io, backend, spill::MiB);
  o.backing = backing;
  return o;
}

// `n` bytes that differ from those of a neighbouring offset or another seed: what the tests write
// and expect back. `Byte` is unsigned char, or char for APIs that take chars.
template <class Byte = unsigned char>
std::vector<Byte> pattern(std::size_t n, unsigned seed) {
  std::vector<Byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<Byte>((i * 131 + seed) >> 3);
  return v;
}

// The names of the settings a subcase runs with ("direct, io_uring, EIO"): each combination of a
// loop over settings runs as a SUBCASE of its own, so every failing one is reported, by name.
inline std::string setting_name(const char* name) { return name; }
inline std::string setting_name(const std::string& name) { return name; }
inline std::string setting_name(spill::IoMode mode) { return spill::to_string(mode); }
inline std::string setting_name(spill::IoBackend backend) { return spill::to_string(backend); }
inline std::string setting_name(spill::Backing backing) { return spill::to_string(backing); }
inline std::string errno_name(int error) {
#ifdef __GLIBC__
  if (const char* name = strerrorname_np(error)) return name;
#endif
  return "errno " + std::to_string(error);
}
template <class... Settings>
std::string subcase_name(const Settings&... settings) {
  std::string name;
  ((name += (name.empty() ? "" : ", ") + setting_name(settings)), ...);
  return name;
}

// A descriptor of its own for the arena's unnamed spill file in `dir`, opened once more through
// /proc/self/fd (as a failing disk or another process would); -1 if no descriptor of this
// process refers to a file there. The caller closes it.
inline int reopen_spill_file(const std::string& dir) {
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = fs::read_symlink(entry.path(), ec).string();
    if (ec || target.rfind(dir + "/", 0) != 0) continue;
    const int fd = ::open(entry.path().c_str(), O_RDWR | O_CLOEXEC);
    if (fd >= 0) return fd;
  }
  return -1;
}

// The arena's unnamed spill file in `dir` cut to `bytes` (as a failing disk or another process
// would).
inline void truncate_spill_file(const std::string& dir, std::uint64_t bytes) {
  const int fd = reopen_spill_file(dir);
  if (fd < 0) FAIL("no descriptor of this process refers to a file in " << dir);
  const int rc = ::ftruncate(fd, static_cast<off_t>(bytes));
  ::close(fd);
  REQUIRE(rc == 0);
}

// A new region holding `src`, written synchronously.
inline spill::Region written_region(spill::SpillArena& arena,
                                    const std::vector<unsigned char>& src) {
  spill::Region r = arena.allocate(src.size());
  r.write(src.data(), src.size());
  return r;
}

// The first `bytes` of a region, read back synchronously.
inline std::vector<unsigned char> read_back(const spill::Region& region, std::size_t bytes) {
  std::vector<unsigned char> dst(bytes);
  region.read(dst.data(), dst.size());
  return dst;
}

// A fresh directory under the default spill directory (on disk, even where /tmp is tmpfs),
// removed with everything in it at the end.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = spill::default_spill_directory() + "/spillarena-test-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::set<std::string> list_dir(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename());
  return names;
}

// A small loop-mounted file system image (root only): ext4 by default; `mkfs` and
// `mount_options` choose another (e.g. "mkfs.ext2", "ro"). ok() is false, with a reason, where
// it cannot be made.
class LoopMount {
 public:
  explicit LoopMount(int size_mib, const std::string& mkfs = "mkfs.ext4",
                     const std::string& mount_options = "loop") {
    if (geteuid() != 0) {
      reason_ = "not running as root";
      return;
    }
    image_ = scratch_.path() + "/fs.img";
    mount_point_ = scratch_.path() + "/mnt";
    fs::create_directory(mount_point_);
    const std::string cmd = "truncate -s " + std::to_string(size_mib) + "M " + image_ + " && " +
                            mkfs + " -q -F " + image_ + " >/dev/null 2>&1 && mount -o " +
                            mount_options + " " + image_ + " " + mount_point_ + " 2>/dev/null";
    mounted_ = std::system(cmd.c_str()) == 0;
    if (!mounted_) reason_ = mkfs + " or mount -o " + mount_options + " failed (no loop devices?)";
  }
  ~LoopMount() {
    if (mounted_) std::system(("umount " + mount_point_).c_str());
  }
  bool ok() const { return mounted_; }
  const std::string& reason() const { return reason_; }
  const std::string& path() const { return mount_point_; }

 private:
  ScratchDir scratch_;
  std::string image_;
  std::string mount_point_;
  std::string reason_;
  bool mounted_ = false;
};

}  // namespace spill_test
