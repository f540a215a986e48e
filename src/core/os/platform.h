// The operating-system seam. Every system call of the library lives behind the functions below,
// in one file per OS family:
//   platform_posix.cc  what every POSIX system has: open, close, fstat, unlink, mkostemp,
//                      pread/pwrite, mmap/munmap, sysconf, dlopen/dlsym; and capabilities();
//   platform_linux.cc  what only Linux has: O_TMPFILE, O_DIRECT reopened through /proc/self/fd,
//                      fallocate, sync_file_range, posix_fadvise, mincore, MADV_DONTNEED, statfs
//                      magic numbers, /proc and cgroup files, glibc's malloc tuning;
//   platform_other.cc  the same functions on other systems, where they answer ENOSYS.
// CMakeLists.txt is the one place that picks platform_linux.cc or platform_other.cc. Nothing else
// in src/ includes <fcntl.h>, <sys/mman.h> or friends, except the io_uring ring itself
// (io_uring_queue.cc, through liburing). The test hooks of the seam are in fault_injection.cc.
//
// Contract, stated once for every function here:
//   - result parameters are never null;
//   - the return value is 0 on success or a positive errno value on failure (the process facts,
//     capabilities() and fault_verdict return what they name);
//   - functions marked [Linux] answer ENOSYS on other systems (facts: 0 or "unknown");
//     capabilities() tells beforehand which of them work;
//   - nothing throws, nothing allocates LibTorch objects, nothing logs.
// Callers turn errno values into typed spill:: errors at the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/os/fault_injection.h"
#include "spill/process_memory.h"

