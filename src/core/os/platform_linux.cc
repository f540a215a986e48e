// The Linux half of platform.h: what only Linux has (O_TMPFILE, O_DIRECT through /proc/self/fd,
// fallocate, sync_file_range, posix_fadvise, mincore, statfs magic numbers, /proc and cgroup
// files, glibc's malloc tuning). CMakeLists.txt compiles it on Linux, platform_other.cc
// elsewhere; the POSIX calls are in platform_posix.cc.
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "core/os/platform.h"
#include "core/os/platform_os.h"

namespace spill::platform {

using os::close_with;
using os::retry_eintr;

// ---------------------------------------------------------------------------------------------
// What Linux offers
// ---------------------------------------------------------------------------------------------

Capabilities os::capabilities() {
  Capabilities c;
  c.unnamed_files = true;      // O_TMPFILE since 3.11; the file system may still refuse it
  c.writeback_control = true;  // sync_file_range, posix_fadvise
  c.direct_io = true;          // O_DIRECT; the file system may still refuse it
  return c;
}

// ---------------------------------------------------------------------------------------------
// Files and file systems
// ---------------------------------------------------------------------------------------------

namespace {

#ifndef HUGETLBFS_MAGIC
#define HUGETLBFS_MAGIC 0x958458f6
#endif

std::string type_name_of(long magic) {
  switch (static_cast<unsigned long>(magic)) {
    case EXT4_SUPER_MAGIC:
      return "ext2/ext3/ext4";  // see ext_family_name
    case TMPFS_MAGIC:
      return "tmpfs";
    case RAMFS_MAGIC:
      return "ramfs";
    case HUGETLBFS_MAGIC:
      return "hugetlbfs";
    case XFS_SUPER_MAGIC:
      return "xfs";
    case BTRFS_SUPER_MAGIC:
      return "btrfs";
    case OVERLAYFS_SUPER_MAGIC:
      return "overlayfs";
    case NFS_SUPER_MAGIC:
      return "nfs";
    case 0x65735546:
      return "fuse";
    case 0xf15f:
      return "ecryptfs";
    case 0x2011BAB0:
      return "exfat";
    case 0x4d44:
      return "vfat";
    default:
      break;
  }
  char text[32];
  std::snprintf(text, sizeof text, "0x%lx", static_cast<unsigned long>(magic));
  return text;
}

// What /proc/self/mountinfo says after " - " about the mount a directory is on: its type and
// its super options (the line whose device, major:minor in the third field, is the directory's
// st_dev). Empty fields where that cannot be read.
struct MountEntry {
  std::string type;
  std::string super_options;  // "rw,lowerdir=...,upperdir=...,workdir=..."
};

MountEntry mount_entry_of(const std::string& directory) {
  struct stat s;
  if (stat(directory.c_str(), &s) != 0) return {};
  const std::string device =
      std::to_string(major(s.st_dev)) + ":" + std::to_string(minor(s.st_dev));
  std::ifstream mountinfo("/proc/self/mountinfo");
  std::string line;
  while (std::getline(mountinfo, line)) {
    std::istringstream fields(line);
    std::string mount_id, parent_id, dev;
    fields >> mount_id >> parent_id >> dev;
    const std::size_t dash = line.find(" - ");
    if (dev != device || dash == std::string::npos) continue;
    std::istringstream after_dash(line.substr(dash + 3));
    MountEntry entry;
    std::string source;
    after_dash >> entry.type >> source >> entry.super_options;
    return entry;
  }
  return {};
}

// Note [ext2, ext3 and ext4 share a magic number]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// statfs reports EXT4_SUPER_MAGIC (0xEF53) for all three, and only ext4 (extents) preallocates:
// "ext4 cannot preallocate" misled users of ext2 and ext3 (issue 19). The mount table says which
// it is (mount_entry_of). Where that cannot be read, the name says all three.
std::string ext_family_name(const std::string& directory) {
  const std::string type = mount_entry_of(directory).type;
  if (type == "ext2" || type == "ext3" || type == "ext4") return type;
  return "ext2/ext3/ext4";
}

// mountinfo writes a space, tab, newline and backslash in a path as octal escapes (\040 ...).
std::string unescape_mount_path(const std::string& text) {
  auto octal = [&](std::size_t at) { return text[at] >= '0' && text[at] <= '7'; };
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 3 < text.size() && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
      out += static_cast<char>(std::stoi(text.substr(i + 1, 3), nullptr, 8));
      i += 3;
    } else {
      out += text[i];
    }
  }
  return out;
}

