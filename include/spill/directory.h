// Looking at a spill directory before committing to it: what `spillarena plan` reports.
//
//   #include <spill/units.h>                                  // human_bytes
//   spill::DirectoryInfo d = spill::inspect_directory("/mnt/nvme/spill");
//   if (!d.usable) std::cerr << d.problem << "\n";           // missing, not writable, ...
//   else if (d.memory_backed) std::cerr << d.file_system_type << " lives in RAM\n";
//   else std::cout << spill::human_bytes(d.free_bytes) << " free on " << d.file_system_type;
#pragma once

#include <cstdint>
#include <string>

namespace spill {

struct DirectoryInfo {
  std::string path;
  bool usable = false;           // exists, is a directory, writable: an arena may be made there
  std::string problem;           // why not usable ("" when usable)
  std::string file_system_type;  // "ext4", "tmpfs", ...
  bool memory_backed = false;    // tmpfs, ramfs, hugetlbfs
  std::uint64_t free_bytes = 0;
  std::uint64_t total_bytes = 0;
};

// Never throws; an unusable directory says why in `problem`, with advice that fits (a missing
// one is to be created, a virtual file system replaced, ...).
DirectoryInfo inspect_directory(const std::string& directory);

// The one answer to an empty string where a directory is named (Python's directory=, the
// axolotl key, the CLI's --dir; ArenaOptions::directory = "" is C++'s way to ask for the
// default): it would silently mean the default directory. `instead` says how to ask for the
// default there, e.g. "omit --dir".
std::string empty_directory_refusal(const std::string& instead);

}  // namespace spill
