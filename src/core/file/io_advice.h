// What a failed I/O of the spill file says, written once: the fix for its errno (the spill file
// and the I/O queue; the CLI rewords capacity_bytes into --capacity, see Note [The library's
// advice in the CLI's words] in tools/cli/failures.cc), and the one text of a failed transfer of
// spill-file bytes (the synchronous path and the queue). The per-file stash words its own
// (src/torch_layer/per_file_stash.cc): its files are not the spill file, have no capacity to
// lower and are removed when a write fails, so neither fix applies there.
//
//   throw transfer_error("write", IoOp::write, EIO, bytes, offset);
//   // "spill: write of 4096 bytes at offset 8192 of the spill file failed: ...; check ..."
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/text/quote.h"
#include "spill/error.h"

namespace spill::detail {

// Note [EFBIG is a size limit, not a disk]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// fallocate or write past RLIMIT_FSIZE (ulimit -f), or past the file system's largest file,
// fails with EFBIG (the CLI ignores SIGXFSZ: see Note [Ignoring SIGXFSZ] in tools/cli/main.cc).
// Advice for a failing disk or another file system would not help: the limit has to rise or
// the file shrink.
inline std::string io_error_fix(int error_number) {
  if (error_number == EFBIG) {
    return "the file would pass the file size limit (ulimit -f) or the file system's largest "
           "file; raise the limit (ulimit -f unlimited) or lower capacity_bytes";
  }
  return "check the disk (dmesg) and its free space, and that no other process truncated or "
         "wrote the spill file (/proc/<pid>/fd)";
}

// `what` ("write", "queued read", ...) of `bytes` at `offset` failed with `error_number`; the
// directory is named where the caller knows it.
inline IoError transfer_error(const std::string& what, IoOp op, int error_number,
                              std::uint64_t bytes, std::uint64_t offset,
                              const std::string& directory = "") {
  return IoError(error_number,
                 "spill: " + what + " of " + std::to_string(bytes) + " bytes at offset " +
                     std::to_string(offset) + " of the spill file" +
                     (directory.empty() ? "" : " in " + quote(directory)) +
                     " failed: " + std::strerror(error_number) + "; " + io_error_fix(error_number),
                 op, offset, bytes);
}

}  // namespace spill::detail