// Note [An overlay's files live in its upper layer]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A file created on overlayfs (a container's root) is stored in the overlay's upper directory.
// When that is on tmpfs (a RAM-backed container root, `docker run --tmpfs`-style upper layers),
// statfs says "overlayfs" and the spill file would fill RAM while the arena counts it as disk
// (issue 19). So the upper directory named in the mount's super options is looked at as well:
// its file system decides whether the overlay is memory-backed. An overlay without an upper
// layer is read-only, and the file's creation fails on its own.
std::string overlay_upper_directory(const std::string& directory) {
  const MountEntry entry = mount_entry_of(directory);
  if (entry.type != "overlay") return "";
  std::istringstream options(entry.super_options);
  std::string option;
  while (std::getline(options, option, ',')) {
    if (option.rfind("upperdir=", 0) == 0) return unescape_mount_path(option.substr(9));
  }
  return "";
}

bool is_memory_backed(long magic) {
  auto m = static_cast<unsigned long>(magic);
  return m == TMPFS_MAGIC || m == RAMFS_MAGIC || m == HUGETLBFS_MAGIC;
}

}  // namespace

int file_system_info(const std::string& directory, FileSystemInfo* info) {
  struct statfs s;
  if (statfs(directory.c_str(), &s) != 0) return errno;
  info->free_bytes = static_cast<std::uint64_t>(s.f_bavail) * static_cast<std::uint64_t>(s.f_bsize);
  info->total_bytes =
      static_cast<std::uint64_t>(s.f_blocks) * static_cast<std::uint64_t>(s.f_bsize);
  info->type_name = static_cast<unsigned long>(s.f_type) == EXT4_SUPER_MAGIC
                        ? ext_family_name(directory)
                        : type_name_of(s.f_type);
  if (info->type_name.rfind("0x", 0) == 0) {  // a magic number not in the table: the mount's name
    const std::string mounted = mount_entry_of(directory).type;
    if (!mounted.empty()) info->type_name = mounted + " (" + info->type_name + ")";
  }
  info->memory_backed = is_memory_backed(s.f_type);
  if (static_cast<unsigned long>(s.f_type) == OVERLAYFS_SUPER_MAGIC) {
    const std::string upper = overlay_upper_directory(directory);
    struct statfs u;
    if (!upper.empty() && statfs(upper.c_str(), &u) == 0 && is_memory_backed(u.f_type)) {
      info->memory_backed = true;
      info->type_name = "overlayfs (upper layer on " + type_name_of(u.f_type) + ")";
    }
  }
  return 0;
}

int file_free_bytes(int fd, std::uint64_t* free_bytes) {
  struct statfs s;
  if (fstatfs(fd, &s) != 0) return errno;
  *free_bytes = static_cast<std::uint64_t>(s.f_bavail) * static_cast<std::uint64_t>(s.f_bsize);
  return 0;
}

// See Note [Unnamed spill file] in src/core/os/platform_posix.cc.
int os::open_unnamed(const std::string& directory, int* fd) {
  if (std::int64_t v = fault_verdict(testing::FaultSite::open_unnamed, 0, 0); v < 0) {
    return static_cast<int>(-v);
  }
  const int f = static_cast<int>(retry_eintr(
      [&] { return open(directory.c_str(), O_TMPFILE | O_EXCL | O_RDWR | O_CLOEXEC, 0600); }));
  if (f < 0) return errno;
  *fd = f;
  return 0;
}

// The file is opened twice (see Note [Direct descriptor] in src/core/file/spill_file.cc).
// /proc/self/fd/N is a magic link to this process's own descriptor (O_NOFOLLOW would refuse it);
// the reopened file is checked to be the same inode all the same.
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
  *alignment = capabilities().page_size_bytes;
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

