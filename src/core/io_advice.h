// The fix an I/O error message gives for its errno, written once for the spill file, the I/O
// queue and the per-file stash (the CLI rewords capacity_bytes into --capacity, see Note [The
// library's advice in the CLI's words] in tools/cli/failures.cc).
//
//   throw IoError(e, "spill: write of ... failed: " + std::string(std::strerror(e)) + "; " +
//                        io_error_fix(e), IoOp::write, offset, bytes);
#pragma once

#include <cerrno>
#include <string>

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

}  // namespace spill::detail
