#include "core/file/spill_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/file/io_advice.h"
#include "core/os/platform.h"
#include "core/text/quote.h"
#include "spill/error.h"
#include "spill/units.h"

namespace spill::detail {
namespace {

// Owns a descriptor until released; closes it on every early exit of make_spill_file.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) platform::close_file(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// Owns a shared mapping of the whole file; unmaps it on destruction.
class Mapping {
 public:
  Mapping(void* base, std::uint64_t bytes) : base_(base), bytes_(bytes) {}
  ~Mapping() {
    if (base_ != nullptr) platform::unmap(base_, bytes_);
  }
  Mapping(Mapping&& other) noexcept
      : base_(std::exchange(other.base_, nullptr)), bytes_(other.bytes_) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  Mapping& operator=(Mapping&& other) noexcept {
    std::swap(base_, other.base_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  char* base() const { return static_cast<char*>(base_); }

 private:
  void* base_;
  std::uint64_t bytes_;
};

class SpillFile final : public Storage {
 public:
  SpillFile(int fd, int direct_fd, std::uint64_t direct_alignment, Mapping mapping,
            StorageInfo info)
      : fd_(fd),
        direct_fd_(direct_fd),
        direct_alignment_(direct_alignment),
        mapping_(std::move(mapping)),
        info_(std::move(info)) {}
  ~SpillFile() override {  // mapping_ goes last; a mapping keeps its own reference to the file
    if (direct_fd_ >= 0) platform::close_file(direct_fd_);
    platform::close_file(fd_);
  }

  char* base() const override { return mapping_.base(); }
  const StorageInfo& info() const override { return info_; }
  int fd() const override { return fd_; }
  int direct_fd() const override { return direct_fd_; }
  std::uint64_t direct_alignment() const override { return direct_alignment_; }

  // Note [Why pwrite, not memcpy, for the forward copy]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // memcpy into mapped pages that are not resident first faults them in, and for pages that
  // were written before and evicted that means reading the old data back from disk only to
  // overwrite it. pwrite of whole pages fills page-cache pages directly: no faults, no reads.
  // The mapping and pwrite share the same page cache, so the mapping still sees what was written.
  // Even resident pages are no better through the mapping in training: a region is rewritten one
  // step later, after its writeback, when its pages are clean and write-protected, and every
  // page then takes a write fault through ext4's page_mkwrite. On the development VM
  // (BM_RoundTrip/arena/1, where writeback completes between iterations) writing through the
  // mapping was many times slower than pwrite (measured in docs/benchmarks_archive.md, "Earlier
  // analysis (first version)"). memcpy only wins in a loop that rewrites pages before their
  // writeback, which is a benchmark artefact, not a training step.
  void write(std::uint64_t offset, const void* src, std::uint64_t bytes) override {
    if (int e = platform::write_at(fd_, src, bytes, offset); e != 0)
      fail("write", e, bytes, offset);
  }
  void start_writeback(std::uint64_t offset, std::uint64_t bytes) override {
    platform::start_writeback(fd_, offset, bytes);
  }
  // Pages mapped into this process (written or read through the mapping) are not dropped by
  // POSIX_FADV_DONTNEED, so their page-table entries go first.
  void drop_cached_pages(std::uint64_t offset, std::uint64_t bytes) override {
    drop_page_mappings(offset, bytes);
    platform::drop_cached_pages(fd_, offset, bytes);
  }
  void drop_page_mappings(std::uint64_t offset, std::uint64_t bytes) override {
    char* p = base() + offset;
    platform::drop_page_mappings(page_start(p), bytes + page_slack(p));
  }
  // Readahead for whatever of the range is not in memory; both the page cache (for pread) and
  // this process's mapping (for the copies of resident reads) are asked.
  void read_ahead(std::uint64_t offset, std::uint64_t bytes) override {
    if (resident(offset, bytes)) return;
    char* p = base() + offset;
    platform::read_ahead_range(fd_, offset, bytes);
    platform::advise_will_need(page_start(p), bytes + page_slack(p));
  }
  std::uint64_t resident_bytes(std::uint64_t offset, std::uint64_t bytes) const override {
    char* p = base() + offset;
    std::uint64_t resident = 0;
    if (platform::pages_resident(page_start(p), bytes + page_slack(p), &resident) != 0) return 0;
    return std::min(resident, bytes);
  }
  std::string grow(std::uint64_t capacity_bytes) override;

 private:
  static std::uintptr_t page_mask() { return ~(platform::capabilities().page_size_bytes - 1); }
  static void* page_start(char* p) {
    return reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(p) & page_mask());
  }
  static std::uint64_t page_slack(char* p) {
    return reinterpret_cast<std::uintptr_t>(p) - reinterpret_cast<std::uintptr_t>(page_start(p));
  }

  [[noreturn]] void fail(const char* what, int e, std::uint64_t bytes, std::uint64_t offset) const {
    throw transfer_error(what, what[0] == 'w' ? IoOp::write : IoOp::read, e, bytes, offset,
                         info_.directory);
  }

  int fd_;
  int direct_fd_;
  std::uint64_t direct_alignment_;
  Mapping mapping_;
  StorageInfo info_;
};

// ---------------------------------------------------------------------------------------------
// Vetting the directory
// ---------------------------------------------------------------------------------------------

void check_directory_or_throw(const std::string& dir) {
  // The system calls would see the path cut at the NUL: another directory than the one named.
  if (dir.find('\0') != std::string::npos) {
    throw InvalidArgumentError("spill: spill directory " + quote(dir) +
                               " contains a NUL byte; pass the directory's path alone");
  }
  // A virtual file system first: /proc/self refuses writes (EPERM), but what is wrong with it
  // is that no directory there can hold a file.
  platform::FileSystemInfo fs;
  if (platform::file_system_info(dir, &fs) == 0 && stores_no_files(fs)) {
    throw DirectoryError(dir, ENOSPC, "spill: " + virtual_file_system_refusal(dir, fs.type_name));
  }
  const int e = platform::check_writable_directory(dir);
  if (e == 0) return;
  throw DirectoryError(dir, e, "spill: " + directory_refusal(dir, e));
}

platform::FileSystemInfo vet_file_system(const SpillFileOptions& o) {
  platform::FileSystemInfo fs;
  if (int e = platform::file_system_info(o.directory, &fs); e != 0) {
    throw DirectoryError(
        o.directory, e,
        "spill: cannot statfs spill directory " + quote(o.directory) + ": " + std::strerror(e));
  }
  if (fs.memory_backed && !o.allow_memory_backed_directory) {
    throw MemoryBackedDirectoryError(
        o.directory, fs.type_name,
        "spill: spill directory " + quote(o.directory) + " is on " + fs.type_name +
            ", which lives in RAM: spilling there saves no memory. Choose a directory on a disk "
            "(options.directory or $SPILL_DIR), or set options.allow_memory_backed_directory");
  }
  if (stores_no_files(fs)) {
    throw DirectoryError(o.directory, ENOSPC,
                         "spill: " + virtual_file_system_refusal(o.directory, fs.type_name));
  }
  if (fs.free_bytes < o.capacity_bytes) {
    throw InsufficientSpaceError(o.directory, o.capacity_bytes, fs.free_bytes,
                                 "spill: spill directory " + quote(o.directory) + " (" +
                                     fs.type_name + ") has " + bytes_with_units(fs.free_bytes) +
                                     " free but the arena needs " +
                                     bytes_with_units(o.capacity_bytes) +
                                     "; free space there, lower capacity_bytes, or choose "
                                     "another directory");
  }
  return fs;
}

// ---------------------------------------------------------------------------------------------
// Creating, preallocating, mapping
// ---------------------------------------------------------------------------------------------

// Note [Preallocate, never sparse]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The file's whole capacity gets real blocks (fallocate) when the arena is made. A sparse file
// takes its blocks only as bytes first land in them, so a disk that fills up would fail a write
// in the middle of a training step, and a store through the mapping would die with SIGBUS. Here
// it is a typed error before the first step: InsufficientSpaceError with the bytes needed and
// free (vet_file_system compares them before the file is made), PreallocationError naming the
// file size limit for EFBIG, or the file system that cannot preallocate (a sparse file is never
// taken as a fallback).
void preallocate_or_throw(int fd, const SpillFileOptions& o, const platform::FileSystemInfo& fs) {
  const int e = platform::preallocate(fd, o.capacity_bytes);
  if (e == 0) return;
  if (e == ENOSPC || e == EDQUOT) {
    throw InsufficientSpaceError(
        o.directory, o.capacity_bytes, fs.free_bytes,
        "spill: preallocating " + bytes_with_units(o.capacity_bytes) + " in " + quote(o.directory) +
            " failed: " + std::strerror(e) + " (the file system reported " +
            bytes_with_units(fs.free_bytes) + " free); free space there or lower capacity_bytes");
  }
  if (e == EFBIG) {
    throw PreallocationError(o.directory, e,
                             "spill: the spill file of " + bytes_with_units(o.capacity_bytes) +
                                 " in " + quote(o.directory) +
                                 " would be larger than this process may write (fallocate: " +
                                 std::strerror(e) + "): " + io_error_fix(e));
  }
  throw PreallocationError(
      o.directory, e,
      "spill: the file system of " + quote(o.directory) + " (" + fs.type_name +
          ") cannot preallocate the spill file (fallocate: " + std::strerror(e) +
          "); a sparse file would crash with SIGBUS when the disk fills, so choose a directory on "
          "ext4, xfs or btrfs");
}

// Note [Who refused O_DIRECT]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// open() with O_DIRECT answers EINVAL where the file system does not support it. Any other errno
// of the reopen is not the file system's answer: EMFILE / ENFILE (this process, or the whole
// system, has no file descriptor left), ENOENT (/proc not mounted), ENOMEM. Blaming the file
// system for those sent users to the wrong fix (issue 19); they are named for what they are.
bool out_of_descriptors(int e) { return e == EMFILE || e == ENFILE; }

std::string errno_text(int e) {
  return std::string(std::strerror(e)) + ", errno " + std::to_string(e);
}

std::string descriptors_exhausted(int e) {
  return std::string(e == EMFILE ? "this process" : "the system") +
         " has no file descriptor left (" + errno_text(e) +
         "); close files or raise the limit (ulimit -n)";
}

// Why the reopen with O_DIRECT failed with `e`, in words that blame the right party.
std::string direct_refusal(int e) {
  if (e == EINVAL) return std::string("O_DIRECT is refused there: ") + std::strerror(e);
  if (out_of_descriptors(e)) return "O_DIRECT could not be tried: " + descriptors_exhausted(e);
  return "reopening the file through /proc/self/fd with O_DIRECT failed (" + errno_text(e) + ")";
}

// Note [Direct descriptor]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// O_DIRECT is a property of an open file description, so the unnamed file is opened a second
// time through /proc/self/fd with O_DIRECT: buffered and direct I/O then share one file, and the
// mapping keeps working for the buffered mode.
int open_direct_or_throw(int fd, const SpillFileOptions& o, const platform::FileSystemInfo& fs,
                         std::uint64_t* alignment) {
  int direct = -1;
  const int e = platform::reopen_direct(fd, &direct, alignment);
  if (e == 0 && *alignment <= platform::capabilities().page_size_bytes) return direct;
  if (e == 0) platform::close_file(direct);
  if (e != 0 && e != EINVAL) {  // see Note [Who refused O_DIRECT]
    throw PathError(o.directory, e,
                    "spill: ArenaOptions::io = direct, but for the spill file in " +
                        quote(o.directory) + " " + direct_refusal(e));
  }
  throw InvalidArgumentError(
      "spill: ArenaOptions::io = direct, but the file system of " + quote(o.directory) + " (" +
      fs.type_name + ") " +
      (e != 0 ? std::string("refuses O_DIRECT (") + std::strerror(e) + ")"
              : "needs " + std::to_string(*alignment) + "-byte direct I/O alignment") +
      "; use IoMode::buffered or automatic, or a directory on ext4/xfs");
}

// Note [Mapping the descriptor]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The file is mapped through the descriptor it was created with; nothing opens it again by name
// for the mapping. A reopen (Boost.Interprocess's file_mapping, the first version's mapping,
// opens /proc/self/fd/N without O_CLOEXEC) would hand a descriptor of the spill file to any child
// that another thread forks and execs at that moment; so the project no longer uses Boost.
Mapping map_file(int fd, const SpillFileOptions& o) {
  void* base = nullptr;
  if (int e = platform::map_shared_file(fd, o.capacity_bytes, &base); e != 0) {
    throw IoError(e, "spill: mapping the spill file of " + bytes_with_units(o.capacity_bytes) +
                         " in " + quote(o.directory) + " failed: " + std::strerror(e) +
                         "; lower capacity_bytes or raise the address-space limit (ulimit -v)");
  }
  return Mapping(base, o.capacity_bytes);
}

// Note [Room is found from the descriptor]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Once the file is open, the directory's path names nothing the arena needs: the file has no
// name, and the path may stop leading to its file system (the directory removed or renamed
// mid-run, a relative directory after the process changed directory). Asking the path (statfs)
// then failed every grow for the rest of the run with plenty of room. Grows and the warnings'
// free-space figures ask the open file (fstatfs) and fallocate it; the path, made absolute once
// when the arena is made (SpillArena's constructor), is kept for messages only.
//
// Note [Preallocate, never sparse] holds for a grow too: free space is checked first, the new
// range gets real blocks, and only then is the larger file mapped. A failure at any point
// truncates the file back to its old size, which gives back whatever fallocate had allocated
// before it failed (ext4 keeps the blocks it managed to allocate).
std::string SpillFile::grow(std::uint64_t capacity_bytes) {
  const std::uint64_t old = info_.capacity_bytes;
  const std::string where = quote(info_.directory) + " (" + info_.file_system_type + ")";
  // Asked of the open file, never of the path: Note [Room is found from the descriptor].
  std::uint64_t free_bytes = 0;
  if (int e = platform::file_free_bytes(fd_, &free_bytes); e != 0) {
    return "fstatfs of the spill file in " + where + " failed: " + std::strerror(e);
  }
  const std::uint64_t more = capacity_bytes - old;
  if (free_bytes < more) {
    return where + " has " + human_bytes(free_bytes) + " free; growing the spill file from " +
           human_bytes(old) + " to " + human_bytes(capacity_bytes) + " needs " + human_bytes(more) +
           " more";
  }
  if (int e = platform::preallocate(fd_, capacity_bytes); e != 0) {
    platform::truncate_file(fd_, old);
    return "preallocating " + human_bytes(capacity_bytes) + " in " + where + " failed (" +
           std::strerror(e) + "; the file system reported " + human_bytes(free_bytes) + " free)" +
           (e == EFBIG ? ": " + io_error_fix(e) : std::string());
  }
  void* base = nullptr;
  if (int e = platform::map_shared_file(fd_, capacity_bytes, &base); e != 0) {
    platform::truncate_file(fd_, old);
    return "mapping " + human_bytes(capacity_bytes) + " of the spill file failed (" +
           std::strerror(e) + "; raise the address-space limit, ulimit -v)";
  }
  mapping_ = Mapping(base, capacity_bytes);  // the old mapping is unmapped here
  info_.capacity_bytes = capacity_bytes;
  return "";
}

}  // namespace

std::unique_ptr<Storage> make_spill_file(const SpillFileOptions& o) {
  const platform::FileSystemInfo fs = vet_file_system(o);
  int raw_fd = -1;
  bool opened_without_name = false;
  if (int e = platform::open_unnamed_file(o.directory, &raw_fd, &opened_without_name); e != 0) {
    if (out_of_descriptors(e)) {  // not the directory's fault: see Note [Who refused O_DIRECT]
      throw PathError(o.directory, e,
                      "spill: cannot create the spill file in " + quote(o.directory) + ": " +
                          descriptors_exhausted(e));
    }
    throw DirectoryError(
        o.directory, e,
        "spill: cannot create the spill file in " + quote(o.directory) + ": " + std::strerror(e));
  }
  FileDescriptor fd(raw_fd);
  preallocate_or_throw(fd.get(), o, fs);
  FileDescriptor direct(-1);
  std::uint64_t alignment = 0;
  if (o.direct) direct = FileDescriptor(open_direct_or_throw(fd.get(), o, fs, &alignment));
  Mapping mapping = map_file(fd.get(), o);
  StorageInfo info{o.directory, fs.type_name, o.capacity_bytes, fs.free_bytes, opened_without_name};
  return std::make_unique<SpillFile>(fd.release(), direct.release(), alignment, std::move(mapping),
                                     std::move(info));
}

void check_directory(const std::string& directory) { check_directory_or_throw(directory); }

// The advice fits the errno: a directory that exists is never told to be created.
std::string directory_refusal(const std::string& dir, int e) {
  std::string why;
  if (e == ENOENT)
    why = "does not exist; create it or choose another with options.directory or $SPILL_DIR";
  else if (e == ENOTDIR)
    why = "is not a directory; point options.directory at a directory";
  else if (e == EACCES || e == EROFS || e == EPERM)
    why = std::string("is not writable (") + std::strerror(e) +
          "); fix its permissions or choose another with options.directory or $SPILL_DIR";
  else
    why = std::string("cannot be used (") + std::strerror(e) +
          "); choose another with options.directory or $SPILL_DIR";
  return "spill directory " + quote(dir) + " " + why;
}

bool stores_no_files(const platform::FileSystemInfo& fs) { return fs.total_bytes == 0; }

std::string virtual_file_system_refusal(const std::string& dir, const std::string& type) {
  return "spill directory " + quote(dir) + " is on " + type +
         ", which stores no files (a virtual file system); choose another with "
         "options.directory or $SPILL_DIR";
}

bool direct_io_supported(const std::string& directory, std::string* why) {
  if (!platform::capabilities().direct_io) {
    *why = "this system has no O_DIRECT";
    return false;
  }
  int raw_fd = -1;
  bool opened_without_name = false;
  if (int e = platform::open_unnamed_file(directory, &raw_fd, &opened_without_name); e != 0) {
    *why = out_of_descriptors(e) ? "O_DIRECT could not be tried: " + descriptors_exhausted(e)
                                 : std::string("cannot create a file there: ") + std::strerror(e);
    return false;
  }
  FileDescriptor fd(raw_fd);
  int direct = -1;
  std::uint64_t alignment = 0;
  if (int e = platform::reopen_direct(fd.get(), &direct, &alignment); e != 0) {
    *why = direct_refusal(e);
    return false;
  }
  FileDescriptor closer(direct);
  if (alignment > platform::capabilities().page_size_bytes) {
    *why = "O_DIRECT needs " + std::to_string(alignment) + "-byte alignment, above the page size";
    return false;
  }
  return true;
}

}  // namespace spill::detail
