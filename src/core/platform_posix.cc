// The POSIX half of platform.h: the calls every POSIX system has. What only Linux has is in
// platform_linux.cc (platform_other.cc elsewhere); see platform.h for the split and the contract.
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "platform.h"
#include "platform_os.h"

#ifndef MAP_NORESERVE
#define MAP_NORESERVE 0  // a hint; systems without it reserve nothing up front anyway
#endif

namespace spill::platform {

using os::close_with;
using os::retry_eintr;

// ---------------------------------------------------------------------------------------------
// What this system offers
// ---------------------------------------------------------------------------------------------

const Capabilities& capabilities() {
  static const Capabilities filled = [] {
    Capabilities c = os::capabilities();
    c.page_size_bytes = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
    return c;
  }();
  return filled;
}

// ---------------------------------------------------------------------------------------------
// Files and file systems
// ---------------------------------------------------------------------------------------------

int os::close_with(int fd, int e) {
  close(fd);
  return e;
}

int check_writable_directory(const std::string& directory) {
  struct stat s;
  if (stat(directory.c_str(), &s) != 0) return errno;
  if (!S_ISDIR(s.st_mode)) return ENOTDIR;
  if (access(directory.c_str(), W_OK | X_OK) != 0) return errno;
  return 0;
}

namespace {

// Note [Unnamed spill file]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// The spill file never has a name another process could open. O_TMPFILE makes the inode without
// a directory entry, and O_EXCL keeps it so: without it, linkat through /proc/self/fd could give
// it one. O_TMPFILE needs support from the system (Linux: os::open_tmpfile in platform_linux.cc)
// and the file system (ext4, xfs, btrfs, tmpfs have it; some FUSE and network file systems do
// not), so the fallback is mkostemp (O_CREAT | O_EXCL, mode 0600: a name already there, a
// planted symlink included, is never opened) and unlink at once; the name then exists for
// microseconds. Someone who may write the directory could rename the file in that window and
// keep a name for it, so a link count above 0 after the unlink is refused. The mode is set to
// 0600 whatever the umask, so another user's open through /proc/<pid>/fd is refused; the direct
// reopen through /proc/self/fd checks device and inode, not the mode. Nothing survives the
// process either way: the kernel frees the blocks when the last descriptor closes.
bool tmpfile_unsupported(int e) { return e == EOPNOTSUPP || e == EISDIR || e == EINVAL; }

int open_named_then_unlinked(const std::string& directory, int* fd) {
  std::string pattern = directory + "/.spillarena-XXXXXX";
  const int f = mkostemp(pattern.data(), O_CLOEXEC);
  if (f < 0) return errno;
  if (unlink(pattern.c_str()) != 0) return close_with(f, errno);
  struct stat s;
  if (fstat(f, &s) != 0) return close_with(f, errno);
  if (s.st_nlink != 0) return close_with(f, EEXIST);  // renamed before the unlink: still named
  *fd = f;
  return 0;
}

}  // namespace

int open_unnamed_file(const std::string& directory, int* fd, bool* used_tmpfile) {
  int f = -1;
  const int e = capabilities().unnamed_files ? os::open_tmpfile(directory, &f) : EOPNOTSUPP;
  if (e != 0 && !tmpfile_unsupported(e)) return e;
  *used_tmpfile = e == 0;
  if (e != 0) {
    if (int fallback = open_named_then_unlinked(directory, &f); fallback != 0) return fallback;
  }
  if (fchmod(f, 0600) != 0) return close_with(f, errno);
  *fd = f;
  return 0;
}

int create_new_file(const std::string& path, int* fd) {
  const int f = static_cast<int>(retry_eintr([&] {
    return open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  }));
  if (f < 0) return errno;
  *fd = f;
  return 0;
}

int open_for_reading(const std::string& path, int* fd) {
  const int f = static_cast<int>(
      retry_eintr([&] { return open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC); }));
  if (f < 0) return errno;
  *fd = f;
  return 0;
}

