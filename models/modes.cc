#include "modes.h"

namespace spill::models {

const std::vector<std::string>& mode_names() {
  static const std::vector<std::string> names = {"none", "recompute", "ram", "disk", "per_file"};
  return names;
}

ModeSetup make_mode(const std::string& mode, std::uint64_t capacity_bytes,
                    const std::string& directory, bool eager_writeback, IoMode io) {
  return make_mode(mode, capacity_bytes, directory, ArenaTuning{eager_writeback, io, 0});
}

ModeSetup make_mode(const std::string& mode_in, std::uint64_t capacity_bytes,
                    const std::string& directory, const ArenaTuning& tuning) {
  ModeSetup m;
  m.mode = mode_in == "per-file" ? "per_file" : mode_in;
  if (m.mode == "none") return m;
  if (m.mode == "recompute") {
    m.stash = make_in_memory_stash();
  } else if (m.mode == "ram" || m.mode == "disk") {
    ArenaOptions o;
    o.directory = directory;
    o.capacity_bytes = capacity_bytes;
    o.backing = m.mode == "ram" ? Backing::ram : Backing::disk;
    o.start_writeback_after_write = tuning.eager_writeback;
    o.io = tuning.io;
    if (tuning.staging_bytes > 0) o.staging_bytes = tuning.staging_bytes;
    m.arena = std::make_unique<SpillArena>(o);
    m.stash = make_arena_stash(*m.arena);
  } else if (m.mode == "per_file") {
    m.stash = make_per_file_stash(directory.empty() ? default_spill_directory() : directory);
  } else {
    throw InvalidArgumentError("unknown mode '" + mode_in +
                               "'; use one of none, recompute, ram, disk, per-file");
  }
  return m;
}

}  // namespace spill::models
