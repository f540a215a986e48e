// SpillFile: one nameless file in a vetted directory, preallocated with fallocate and mapped
// shared. Nothing of it can outlive the process: it never has a name (see Note [Unnamed spill
// file] in platform_linux.cc), so the kernel frees its blocks when the last descriptor closes,
// on a normal exit, an exception or kill -9 alike.
#pragma once

#include <memory>
#include <string>

#include "storage.h"

namespace spill::detail {

struct SpillFileOptions {
  std::string directory;  // already resolved (not empty)
  std::uint64_t capacity_bytes = 0;
  bool allow_ram_backed_directory = false;
};

// Vets the directory, creates, preallocates and maps the file. Throws DirectoryError,
// RamBackedDirectoryError, InsufficientSpaceError, PreallocationError or IoError; on a throw
// nothing is left open and nothing is left on disk.
std::unique_ptr<Storage> make_spill_file(const SpillFileOptions& options);

}  // namespace spill::detail
