// The per-file baseline's files (Note [Per-file names in a shared directory] in
// src/core/stash/per_file.cc): the disk half of make_per_file_stash, for both front ends.
//
//   spill::detail::PerFileFiles files("/mnt/nvme");          // DirectoryError if unusable
//   spill::detail::PerFile f = files.store([&](const spill::detail::Sink& sink) {
//     sink(bytes, n);                                        // the serializer's output
//   });                                                      // typed errors, nothing left
//   f.restore([&](const spill::detail::Reader& read, std::uint64_t size) { /* deserialize */ });
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "core/os/platform.h"

namespace spill::detail {

// Appends n bytes; returns n.
using Sink = std::function<std::size_t(const void* data, std::size_t n)>;
// Reads up to n bytes at pos; returns how many (0 at the end or after an error).
using Reader = std::function<std::size_t(std::uint64_t pos, void* buffer, std::size_t n)>;

// One stored file. Removed when restored, or when it dies unrestored.
class PerFile {
 public:
  using Load = std::function<void(const Reader& read, std::uint64_t size_bytes)>;
  PerFile(std::string path, platform::FileStatus written)
      : path_(std::move(path)), written_(written) {}
  PerFile(PerFile&& other) noexcept
      : path_(std::move(other.path_)), written_(other.written_), restored_(other.restored_) {
    other.path_.clear();
  }
  PerFile(const PerFile&) = delete;
  PerFile& operator=(const PerFile&) = delete;
  PerFile& operator=(PerFile&&) = delete;
  ~PerFile();
  // Opens the file (refusing one that is not the file written), hands it to `deserialize`,
  // removes it. spill::IoError for a failed read.
  void restore(const Load& deserialize);

 private:
  std::string path_;
  platform::FileStatus written_;  // the file as store() left it
  bool restored_ = false;
};

class PerFileFiles {
 public:
  using Save = std::function<void(const Sink& sink)>;
  // InvalidArgumentError for a NUL in `directory`, DirectoryError where it is unusable.
  explicit PerFileFiles(std::string directory);
  // A new file holding what `serialize` gave the sink. A failed write: InsufficientSpaceError
  // (a full disk) or IoError, and the partial file removed.
  PerFile store(const Save& serialize) const;

 private:
  std::string directory_;
};

}  // namespace spill::detail
