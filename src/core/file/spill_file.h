// SpillFile: one nameless file in a vetted directory, preallocated with fallocate and mapped
// shared. Nothing of it can outlive the process: it never has a name, so the kernel frees its
// blocks when the last descriptor closes, on a normal exit, an exception or kill -9 alike.
// See Note [Unnamed spill file] in src/core/os/platform_posix.cc.
#pragma once

#include <memory>
#include <string>

#include "core/file/storage.h"
#include "core/os/platform.h"

namespace spill::detail {

struct SpillFileOptions {
  std::string directory;  // already resolved (not empty)
  std::uint64_t capacity_bytes = 0;
  bool allow_memory_backed_directory = false;
  bool direct = false;  // also open an O_DIRECT descriptor (IoMode::direct)
};

// Creates, preallocates and maps the file in a directory that passed check_directory (the
// SpillArena constructor checks it once, before its I/O-mode probe uses it). Throws
// DirectoryError, MemoryBackedDirectoryError, InsufficientSpaceError, PreallocationError or
// IoError; on a throw nothing is left open and nothing is left on disk. With `direct`, a file
// system that refuses O_DIRECT raises InvalidArgumentError (IoMode::automatic checks
// direct_io_supported first).
std::unique_ptr<Storage> make_spill_file(const SpillFileOptions& options);

// Throws DirectoryError when `directory` is missing, not a directory or not writable.
void check_directory(const std::string& directory);

// The one wording of each refusal of a directory, for the arena's errors and `spillarena plan`
// alike (the CLI rewrites the option names, tools/cli/failures.cc): `e` from
// platform::check_writable_directory, with advice that fits it; a file system whose statfs
// counts no blocks (proc, sysfs, cgroupfs, devpts) stores no files.
std::string directory_refusal(const std::string& dir, int e);
bool stores_no_files(const platform::FileSystemInfo& fs);
std::string virtual_file_system_refusal(const std::string& dir, const std::string& type);

// Whether files in `directory` can be opened with O_DIRECT at page alignment; *why says why not.
bool direct_io_supported(const std::string& directory, std::string* why);

}  // namespace spill::detail
