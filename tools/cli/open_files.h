// How many files `spillarena` may open: enough for LibTorch, the spill file and its I/O queue.
//
//   if (const std::string problem = ensure_open_file_limit(); !problem.empty()) {
//     return report_failure(problem);
//   }
#pragma once

#include <string>

namespace spill::cli {

// Descriptors a run needs at most: the standard streams, LibTorch's own (/dev/urandom, its
// thread pools), the spill file, io_uring, a corpus, per-file mode's one open file at a time.
constexpr unsigned kMinOpenFiles = 64;

// Raises the soft limit on open files (ulimit -n) to kMinOpenFiles where it is lower and the hard
// limit allows; returns "" then, or the problem naming both limits and the fix. See
// Note [Too few open files].
std::string ensure_open_file_limit();

}  // namespace spill::cli
