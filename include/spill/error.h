// Typed errors of spillarena. Every error derives from spill::Error (a std::runtime_error), says
// what was asked, what was available and how to fix it, and carries the numbers as fields.
//
//   #include <spill/arena.h>
//   try {
//     spill::SpillArena arena(options);
//   } catch (const spill::InsufficientSpaceError& e) {
//     std::cerr << e.what() << "\n";  // "... needs 8589934592 bytes, 1073741824 free ..."
//     shrink_to(e.available_bytes());
//   } catch (const spill::Error& e) {  // any other spillarena problem
//     std::cerr << e.what() << "\n";
//   }
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "spill/io.h"

namespace spill {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// An option or argument out of range: capacity 0 or absurd, allocation of 0 bytes, ...
class InvalidArgumentError : public Error {
 public:
  using Error::Error;
};

// A file system call on `path` failed with errno `error_number`: the base of the two below.
class PathError : public Error {
 public:
  PathError(const std::string& path, int error_number, const std::string& message)
      : Error(message), path_(path), errno_(error_number) {}
  const std::string& path() const { return path_; }
  int error_number() const { return errno_; }

 private:
  std::string path_;
  int errno_;
};

// The spill directory is missing, not a directory or not writable.
class DirectoryError : public PathError {
 public:
  using PathError::PathError;
};

// The spill directory lives in RAM (tmpfs, ramfs, hugetlbfs): spilling there saves no memory.
class MemoryBackedDirectoryError : public Error {
 public:
  MemoryBackedDirectoryError(const std::string& path, const std::string& fs_type,
                             const std::string& message)
      : Error(message), path_(path), fs_type_(fs_type) {}
  const std::string& path() const { return path_; }
  const std::string& file_system_type() const { return fs_type_; }

 private:
  std::string path_;
  std::string fs_type_;
};

// The file system (or, for the RAM arena, the machine) has less room than the capacity asked.
class InsufficientSpaceError : public Error {
 public:
  InsufficientSpaceError(const std::string& path, std::uint64_t needed, std::uint64_t available,
                         const std::string& message)
      : Error(message), path_(path), needed_(needed), available_(available) {}
  const std::string& path() const { return path_; }
  std::uint64_t needed_bytes() const { return needed_; }
  std::uint64_t available_bytes() const { return available_; }

 private:
  std::string path_;
  std::uint64_t needed_;
  std::uint64_t available_;
};

// The file system cannot preallocate (fallocate unsupported) or the mapping failed.
class PreallocationError : public PathError {
 public:
  using PathError::PathError;
};

// No free block is large enough. The arena is unchanged and stays fully usable.
class ArenaExhaustedError : public Error {
 public:
  ArenaExhaustedError(std::uint64_t requested, std::uint64_t free_bytes,
                      std::uint64_t largest_free_block, const std::string& message)
      : Error(message), requested_(requested), free_(free_bytes), largest_(largest_free_block) {}
  std::uint64_t requested_bytes() const { return requested_; }
  std::uint64_t free_bytes() const { return free_; }
  std::uint64_t largest_free_block() const { return largest_; }

 private:
  std::uint64_t requested_, free_, largest_;
};

// A Region handle was used after it was moved from (or freed).
class MovedFromRegionError : public Error {
 public:
  using Error::Error;
};

// A read or write of region data failed (I/O error, disk full, file too large). Errors from the
// asynchronous engine also name the operation, the file offset and the byte count.
class IoError : public Error {
 public:
  IoError(int error_number, const std::string& message, IoOp op = IoOp::write,
          std::uint64_t offset = 0, std::uint64_t bytes = 0)
      : Error(message), errno_(error_number), op_(op), offset_(offset), bytes_(bytes) {}
  int error_number() const { return errno_; }
  IoOp op() const { return op_; }
  std::uint64_t offset() const { return offset_; }
  std::uint64_t bytes() const { return bytes_; }

 private:
  int errno_;
  IoOp op_;
  std::uint64_t offset_, bytes_;
};

// Bytes read back from a region are not the bytes written there (ArenaOptions::verify_integrity):
// the spill file or the disk under it changed behind the arena's back. Names the region (its
// offset in the spill file), the bytes one write put there (offset in the region, count) and
// their XXH3-64 hashes as written and as read. Thrown by Region::read and the Pending::wait of a
// read_async, before the caller uses the bytes; the arena stays usable.
class IntegrityError : public Error {
 public:
  IntegrityError(std::uint64_t region_offset, std::uint64_t offset_in_region, std::uint64_t bytes,
                 std::uint64_t expected_hash, std::uint64_t found_hash, const std::string& message)
      : Error(message),
        region_offset_(region_offset),
        offset_in_region_(offset_in_region),
        bytes_(bytes),
        expected_(expected_hash),
        found_(found_hash) {}
  std::uint64_t region_offset() const { return region_offset_; }
  std::uint64_t offset_in_region() const { return offset_in_region_; }
  std::uint64_t bytes() const { return bytes_; }
  std::uint64_t expected_hash() const { return expected_; }
  std::uint64_t found_hash() const { return found_; }

 private:
  std::uint64_t region_offset_, offset_in_region_, bytes_, expected_, found_;
};

// IoMode::gds was asked but GPUDirect Storage cannot run here: libcufile could not be loaded
// (cufile_status() 0; the message has dlerror()'s text and how to install it) or cuFile refused
// to start (cufile_status() is cuFile's CU_FILE_... code, named in the message). Names the
// library searched. See Note [GPUDirect Storage] in src/core/io/gds.cc.
class GdsUnavailableError : public Error {
 public:
  GdsUnavailableError(const std::string& library, int cufile_status, const std::string& message)
      : Error(message), library_(library), status_(cufile_status) {}
  const std::string& library() const { return library_; }
  int cufile_status() const { return status_; }

 private:
  std::string library_;
  int status_;
};

// An arena, one of its regions or a Pending of theirs was used in a child of fork(): an arena
// belongs to the process that created it. In the child it is inert — no I/O, and destroying it
// only releases the child's own mapping and descriptors; the parent's arena is untouched. Names
// the creating process and this one. See Note [Arenas across fork] in src/core/os/fork_guard.cc.
class ForkedProcessError : public Error {
 public:
  ForkedProcessError(std::uint64_t creator_pid, std::uint64_t current_pid,
                     const std::string& message)
      : Error(message), creator_pid_(creator_pid), current_pid_(current_pid) {}
  std::uint64_t creator_pid() const { return creator_pid_; }
  std::uint64_t current_pid() const { return current_pid_; }

 private:
  std::uint64_t creator_pid_, current_pid_;
};

// Misuse of the checkpoint wrapper, e.g. a second backward through the same graph.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

}  // namespace spill
