// Linux implementation of platform.h. The only file that includes Linux headers.
#include "platform.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <malloc.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <vector>

namespace spill::platform {
namespace {

#ifndef HUGETLBFS_MAGIC
#define HUGETLBFS_MAGIC 0x958458f6
#endif

std::string type_name_of(long magic) {
  switch (static_cast<unsigned long>(magic)) {
    case EXT4_SUPER_MAGIC: return "ext4";
    case TMPFS_MAGIC: return "tmpfs";
    case RAMFS_MAGIC: return "ramfs";
    case HUGETLBFS_MAGIC: return "hugetlbfs";
    case XFS_SUPER_MAGIC: return "xfs";
    case BTRFS_SUPER_MAGIC: return "btrfs";
    case OVERLAYFS_SUPER_MAGIC: return "overlayfs";
    case NFS_SUPER_MAGIC: return "nfs";
    case 0x65735546: return "fuse";
    case 0xf15f: return "ecryptfs";
    case 0x2011BAB0: return "exfat";
    case 0x4d44: return "vfat";
    default: break;
  }
  char text[32];
  std::snprintf(text, sizeof text, "0x%lx", static_cast<unsigned long>(magic));
  return text;
}

bool is_ram_backed(long magic) {
  auto m = static_cast<unsigned long>(magic);
  return m == TMPFS_MAGIC || m == RAMFS_MAGIC || m == HUGETLBFS_MAGIC;
}

// Retries an fd call that may be interrupted by a signal; returns the call's result or -1.
template <class Call>
long retry_eintr(Call call) {
  long r;
  do {
    r = call();
  } while (r < 0 && errno == EINTR);
  return r;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Files and file systems
// ---------------------------------------------------------------------------------------------

int file_system_info(const std::string& directory, FileSystemInfo* info) {
  struct statfs s;
  if (statfs(directory.c_str(), &s) != 0) return errno;
  info->free_bytes = static_cast<std::uint64_t>(s.f_bavail) * static_cast<std::uint64_t>(s.f_bsize);
  info->total_bytes = static_cast<std::uint64_t>(s.f_blocks) * static_cast<std::uint64_t>(s.f_bsize);
  info->type_name = type_name_of(s.f_type);
  info->ram_backed = is_ram_backed(s.f_type);
  return 0;
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
// it one. O_TMPFILE needs file-system support (ext4, xfs, btrfs, tmpfs have it; some FUSE and
// network file systems do not), so the fallback is mkostemp (O_CREAT | O_EXCL, mode 0600: a name
// already there, a planted symlink included, is never opened) and unlink at once; the name then
// exists for microseconds. Someone who may write the directory could rename the file in that
// window and keep a name for it, so a link count above 0 after the unlink is refused. The mode is
// set to 0600 whatever the umask (the reopen through /proc/self/fd checks it). Nothing survives
// the process either way: the kernel frees the blocks when the last descriptor closes.
int open_tmpfile(const std::string& directory, int extra_flags) {
  if (std::int64_t v = fault_verdict(FaultSite::o_tmpfile, 0, 0); v < 0) {
    errno = static_cast<int>(-v);
    return -1;
  }
  return static_cast<int>(retry_eintr([&] {
    return open(directory.c_str(), O_TMPFILE | O_EXCL | O_RDWR | O_CLOEXEC | extra_flags, 0600);
  }));
}

bool tmpfile_unsupported(int e) { return e == EOPNOTSUPP || e == EISDIR || e == EINVAL; }

// Closes f and returns e: the error path of the functions below.
int close_with(int f, int e) {
  close(f);
  return e;
}

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
  int f = open_tmpfile(directory, 0);
  if (f < 0 && !tmpfile_unsupported(errno)) return errno;
  *used_tmpfile = f >= 0;
  if (f < 0) {
    if (int e = open_named_then_unlinked(directory, &f); e != 0) return e;
  }
  if (fchmod(f, 0600) != 0) return close_with(f, errno);
  *fd = f;
  return 0;
}

int open_unnamed_direct_file(const std::string& directory, int* fd) {
  const int f = open_tmpfile(directory, O_DIRECT);
  if (f < 0) return errno;
  *fd = f;
  return 0;
}

// The file is opened twice (see Note [Direct descriptor] in src/spill_file.cc). /proc/self/fd/N
// is a magic link to this process's own descriptor (O_NOFOLLOW would refuse it); the reopened
// file is checked to be the same inode all the same.
int reopen_direct(int fd, int* direct_fd, std::uint64_t* alignment) {
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const int f = static_cast<int>(
      retry_eintr([&] { return open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC); }));
  if (f < 0) return errno;
  struct stat original, reopened;
  if (fstat(fd, &original) != 0 || fstat(f, &reopened) != 0) return close_with(f, errno);
  if (original.st_dev != reopened.st_dev || original.st_ino != reopened.st_ino) {
    return close_with(f, EXDEV);
  }
  *alignment = page_size_bytes();
#if defined(STATX_DIOALIGN)
  struct statx sx;
  if (statx(f, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) &&
      sx.stx_dio_offset_align > 0) {
    *alignment = std::max<std::uint64_t>(sx.stx_dio_offset_align, sx.stx_dio_mem_align);
  }
#endif
  *direct_fd = f;
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

int preallocate(int fd, std::uint64_t bytes) {
  if (retry_eintr([&] { return fallocate(fd, 0, 0, static_cast<off_t>(bytes)); }) != 0) {
    return errno;
  }
  return 0;
}

int close_file(int fd) { return close(fd) == 0 ? 0 : errno; }

// ---------------------------------------------------------------------------------------------
// Mappings
// ---------------------------------------------------------------------------------------------

int map_anonymous(std::uint64_t bytes, void** addr) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
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

int pages_resident(void* addr, std::uint64_t bytes, std::uint64_t* resident_bytes) {
  const std::uint64_t page = page_size_bytes();
  std::vector<unsigned char> vec((bytes + page - 1) / page);
  if (mincore(addr, bytes, vec.data()) != 0) return errno;
  const auto pages = std::count_if(vec.begin(), vec.end(), [](unsigned char v) { return (v & 1) != 0; });
  *resident_bytes = std::min<std::uint64_t>(static_cast<std::uint64_t>(pages) * page, bytes);
  return 0;
}

int unmap_pages(void* addr, std::uint64_t bytes) {
  return madvise(addr, bytes, MADV_DONTNEED) == 0 ? 0 : errno;
}

int advise_will_need(void* addr, std::uint64_t bytes) {
  return madvise(addr, bytes, MADV_WILLNEED) == 0 ? 0 : errno;
}

// ---------------------------------------------------------------------------------------------
// Bulk I/O and page-cache control
// ---------------------------------------------------------------------------------------------

namespace {

// One pwrite or pread as the fault hook shapes it: at most the verdict's bytes, or its error.
template <class Call>
long shaped(FaultSite site, std::uint64_t bytes, std::uint64_t offset, Call call) {
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
      return shaped(FaultSite::pwrite, bytes, offset, [&](std::uint64_t len) {
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
      return shaped(FaultSite::pread, bytes, offset, [&](std::uint64_t len) {
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

int start_writeback(int fd, std::uint64_t offset, std::uint64_t bytes) {
  if (sync_file_range(fd, static_cast<off_t>(offset), static_cast<off_t>(bytes),
                      SYNC_FILE_RANGE_WRITE) != 0) {
    return errno;
  }
  return 0;
}

int drop_cached_pages(int fd, std::uint64_t offset, std::uint64_t bytes) {
  const unsigned flags =
      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER;
  if (sync_file_range(fd, static_cast<off_t>(offset), static_cast<off_t>(bytes), flags) != 0) {
    return errno;
  }
  return posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(bytes),
                       POSIX_FADV_DONTNEED);
}

int prefetch_range(int fd, std::uint64_t offset, std::uint64_t bytes) {
  return posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(bytes),
                       POSIX_FADV_WILLNEED);
}

// ---------------------------------------------------------------------------------------------
// Process facts
// ---------------------------------------------------------------------------------------------

std::uint64_t page_size_bytes() { return static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE)); }

std::uint64_t process_id() { return static_cast<std::uint64_t>(getpid()); }

std::uint64_t physical_memory_bytes() {
  return static_cast<std::uint64_t>(sysconf(_SC_PHYS_PAGES)) * page_size_bytes();
}

namespace {

// The "Key:  N kB" field of a /proc file, in bytes (0 when absent or unreadable).
std::uint64_t proc_kib_field(const char* file, const std::string& wanted) {
  std::ifstream in(file);
  std::string key;
  while (in >> key) {
    if (key == wanted) {
      std::uint64_t kib = 0;
      in >> kib;
      return kib * 1024;
    }
    in.ignore(4096, '\n');
  }
  return 0;
}

}  // namespace

std::uint64_t resident_anonymous_bytes() { return proc_kib_field("/proc/self/status", "RssAnon:"); }

std::uint64_t mem_available_bytes() { return proc_kib_field("/proc/meminfo", "MemAvailable:"); }

namespace {

// Note [Reading the memory cgroup]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// /proc/self/cgroup names this process's cgroup per hierarchy: "0::/path" for v2, and
// "N:memory:/path" (or "N:...,memory,...:/path") for v1's memory controller. Inside a container
// the path may not exist under /sys/fs/cgroup (the namespace root is mounted instead), so the
// path is tried first and the mount's root second.
bool read_number(const std::string& file, std::uint64_t* value) {
  std::ifstream in(file);
  std::string text;
  if (!(in >> text)) return false;
  if (text == "max") {
    *value = 0;
    return true;
  }
  try {
    *value = std::stoull(text);
  } catch (const std::exception&) {
    return false;
  }
  if (*value >= (1ull << 62)) *value = 0;  // v1 "unlimited" is LONG_MAX rounded to pages
  return true;
}

std::string cgroup_path(const std::string& controller_match) {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const auto first = line.find(':');
    const auto second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const bool match = controller_match.empty()
                           ? line.compare(0, 3, "0::") == 0
                           : ("," + controllers + ",").find("," + controller_match + ",") !=
                                 std::string::npos;
    if (match) return line.substr(second + 1);
  }
  return "";
}

bool cgroup_dir(const std::string& root, const std::string& path, const std::string& probe,
                std::string* dir) {
  for (const std::string& candidate : {root + path, root}) {
    if (access((candidate + "/" + probe).c_str(), R_OK) == 0) {
      *dir = candidate;
      return true;
    }
  }
  return false;
}

}  // namespace

int memory_cgroup(CgroupMemory* out) {
  *out = CgroupMemory{};
  std::string dir;
  const std::string v1 = cgroup_path("memory");
  if (!v1.empty() && cgroup_dir("/sys/fs/cgroup/memory", v1, "memory.limit_in_bytes", &dir)) {
    out->version = 1;
    read_number(dir + "/memory.limit_in_bytes", &out->limit_bytes);
    read_number(dir + "/memory.usage_in_bytes", &out->usage_bytes);
    read_number(dir + "/memory.max_usage_in_bytes", &out->peak_bytes);
    return 0;
  }
  const std::string v2 = cgroup_path("");
  if (!v2.empty() && cgroup_dir("/sys/fs/cgroup", v2, "memory.max", &dir)) {
    out->version = 2;
    read_number(dir + "/memory.max", &out->limit_bytes);
    read_number(dir + "/memory.current", &out->usage_bytes);
    read_number(dir + "/memory.peak", &out->peak_bytes);
  }
  return 0;
}

std::string temp_directory() {
  const char* tmpdir = std::getenv("TMPDIR");
  if (tmpdir != nullptr && *tmpdir != '\0') return tmpdir;
  return "/tmp";
}

bool stdout_is_terminal() { return isatty(STDOUT_FILENO) == 1; }

void set_malloc_mmap_threshold(std::uint64_t bytes) {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(bytes));
  mallopt(M_TRIM_THRESHOLD, static_cast<int>(bytes));
  malloc_trim(0);  // what the heap already holds free goes back too
#endif
}

// ---------------------------------------------------------------------------------------------
// Test-only: fault injection
// ---------------------------------------------------------------------------------------------

// Note [Fault injection at the seam]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Tests prove what happens when the disk misbehaves (EIO, ENOSPC, short counts, end of file)
// without a failing disk: every pwrite and pread of write_at/read_at, every read or write piece
// the io_uring backend submits, and the O_TMPFILE open ask fault_verdict first, as tcmalloc
// wraps mincore for its tests. A short count is real, not a relabelled completion: only that many
// bytes move (io_uring gets the shorter length in its submission), so a loop or a reaper that
// dropped the remainder would lose data and a round-trip test sees it. Errors move nothing. With
// no hook the cost is one relaxed load of `armed` per call; the hook itself is copied out under a
// mutex, so a test may remove it while a worker thread is still calling it.
namespace {
std::atomic<bool> armed{false};
std::mutex hook_mutex;
std::shared_ptr<const FaultHook> installed;  // guarded by hook_mutex
}  // namespace

void set_fault_hook(FaultHook hook) {
  std::lock_guard<std::mutex> lock(hook_mutex);
  installed = hook ? std::make_shared<const FaultHook>(std::move(hook)) : nullptr;
  armed.store(installed != nullptr, std::memory_order_relaxed);
}

std::int64_t fault_verdict(FaultSite site, std::uint64_t bytes, std::uint64_t offset) {
  const auto all = static_cast<std::int64_t>(bytes);
  if (!armed.load(std::memory_order_relaxed)) return all;
  std::shared_ptr<const FaultHook> hook;
  {
    std::lock_guard<std::mutex> lock(hook_mutex);
    hook = installed;
  }
  return hook ? std::min(all, (*hook)(site, bytes, offset)) : all;
}

}  // namespace spill::platform
