#include "spill/directory.h"

#include <cstring>

#include "core/file/spill_file.h"
#include "core/os/platform.h"
#include "core/text/quote.h"

namespace spill {

DirectoryInfo inspect_directory(const std::string& directory) {
  DirectoryInfo d;
  d.path = directory;
  // The arena's own checks, in its order (check_directory in src/core/file/spill_file.cc).
  platform::FileSystemInfo fs;
  const int statfs_error = platform::file_system_info(directory, &fs);
  d.file_system_type = fs.type_name;
  if (statfs_error == 0 && detail::stores_no_files(fs)) {
    d.problem = detail::virtual_file_system_refusal(directory, fs.type_name);
    return d;
  }
  if (int e = platform::check_writable_directory(directory); e != 0) {
    d.problem = detail::directory_refusal(directory, e);
    return d;
  }
  if (statfs_error != 0) {
    d.problem = "cannot statfs " + detail::quote(directory) + ": " + std::strerror(statfs_error);
    return d;
  }
  d.usable = true;
  d.memory_backed = fs.memory_backed;
  d.free_bytes = fs.free_bytes;
  d.total_bytes = fs.total_bytes;
  return d;
}

std::string empty_directory_refusal(const std::string& instead) {
  return "an empty path names no directory; " + instead +
         " for the default ($SPILL_DIR, else $TMPDIR or /tmp; /var/tmp when those are in RAM)";
}

}  // namespace spill
