// The operating-system seam. Every system call of the library lives in platform_linux.cc, behind
// the functions below; nothing else in src/ includes <fcntl.h>, <sys/mman.h> or friends, except
// the io_uring ring itself (io_uring_queue.cc, through liburing).
//
// Contract, stated once for every function here:
//   - result parameters are never null;
//   - the return value is 0 on success or a positive errno value on failure (the process facts
//     and the test-only fault_verdict at the end return what they name);
//   - nothing throws, nothing allocates LibTorch objects, nothing logs.
// Callers turn errno values into typed spill:: errors at the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace spill::platform {

// ---------------------------------------------------------------------------------------------
// Files and file systems
// ---------------------------------------------------------------------------------------------

struct FileSystemInfo {
  std::uint64_t free_bytes = 0;   // available to an unprivileged writer (f_bavail)
  std::uint64_t total_bytes = 0;  // size of the file system
  std::string type_name;          // "ext4", "tmpfs", ... (or "0x<magic>" when unknown)
  bool ram_backed = false;        // tmpfs, ramfs, hugetlbfs: spilling there saves no memory
};

// Fills *info for the file system holding `directory`.
int file_system_info(const std::string& directory, FileSystemInfo* info);

// 0 when `directory` exists, is a directory and is writable and searchable by this process.
int check_writable_directory(const std::string& directory);

// Opens a new, nameless read-write file of mode 0600 in `directory`: O_TMPFILE | O_EXCL where the
// file system supports it (it can never be linked to a name), else mkostemp (O_EXCL) and unlink at
// once, checked to have left no link. *used_tmpfile says which.
// See Note [Unnamed spill file] in src/platform_linux.cc.
int open_unnamed_file(const std::string& directory, int* fd, bool* used_tmpfile);

// Like open_unnamed_file, with O_DIRECT (benchmarks measure the disk's own limit with it).
int open_unnamed_direct_file(const std::string& directory, int* fd);

// Opens the file behind `fd` a second time (through /proc/self/fd) with O_DIRECT, checked to be
// the same inode, and tells the alignment direct I/O needs there (statx's dio_offset_align where
// the kernel reports it, else the page size).
int reopen_direct(int fd, int* direct_fd, std::uint64_t* alignment);

// Creates `path` for writing, mode 0600: O_CREAT | O_EXCL | O_NOFOLLOW, so an existing name (a
// planted symlink included) is EEXIST and nothing is written through it.
int create_new_file(const std::string& path, int* fd);

// Opens an existing file read-only; a symlink as its last component is ELOOP, not followed.
int open_for_reading(const std::string& path, int* fd);

// What fstat says about an open file.
struct FileStatus {
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  std::uint64_t size_bytes = 0;
  std::uint64_t links = 0;           // names in the file system; 0 for an unnamed file
  std::uint64_t change_time_ns = 0;  // st_ctime: set by the kernel on every change, never by users
  std::uint32_t mode = 0;            // permission bits (07777)
};
int file_status(int fd, FileStatus* status);

// unlink: a symlink is removed itself, never its target.
int remove_file(const std::string& path);

// Allocates real blocks for [0, bytes) of fd (never a sparse file). ENOSPC / EOPNOTSUPP pass up.
int preallocate(int fd, std::uint64_t bytes);

int close_file(int fd);

// ---------------------------------------------------------------------------------------------
// Mappings
// ---------------------------------------------------------------------------------------------

// Private anonymous read-write memory of `bytes` (page aligned), for the RAM-backed arena.
int map_anonymous(std::uint64_t bytes, void** addr);
// A shared read-write mapping of [0, bytes) of the file behind fd: nothing is reopened by name.
int map_shared_file(int fd, std::uint64_t bytes, void** addr);
int unmap(void* addr, std::uint64_t bytes);

// *resident_bytes = bytes of the pages of [addr, addr + bytes) that are in memory (mincore; addr
// page aligned).
int pages_resident(void* addr, std::uint64_t bytes, std::uint64_t* resident_bytes);

// MADV_DONTNEED on a sub-range of a shared file mapping: removes this process's page-table
// entries (dirty data stays in the page cache), so the pages can then be dropped from it.
int unmap_pages(void* addr, std::uint64_t bytes);

