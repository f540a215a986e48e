#include "spill/directory.h"

#include <cstring>

#include "platform.h"
#include "spill/quote.h"

namespace spill {

DirectoryInfo inspect_directory(const std::string& directory) {
  DirectoryInfo d;
  d.path = directory;
  if (int e = platform::check_writable_directory(directory); e != 0) {
    d.problem = quote(directory) + " cannot hold a spill file: " + std::strerror(e);
    return d;
  }
  platform::FileSystemInfo fs;
  if (int e = platform::file_system_info(directory, &fs); e != 0) {
    d.problem = "cannot statfs " + quote(directory) + ": " + std::strerror(e);
    return d;
  }
  d.usable = true;
  d.file_system_type = fs.type_name;
  d.memory_backed = fs.memory_backed;
  d.free_bytes = fs.free_bytes;
  d.total_bytes = fs.total_bytes;
  return d;
}

}  // namespace spill
