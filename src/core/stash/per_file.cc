// The per-file baseline's files: one file per stashed input, written by the front end's
// serializer (torch::save in C++, torch.save in Python), as the original Python feature does with
// torch.save / torch.load / os.remove. Reproduced faithfully so benchmarks compare spillarena with
// what it replaces, not with a straw man; only the opens are hardened (see Note [Per-file names
// in a shared directory]) and a failed write is a typed error (see Note [A failed write never
// fails inside torch::save]).
#include "per_file.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include "core/os/platform.h"
#include "core/text/quote.h"
#include "spill/error.h"
#include "spill/units.h"

namespace spill::detail {
namespace {

// Note [Per-file names in a shared directory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// These files have names, in a directory other users may be able to write (/tmp). Each name
// carries 128 random bits (std::random_device: the kernel's getrandom), so nobody can plant a
// file or symlink at the next name and make the run fail, as with the process id and a counter
// (issue 19). Each file is still created with O_CREAT | O_EXCL | O_NOFOLLOW and mode 0600: a
// name that exists after all is passed over for another and never opened. restore() opens with
// O_NOFOLLOW and checks it is the file written: the same inode (which a file system reuses as
// soon as ours is deleted), changed last at the same nanosecond (the kernel sets that time;
// utimensat cannot) and of the same size. A file swapped in meanwhile is refused, not loaded.
// unlink removes a name, never a symlink's target.
constexpr int kNameAttempts = 16;

class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  ~Descriptor() { platform::close_file(fd_); }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string errno_text(int e) {
  return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")";
}

[[noreturn]] void fail(IoOp op, const std::string& what, const std::string& path, int e,
                       std::uint64_t offset = 0, std::uint64_t bytes = 0) {
  throw IoError(e,
                "spill: per-file stash: " + what + " " + quote(path) + " failed: " + errno_text(e) +
                    "; check the directory's free space and that nothing else writes there",
                op, offset, bytes);
}

// 128 bits from the kernel as 32 hex digits. A random_device per thread: its operator() is not
// safe to call from two threads at once.
std::string random_name_part() {
  thread_local std::random_device entropy;
  std::string text;
  for (int i = 0; i < 4; ++i) {
    char word[9];
    std::snprintf(word, sizeof word, "%08x", static_cast<unsigned>(entropy()));
    text += word;
  }
  return text;
}

// A new file of this process's, never an existing name; *path says which.
int create_file(const std::string& directory, std::string* path) {
  int e = EEXIST;
  for (int attempt = 0; attempt < kNameAttempts && e == EEXIST; ++attempt) {
    *path = directory + "/spillarena-per-file-" + random_name_part() + ".pt";
    int fd = -1;
    e = platform::create_new_file(*path, &fd);
    if (e == 0) return fd;
  }
  fail(IoOp::write, "creating", *path, e);
}

// Note [A failed write never fails inside torch::save]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A writer that reports a short write makes LibTorch's PyTorchStreamWriter throw; its destructor
// then finishes the archive, writes again, fails again and throws from the destructor:
// std::terminate, SIGABRT, the .pt file left behind (a full disk did exactly that, issue 19). So
// the writer always reports every byte as taken: after the first failed write it only counts the
// bytes, torch::save returns normally, and the failure (its errno, where it happened, how large
// the file had to be) becomes a typed error here, after the file is removed.
struct WriteOutcome {
  int error = 0;                  // the first failed write's errno
  std::uint64_t failed_at = 0;    // file offset of that write
  std::uint64_t total_bytes = 0;  // the whole archive, written or not
};

WriteOutcome save(const PerFileFiles::Save& serialize, int fd) {
  WriteOutcome w;
  serialize([&](const void* data, std::size_t n) -> std::size_t {
    if (w.error == 0) {
      w.error = platform::write_at(fd, data, n, w.total_bytes);
      if (w.error != 0) w.failed_at = w.total_bytes;
    }
    w.total_bytes += n;
    return n;
  });
  return w;
}

// The typed error for a failed save of `path` (already removed) in `directory`: a full disk or
// quota is InsufficientSpaceError with the file's size and the space left, anything else IoError.
[[noreturn]] void fail_save(const WriteOutcome& w, const std::string& path,
                            const std::string& directory) {
  const std::string where = "spill: per-file stash: writing " + quote(path) + " failed at byte " +
                            std::to_string(w.failed_at) + " of " + std::to_string(w.total_bytes) +
                            ": " + errno_text(w.error);
  if (w.error == ENOSPC || w.error == EDQUOT) {
    platform::FileSystemInfo fs;
    const std::uint64_t free_bytes =
        platform::file_system_info(directory, &fs) == 0 ? fs.free_bytes : 0;
    throw InsufficientSpaceError(
        directory, w.total_bytes, free_bytes,
        where + "; " + quote(directory) + " has " + bytes_with_units(free_bytes) +
            " free (the partial file is removed). Free space there, choose another directory, "
            "or use a disk arena, which reserves its space when it is made");
  }
  throw IoError(w.error,
                where +
                    " (the partial file is removed); check the directory's file system, "
                    "its free space and the file size limit (ulimit -f)",
                IoOp::write, w.failed_at, w.total_bytes);
}

}  // namespace

PerFileFiles::PerFileFiles(std::string directory) : directory_(std::move(directory)) {
  // The system calls would see the path cut at the NUL: another directory than the one named.
  if (const auto nul = directory_.find('\0'); nul != std::string::npos) {
    throw InvalidArgumentError("spill: per-file stash directory " + quote(directory_) +
                               " contains a NUL byte; pass the directory's path alone");
  }
  if (int e = platform::check_writable_directory(directory_); e != 0) {
    throw DirectoryError(directory_, e,
                         "spill: per-file stash directory " + quote(directory_) +
                             " is missing, not a directory or not writable (" + errno_text(e) +
                             "); create it or choose another");
  }
}

PerFile PerFileFiles::store(const Save& serialize) const {
  std::string path;
  Descriptor file(create_file(directory_, &path));
  platform::FileStatus written;
  WriteOutcome w;
  try {
    w = save(serialize, file.get());
    if (int e = w.error == 0 ? platform::file_status(file.get(), &written) : 0; e != 0) {
      fail(IoOp::write, "fstat of", path, e);
    }
  } catch (...) {
    platform::remove_file(path);
    throw;
  }
  if (w.error != 0) {
    platform::remove_file(path);
    fail_save(w, path, directory_);
  }
  return PerFile(std::move(path), written);
}

PerFile::~PerFile() {
  if (!path_.empty() && !restored_) platform::remove_file(path_);
}

void PerFile::restore(const Load& deserialize) {
  int raw = -1;
  if (int e = platform::open_for_reading(path_, &raw); e != 0) {
    fail(IoOp::read, "opening", path_, e);
  }
  Descriptor file(raw);
  platform::FileStatus now;
  if (int e = platform::file_status(file.get(), &now); e != 0) {
    fail(IoOp::read, "fstat of", path_, e);
  }
  if (now.device != written_.device || now.inode != written_.inode ||
      now.change_time_ns != written_.change_time_ns || now.size_bytes != written_.size_bytes) {
    fail(IoOp::read, "reading back (another file now has its name)", path_, ESTALE);
  }
  const std::uint64_t size_bytes = now.size_bytes;
  int error = 0;
  const Reader reader = [&](std::uint64_t pos, void* buffer, std::size_t n) -> std::size_t {
    if (pos >= size_bytes) return 0;
    n = static_cast<std::size_t>(std::min<std::uint64_t>(n, size_bytes - pos));
    if (error == 0) error = platform::read_at(file.get(), buffer, n, pos);
    return error == 0 ? n : 0;
  };
  try {
    deserialize(reader, size_bytes);
  } catch (...) {
    if (error == 0) throw;  // the deserializer's own error; a read error is reported below
  }
  if (error != 0) fail(IoOp::read, "reading", path_, error, 0, size_bytes);
  platform::remove_file(path_);
  restored_ = true;  // the name is free now: never unlink whatever else takes it later
}

}  // namespace spill::detail