namespace spill::platform {

// ---------------------------------------------------------------------------------------------
// What this system offers
// ---------------------------------------------------------------------------------------------

// Asked once, on the first call (thread-safe), instead of at every use.
struct Capabilities {
  std::uint64_t page_size_bytes = 0;  // the OS page: mappings, mincore, region alignment
  bool unnamed_files = false;      // O_TMPFILE: files made without a name (else mkostemp + unlink)
  bool writeback_control = false;  // sync_file_range, posix_fadvise: page-cache hints on a range
  bool direct_io = false;          // O_DIRECT: transfers that bypass the page cache
};
const Capabilities& capabilities();

// ---------------------------------------------------------------------------------------------
// Files and file systems
// ---------------------------------------------------------------------------------------------

struct FileSystemInfo {
  std::uint64_t free_bytes = 0;   // available to an unprivileged writer (f_bavail)
  std::uint64_t total_bytes = 0;  // size of the file system
  std::string type_name;          // "ext4", "tmpfs", ... (or "0x<magic>" when unknown)
  bool memory_backed = false;     // tmpfs, ramfs, hugetlbfs: spilling there saves no memory
};

// [Linux] Fills *info for the file system holding `directory`.
int file_system_info(const std::string& directory, FileSystemInfo* info);

// [Linux] Free bytes (f_bavail) of the file system holding the open file `fd` (fstatfs): what a
// grow asks, so a directory removed, renamed or named relatively before a chdir changes nothing.
int file_free_bytes(int fd, std::uint64_t* free_bytes);

// `path` made absolute against the working directory now (getcwd's physical path, then `path`
// with "." and ".." folded lexically, its symlinks not resolved); unchanged when already
// absolute or when the working directory cannot be read.
std::string absolute_path(const std::string& path);

// 0 when `directory` exists, is a directory and is writable and searchable by this process.
int check_writable_directory(const std::string& directory);

// Opens a new, nameless read-write file of mode 0600 in `directory`: O_TMPFILE | O_EXCL where the
// system and the file system support it (it can never be linked to a name), else mkostemp
// (O_EXCL) and unlink at once, checked to have left no link. *opened_without_name says which.
// See Note [Unnamed spill file] in src/core/os/platform_posix.cc.
int open_unnamed_file(const std::string& directory, int* fd, bool* opened_without_name);

// [Linux] Opens the file behind `fd` a second time (through /proc/self/fd) with O_DIRECT, checked
// to be the same inode, and tells the alignment direct I/O needs there (statx's dio_offset_align
// where the kernel reports it, else the page size).
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

// [Linux] Allocates real blocks for [0, bytes) of fd (never a sparse file). ENOSPC / EOPNOTSUPP
// pass up.
int preallocate(int fd, std::uint64_t bytes);
// Sets the file's size to `bytes` (ftruncate): a grow that failed gives back what it allocated.
int truncate_file(int fd, std::uint64_t bytes);

int close_file(int fd);

// ---------------------------------------------------------------------------------------------
// Mappings
// ---------------------------------------------------------------------------------------------

// Private anonymous read-write memory of `bytes` (page aligned), for the RAM arena.
int map_anonymous(std::uint64_t bytes, void** addr);
// A shared read-write mapping of [0, bytes) of the file behind fd: nothing is reopened by name.
int map_shared_file(int fd, std::uint64_t bytes, void** addr);
int unmap(void* addr, std::uint64_t bytes);

// [Linux] *resident_bytes = bytes of the pages of [addr, addr + bytes) that are in memory
// (mincore; addr page aligned).
int pages_resident(void* addr, std::uint64_t bytes, std::uint64_t* resident_bytes);

// [Linux] MADV_DONTNEED on a sub-range of a shared file mapping: removes this process's
// page-table entries (dirty data stays in the page cache), so the pages can then be dropped.
int drop_page_mappings(void* addr, std::uint64_t bytes);

// MADV_WILLNEED on a sub-range of a mapping (addr page aligned).
int advise_will_need(void* addr, std::uint64_t bytes);

// Runs read(context), which reads [begin, begin + bytes) of a shared file mapping, with a SIGBUS
// at an address in that range (the file shrank under the mapping, or the disk failed a page)
// turned into EIO: `read` is then left where it faulted, by siglongjmp, so it must hold nothing
// that needs destroying (plain copies and hashes). SIGBUS elsewhere goes to the handler installed
// before the first call (by default the process dies, as without this). Per thread.
// See Note [SIGBUS on the mapping] in src/core/os/platform_posix.cc.
int read_mapped(const void* begin, std::uint64_t bytes, void (*read)(void* context), void* context);

// ---------------------------------------------------------------------------------------------
// Bulk I/O and page-cache control on a file range
// ---------------------------------------------------------------------------------------------

// Loops over short counts until all bytes moved; EIO/ENOSPC pass up; a call that moves nothing
// (a read at end of file) is EIO, never an endless loop.
int write_at(int fd, const void* src, std::uint64_t bytes, std::uint64_t offset);
int read_at(int fd, void* dst, std::uint64_t bytes, std::uint64_t offset);

// [Linux] sync_file_range(SYNC_FILE_RANGE_WRITE): start writeback, do not wait.
int start_writeback(int fd, std::uint64_t offset, std::uint64_t bytes);
// [Linux] Waits for writeback of the range, then POSIX_FADV_DONTNEED: the clean pages leave the
// cache.
int drop_cached_pages(int fd, std::uint64_t offset, std::uint64_t bytes);
// [Linux] POSIX_FADV_WILLNEED: asynchronous readahead of the range.
int read_ahead_range(int fd, std::uint64_t offset, std::uint64_t bytes);

// ---------------------------------------------------------------------------------------------
// Shared libraries loaded at run time (libcufile: see Note [GPUDirect Storage] in
// src/core/io/gds.cc)
// ---------------------------------------------------------------------------------------------

// dlopen(RTLD_NOW | RTLD_LOCAL) of `name`: a file name searched as the dynamic linker does
// (LD_LIBRARY_PATH, ld.so.cache), or a path. A library that fails to load is ENOENT with
// *error = dlerror()'s text. Loaded libraries are never unloaded.
int load_library(const std::string& name, void** handle, std::string* error);
// dlsym of `name` in a loaded library: ENOENT (and *symbol null) when it has none.
int find_symbol(void* handle, const char* name, void** symbol);

// ---------------------------------------------------------------------------------------------
// Process facts
// ---------------------------------------------------------------------------------------------

std::uint64_t process_id();
// pthread_atfork: `in_child` runs in the child of every later fork(), before fork() returns
// there; only async-signal-safe work belongs in it. Handlers cannot be removed: register once.
int register_fork_handler(void (*in_child)());
std::uint64_t physical_memory_bytes();
// RLIMIT_MEMLOCK's soft limit in bytes; UINT64_MAX when unlimited or unknown.
std::uint64_t locked_memory_limit_bytes();
// [Linux] RssAnon from /proc/self/status, in bytes (0 when unreadable).
std::uint64_t resident_anonymous_bytes();
// The system temp directory: $TMPDIR when set and non-empty, else "/tmp".
std::string temp_directory();
// [Linux] MemAvailable of /proc/meminfo in bytes (0 when unreadable).
std::uint64_t mem_available_bytes();

// [Linux] `out` reset, then its cgroup_* fields from the memory cgroup this process belongs to.
// cgroup_limit_bytes is the lowest limit on the way to the root (its own or an ancestor's); "max"
// (v2) or the v1 "unlimited" sentinel (>= 2^62) reads as 0; cgroup_anon_bytes is memory.stat's v1
// "total_rss", v2 "anon" (0 when unreadable). cgroup_version = 0 when none was found; always
// returns 0.
int memory_cgroup(MemoryLimits* out);

// [Linux] glibc: fixed mmap and trim thresholds (no dynamic growth), so large frees go back to
// the system and the heap top is trimmed.
// Does nothing elsewhere.
void set_malloc_thresholds(std::uint64_t bytes);

// ---------------------------------------------------------------------------------------------
// Test-only: fault injection (spill::testing::set_fault_hook in fault_injection.h installs the
// hook; see Note [Fault injection at the seam] in src/core/os/fault_injection.cc)
// ---------------------------------------------------------------------------------------------

// The hook's verdict for one call at `site` asking for `bytes` at file `offset`, clamped to
// `bytes`; `bytes` when no hook is installed. write_at/read_at, the O_TMPFILE open and the
// io_uring backend (for each piece it submits) ask it before the call.
std::int64_t fault_verdict(testing::FaultSite site, std::uint64_t bytes, std::uint64_t offset);

}  // namespace spill::platform
