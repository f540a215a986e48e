// What the OS family's file of the seam (platform_linux.cc or platform_other.cc, as
// CMakeLists.txt picks) gives platform_posix.cc, and two helpers all three share. Included by
// those three files only; the rest of the library sees platform.h.
#pragma once

#include <cerrno>
#include <string>

#include "core/os/platform.h"

namespace spill::platform::os {

// This OS family's answers for the capability record, all but the page size (platform_posix.cc
// asks sysconf for that).
Capabilities capabilities();

// Opens a new file without a name in `directory` (O_TMPFILE | O_EXCL, read-write, close-on-exec,
// mode 0600). Only called where capabilities().unnamed_files; EOPNOTSUPP, EISDIR or EINVAL when
// the file system cannot. See Note [Unnamed spill file] in src/core/os/platform_posix.cc.
int open_unnamed(const std::string& directory, int* fd);

// Retries a call that may be interrupted by a signal; returns the call's result or -1 (errno set).
template <class Call>
long retry_eintr(Call call) {
  long r;
  do {
    r = call();
  } while (r < 0 && errno == EINTR);
  return r;
}

// Closes fd and returns e: the error path of functions that opened fd themselves.
int close_with(int fd, int e);

}  // namespace spill::platform::os