int file_status(int fd, FileStatus* status) {
  struct stat s;
  if (fstat(fd, &s) != 0) return errno;
  status->device = static_cast<std::uint64_t>(s.st_dev);
  status->inode = static_cast<std::uint64_t>(s.st_ino);
  status->size_bytes = static_cast<std::uint64_t>(s.st_size);
  status->links = static_cast<std::uint64_t>(s.st_nlink);
  status->change_time_ns = static_cast<std::uint64_t>(s.st_ctim.tv_sec) * 1000000000ull +
                           static_cast<std::uint64_t>(s.st_ctim.tv_nsec);
  status->mode = static_cast<std::uint32_t>(s.st_mode & 07777);
  return 0;
}

int remove_file(const std::string& path) { return unlink(path.c_str()) == 0 ? 0 : errno; }

int close_file(int fd) { return close(fd) == 0 ? 0 : errno; }

// ---------------------------------------------------------------------------------------------
// Mappings
// ---------------------------------------------------------------------------------------------

int map_anonymous(std::uint64_t bytes, void** addr) {
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) return errno;
  *addr = p;
  return 0;
}

int map_shared_file(int fd, std::uint64_t bytes, void** addr) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return errno;
  *addr = p;
  return 0;
}

int unmap(void* addr, std::uint64_t bytes) { return munmap(addr, bytes) == 0 ? 0 : errno; }

// posix_madvise is POSIX's spelling of madvise(MADV_WILLNEED); it returns the error itself.
int advise_will_need(void* addr, std::uint64_t bytes) {
  return posix_madvise(addr, bytes, POSIX_MADV_WILLNEED);
}

// ---------------------------------------------------------------------------------------------
// Bulk I/O
// ---------------------------------------------------------------------------------------------

namespace {

// One pwrite or pread as the fault hook shapes it: at most the verdict's bytes, or its error.
template <class Call>
long shaped(testing::FaultSite site, std::uint64_t bytes, std::uint64_t offset, Call call) {
  const std::int64_t verdict = fault_verdict(site, bytes, offset);
  if (verdict < 0) {
    errno = static_cast<int>(-verdict);
    return -1;
  }
  return verdict == 0 ? 0 : call(static_cast<std::uint64_t>(verdict));
}

}  // namespace

int write_at(int fd, const void* src, std::uint64_t bytes, std::uint64_t offset) {
  const char* p = static_cast<const char*>(src);
  while (bytes > 0) {
    const long n = retry_eintr([&] {
      return shaped(testing::FaultSite::pwrite, bytes, offset, [&](std::uint64_t len) {
        return pwrite(fd, p, len, static_cast<off_t>(offset));
      });
    });
    if (n < 0) return errno;
    if (n == 0) return EIO;
    p += n;
    bytes -= static_cast<std::uint64_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return 0;
}

int read_at(int fd, void* dst, std::uint64_t bytes, std::uint64_t offset) {
  char* p = static_cast<char*>(dst);
  while (bytes > 0) {
    const long n = retry_eintr([&] {
      return shaped(testing::FaultSite::pread, bytes, offset, [&](std::uint64_t len) {
        return pread(fd, p, len, static_cast<off_t>(offset));
      });
    });
    if (n < 0) return errno;
    if (n == 0) return EIO;  // end of file: the range was never written or the file shrank
    p += n;
    bytes -= static_cast<std::uint64_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Process facts
// ---------------------------------------------------------------------------------------------

std::uint64_t process_id() { return static_cast<std::uint64_t>(getpid()); }

std::uint64_t physical_memory_bytes() {
  return static_cast<std::uint64_t>(sysconf(_SC_PHYS_PAGES)) * capabilities().page_size_bytes;
}

std::string temp_directory() {
  const char* tmpdir = std::getenv("TMPDIR");
  if (tmpdir != nullptr && *tmpdir != '\0') return tmpdir;
  return "/tmp";
}

}  // namespace spill::platform
