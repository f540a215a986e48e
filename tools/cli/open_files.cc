#include "open_files.h"

#include <sys/resource.h>

#include <string>

namespace spill::cli {

// Note [Too few open files]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Under `ulimit -n 12` LibTorch's first random seed fails with "Unable to open /dev/urandom" and
// the spill file's open with EMFILE somewhere later: neither says that the limit is the cause
// (issue 19). So the limit is checked before anything opens a file. A soft limit below what a
// run needs is raised to it when the hard limit allows, as an unprivileged process may; only a
// hard limit below it is an error, naming both limits.
std::string ensure_open_file_limit() {
  struct rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return "";  // unknown: let the opens say
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= kMinOpenFiles) return "";
  if (limit.rlim_max == RLIM_INFINITY || limit.rlim_max >= kMinOpenFiles) {
    struct rlimit raised = limit;
    raised.rlim_cur = kMinOpenFiles;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) return "";
  }
  return "this process may open only " + std::to_string(limit.rlim_cur) +
         " files (ulimit -n; hard limit " +
         (limit.rlim_max == RLIM_INFINITY ? std::string("unlimited")
                                          : std::to_string(limit.rlim_max)) +
         ") but a run needs " + std::to_string(kMinOpenFiles) + "; raise it (ulimit -n 1024)";
}

}  // namespace spill::cli