int preallocate(int fd, std::uint64_t bytes) {
  if (std::int64_t v = fault_verdict(testing::FaultSite::preallocate, bytes, 0); v < 0) {
    return static_cast<int>(-v);
  }
  if (retry_eintr([&] { return fallocate(fd, 0, 0, static_cast<off_t>(bytes)); }) != 0) {
    return errno;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Mappings
// ---------------------------------------------------------------------------------------------

int pages_resident(void* addr, std::uint64_t bytes, std::uint64_t* resident_bytes) {
  const std::uint64_t page = capabilities().page_size_bytes;
  std::vector<unsigned char> vec((bytes + page - 1) / page);
  if (mincore(addr, bytes, vec.data()) != 0) return errno;
  const auto pages =
      std::count_if(vec.begin(), vec.end(), [](unsigned char v) { return (v & 1) != 0; });
  *resident_bytes = std::min<std::uint64_t>(static_cast<std::uint64_t>(pages) * page, bytes);
  return 0;
}

int drop_page_mappings(void* addr, std::uint64_t bytes) {
  return madvise(addr, bytes, MADV_DONTNEED) == 0 ? 0 : errno;
}

// ---------------------------------------------------------------------------------------------
// Page-cache control
// ---------------------------------------------------------------------------------------------

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

int read_ahead_range(int fd, std::uint64_t offset, std::uint64_t bytes) {
  return posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(bytes),
                       POSIX_FADV_WILLNEED);
}

// ---------------------------------------------------------------------------------------------
// Process facts
// ---------------------------------------------------------------------------------------------

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
    const bool match =
        controller_match.empty()
            ? line.compare(0, 3, "0::") == 0
            : ("," + controllers + ",").find("," + controller_match + ",") != std::string::npos;
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

// Where each cgroup version keeps the memory files: its mount, the controller to look for in
// /proc/self/cgroup ("" on v2's unified line), and the limit, usage and peak files. v1 first:
// a hybrid system mounts both, and v1 holds the memory controller there.
struct CgroupFiles {
  int version;
  const char* root;
  const char* controller;
  const char* limit;
  const char* usage;
  const char* peak;
  const char* anon_key;  // the line of memory.stat that counts anonymous memory
};
constexpr CgroupFiles kCgroupFiles[] = {
    {1, "/sys/fs/cgroup/memory", "memory", "memory.limit_in_bytes", "memory.usage_in_bytes",
     "memory.max_usage_in_bytes", "total_rss"},
    {2, "/sys/fs/cgroup", "", "memory.max", "memory.current", "memory.peak", "anon"},
};

// The "key value" lines of a file such as memory.stat; empty when unreadable.
std::map<std::string, std::uint64_t> stat_fields(const std::string& file) {
  std::map<std::string, std::uint64_t> fields;
  std::ifstream in(file);
  std::string name;
  std::uint64_t value = 0;
  while (in >> name >> value) fields[name] = value;
  return fields;
}

std::uint64_t field_or_zero(const std::map<std::string, std::uint64_t>& fields,
                            const std::string& key) {
  const auto it = fields.find(key);
  return it == fields.end() ? 0 : it->second;
}

// The smaller of two limits, 0 meaning none.
std::uint64_t tighter(std::uint64_t a, std::uint64_t b) {
  if (a == 0) return b;
  return b == 0 ? a : std::min(a, b);
}

// The limit that binds this cgroup: its own or an ancestor's, whichever is lower (a systemd
// slice's MemoryMax, a Kubernetes pod's limit sit above the container's own cgroup). v1 says it
// in memory.stat (hierarchical_memory_limit); v2 has each level's memory.max up to the mount.
std::uint64_t tightest_limit(const CgroupFiles& f, const std::string& dir,
                             const std::map<std::string, std::uint64_t>& stat) {
  std::uint64_t limit = 0;
  read_number(dir + "/" + f.limit, &limit);
  if (f.version == 1) {
    std::uint64_t hierarchical = field_or_zero(stat, "hierarchical_memory_limit");
    if (hierarchical >= (1ull << 62)) hierarchical = 0;  // "unlimited", as read_number reads it
    return tighter(limit, hierarchical);
  }
  const std::string root = f.root;
  for (std::string d = dir; d.size() > root.size() && d.compare(0, root.size(), root) == 0;) {
    d = d.substr(0, d.find_last_of('/'));
    std::uint64_t above = 0;
    if (d.size() > root.size() && read_number(d + "/" + f.limit, &above)) {
      limit = tighter(limit, above);
    }
  }
  return limit;
}

}  // namespace

int memory_cgroup(MemoryLimits* out) {
  *out = MemoryLimits{};
  for (const CgroupFiles& f : kCgroupFiles) {
    const std::string path = cgroup_path(f.controller);
    std::string dir;
    if (path.empty() || !cgroup_dir(f.root, path, f.limit, &dir)) continue;
    const auto stat = stat_fields(dir + "/memory.stat");  // read once: anon, v1's limit
    out->cgroup_version = f.version;
    out->cgroup_limit_bytes = tightest_limit(f, dir, stat);
    read_number(dir + "/" + f.usage, &out->cgroup_usage_bytes);
    read_number(dir + "/" + f.peak, &out->cgroup_peak_bytes);
    out->cgroup_anon_bytes = field_or_zero(stat, f.anon_key);
    return 0;
  }
  return 0;
}

void set_malloc_thresholds(std::uint64_t bytes) {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(bytes));
  mallopt(M_TRIM_THRESHOLD, static_cast<int>(bytes));
  malloc_trim(0);  // what the heap already holds free goes back too
#endif
}

}  // namespace spill::platform