// MADV_WILLNEED on a sub-range of a mapping (addr page aligned).
int advise_will_need(void* addr, std::uint64_t bytes);

// ---------------------------------------------------------------------------------------------
// Bulk I/O and page-cache control on a file range
// ---------------------------------------------------------------------------------------------

// Loops over short counts until all bytes moved; EIO/ENOSPC pass up; a call that moves nothing
// (a read at end of file) is EIO, never an endless loop.
int write_at(int fd, const void* src, std::uint64_t bytes, std::uint64_t offset);
int read_at(int fd, void* dst, std::uint64_t bytes, std::uint64_t offset);

// sync_file_range(SYNC_FILE_RANGE_WRITE): start writeback, do not wait.
int start_writeback(int fd, std::uint64_t offset, std::uint64_t bytes);
// Waits for writeback of the range, then POSIX_FADV_DONTNEED: the clean pages leave the cache.
int drop_cached_pages(int fd, std::uint64_t offset, std::uint64_t bytes);
// POSIX_FADV_WILLNEED: asynchronous readahead of the range.
int prefetch_range(int fd, std::uint64_t offset, std::uint64_t bytes);

// ---------------------------------------------------------------------------------------------
// Process facts
// ---------------------------------------------------------------------------------------------

std::uint64_t page_size_bytes();
std::uint64_t process_id();
std::uint64_t physical_memory_bytes();
// RssAnon from /proc/self/status, in bytes (0 when unreadable).
std::uint64_t resident_anonymous_bytes();
// The system temp directory: $TMPDIR when set and non-empty, else "/tmp".
std::string temp_directory();
// Whether standard output is a terminal (progress lines redraw in place there).
bool stdout_is_terminal();
// MemAvailable of /proc/meminfo in bytes (0 when unreadable).
std::uint64_t mem_available_bytes();

// The memory cgroup this process belongs to. A limit of "max" (v2) or the v1 "unlimited"
// sentinel (>= 2^62) reads as 0. version = 0 when none was found; always returns 0.
struct CgroupMemory {
  int version = 0;
  std::uint64_t limit_bytes = 0;
  std::uint64_t usage_bytes = 0;
  std::uint64_t peak_bytes = 0;
};
int memory_cgroup(CgroupMemory* out);

// glibc: fixed mmap threshold (no dynamic growth), so large frees go back to the system.
void set_malloc_mmap_threshold(std::uint64_t bytes);

// ---------------------------------------------------------------------------------------------
// Test-only: fault injection (see Note [Fault injection at the seam] in src/platform_linux.cc)
// ---------------------------------------------------------------------------------------------
//
//   spill::platform::set_fault_hook([](spill::platform::FaultSite site, std::uint64_t bytes,
//                                      std::uint64_t /*offset*/) -> std::int64_t {
//     if (site == spill::platform::FaultSite::pread) return -EIO;  // every pread fails
//     return std::max<std::uint64_t>(bytes / 2, 1);                // everything else: half
//   });
//   ...
//   spill::platform::set_fault_hook({});  // gone

// The calls a test may shape: the pwrite/pread inside write_at/read_at, a read or write piece
// submitted to io_uring, and the O_TMPFILE open of open_unnamed_file.
enum class FaultSite { pwrite, pread, ring_write, ring_read, o_tmpfile };

// Called before each such call with the bytes it asks for (0 for o_tmpfile) and its file offset.
// Returns what the call may do: `bytes` (all of it), fewer (a real short count: only that many
// move), 0 (nothing moves: end of file), or -errno (it fails and moves nothing). May sleep;
// must not throw.
using FaultHook = std::function<std::int64_t(FaultSite site, std::uint64_t bytes,
                                             std::uint64_t offset)>;

// Test-only. Installs `hook` for every call from now on (any thread); an empty function removes
// it. Not installed, each call pays one relaxed atomic load.
void set_fault_hook(FaultHook hook);

// The hook's verdict for one call, clamped to `bytes`; `bytes` when no hook is installed. The
// io_uring backend asks it for each piece it submits.
std::int64_t fault_verdict(FaultSite site, std::uint64_t bytes, std::uint64_t offset);

}  // namespace spill::platform
