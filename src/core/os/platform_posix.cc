// The POSIX half of platform.h: the calls every POSIX system has. What only Linux has is in
// platform_linux.cc (platform_other.cc elsewhere); see platform.h for the split and the contract.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "core/os/platform.h"
#include "core/os/platform_os.h"

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
// it one. O_TMPFILE needs support from the system (Linux: os::open_unnamed in platform_linux.cc)
// and the file system (ext4, xfs, btrfs, tmpfs have it; some FUSE and network file systems do
// not), so the fallback is mkostemp (O_CREAT | O_EXCL, mode 0600: a name already there, a
// planted symlink included, is never opened) and unlink at once; the name then exists for
// microseconds. Someone who may write the directory could rename the file in that window and
// keep a name for it, so a link count above 0 after the unlink is refused. The mode is set to
// 0600 whatever the umask, so another user's open through /proc/<pid>/fd is refused; the direct
// reopen through /proc/self/fd checks device and inode, not the mode. Nothing survives the
// process either way: the kernel frees the blocks when the last descriptor closes.
bool unnamed_unsupported(int e) { return e == EOPNOTSUPP || e == EISDIR || e == EINVAL; }

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

int open_unnamed_file(const std::string& directory, int* fd, bool* opened_without_name) {
  int f = -1;
  const int e = capabilities().unnamed_files ? os::open_unnamed(directory, &f) : EOPNOTSUPP;
  if (e != 0 && !unnamed_unsupported(e)) return e;
  *opened_without_name = e == 0;
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

int truncate_file(int fd, std::uint64_t bytes) {
  return retry_eintr([&] { return ftruncate(fd, static_cast<off_t>(bytes)); }) == 0 ? 0 : errno;
}

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
// Shared libraries loaded at run time
// ---------------------------------------------------------------------------------------------

int load_library(const std::string& name, void** handle, std::string* error) {
  *handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (*handle != nullptr) return 0;
  const char* text = dlerror();
  *error = text != nullptr ? text : "dlopen failed";
  return ENOENT;  // the cause (missing, wrong ELF class, missing dependency) is in *error
}

int find_symbol(void* handle, const char* name, void** symbol) {
  *symbol = dlsym(handle, name);
  return *symbol != nullptr ? 0 : ENOENT;
}

// ---------------------------------------------------------------------------------------------
// Reading a shared file mapping without dying of SIGBUS
// ---------------------------------------------------------------------------------------------

// Note [SIGBUS on the mapping]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A load from a shared file mapping beyond the file's end, or from a page the disk fails to
// read in, raises SIGBUS, and the process dies without a word about the spill file. The file is
// preallocated (see Note [Preallocate, never sparse] in src/core/file/spill_file.cc), so that takes
// someone shrinking it behind the arena's back (ftruncate through /proc/<pid>/fd/N, a cleanup
// tool) or a failing disk. The arena's mapped reads (the copy of a resident read, and its
// integrity hash in the same pass) first compare the file's size (fstat) with the bytes they need,
// which names a file that shrank before; read_mapped covers what happens during the read: a
// per-thread guard holds a sigjmp_buf and the address range, and the SIGBUS handler, installed
// once, jumps back to it when the fault lies in that range, so the read becomes EIO and a typed
// spill::IoError above. Faults outside a guarded range (another thread's, another library's
// mapping) go to the handler that was there before ours, or to the default action, which kills
// the process as it would have without us.
namespace {

struct MappedReadGuard {
  sigjmp_buf jump;
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;
};

thread_local MappedReadGuard* t_mapped_read = nullptr;
struct sigaction g_previous_sigbus;  // written once, before our handler is installed
pthread_once_t g_sigbus_once = PTHREAD_ONCE_INIT;
int g_sigbus_install_error = 0;

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const MappedReadGuard* guard = t_mapped_read;
  const auto at = reinterpret_cast<std::uintptr_t>(info->si_addr);
  if (guard != nullptr && at >= guard->begin && at < guard->end) {
    siglongjmp(t_mapped_read->jump, 1);
  }
  if ((g_previous_sigbus.sa_flags & SA_SIGINFO) != 0) {
    g_previous_sigbus.sa_sigaction(sig, info, context);
  } else if (g_previous_sigbus.sa_handler != SIG_DFL && g_previous_sigbus.sa_handler != SIG_IGN) {
    g_previous_sigbus.sa_handler(sig);
  } else {
    // The default action: reinstalled and raised again, it runs once this handler returns (a
    // fault also repeats when its instruction does).
    struct sigaction fallback{};
    fallback.sa_handler = SIG_DFL;
    sigemptyset(&fallback.sa_mask);
    sigaction(sig, &fallback, nullptr);
    raise(sig);
  }
}

void install_sigbus_handler() {
  struct sigaction action{};
  action.sa_sigaction = on_sigbus;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGBUS, &action, &g_previous_sigbus) != 0) g_sigbus_install_error = errno;
}

// Puts the enclosing guard back however read_mapped is left: return, exception or the jump.
struct RestoreGuard {
  MappedReadGuard* outer;
  ~RestoreGuard() { t_mapped_read = outer; }
};

}  // namespace

int read_mapped(const void* begin, std::uint64_t bytes, void (*read)(void* context),
                void* context) {
  pthread_once(&g_sigbus_once, install_sigbus_handler);
  if (g_sigbus_install_error != 0) {  // unguarded, as before: SIGBUS kills the process
    read(context);
    return 0;
  }
  MappedReadGuard guard;
  guard.begin = reinterpret_cast<std::uintptr_t>(begin);
  guard.end = guard.begin + bytes;
  const RestoreGuard restore{t_mapped_read};
  if (sigsetjmp(guard.jump, 1) != 0) return EIO;
  t_mapped_read = &guard;
  read(context);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Process facts
// ---------------------------------------------------------------------------------------------

std::uint64_t process_id() { return static_cast<std::uint64_t>(getpid()); }

int register_fork_handler(void (*in_child)()) { return pthread_atfork(nullptr, nullptr, in_child); }

std::uint64_t physical_memory_bytes() {
  return static_cast<std::uint64_t>(sysconf(_SC_PHYS_PAGES)) * capabilities().page_size_bytes;
}

std::uint64_t locked_memory_limit_bytes() {
  struct rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return ~0ull;
  return static_cast<std::uint64_t>(limit.rlim_cur);
}

std::string absolute_path(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  std::vector<char> cwd(4096);
  while (getcwd(cwd.data(), cwd.size()) == nullptr) {
    if (errno != ERANGE || cwd.size() >= (1u << 20)) return path;
    cwd.resize(cwd.size() * 2);
  }
  // "." and ".." folded lexically; getcwd's part is the physical path (symlinks resolved).
  std::string absolute = (std::filesystem::path(cwd.data()) / path).lexically_normal().string();
  if (absolute.size() > 1 && absolute.back() == '/') absolute.pop_back();  // "." gives "cwd/"
  return absolute;
}

std::string temp_directory() {
  const char* tmpdir = std::getenv("TMPDIR");
  if (tmpdir != nullptr && *tmpdir != '\0') return tmpdir;
  return "/tmp";
}

}  // namespace spill::platform
