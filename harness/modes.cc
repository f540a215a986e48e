#include "modes.h"

#include "core/text/quote.h"

namespace spill::harness {

const std::vector<std::string>& mode_names() {
  static const std::vector<std::string> names = {"none", "recompute", "ram", "disk", "per_file"};
  return names;
}

const std::vector<std::string>& mode_spellings() {
  static const std::vector<std::string> spellings = [] {
    std::vector<std::string> all = mode_names();
    all.push_back("per-file");
    return all;
  }();
  return spellings;
}

std::string mode_named(const std::string& spelling) {
  if (spelling == "per-file") return "per_file";
  for (const std::string& name : mode_names()) {
    if (name == spelling) return name;
  }
  std::string valid;
  for (const std::string& name : mode_names()) valid += (valid.empty() ? "" : ", ") + name;
  throw InvalidArgumentError("unknown mode " + detail::quote(spelling) + "; use one of " + valid);
}

ModeSetup make_mode(const std::string& mode, std::uint64_t capacity_bytes,
                    const std::string& directory, const ArenaTuning& tuning) {
  ModeSetup m;
  m.mode = mode_named(mode);
  if (m.mode == "recompute") m.stash = make_in_memory_stash();
  if (m.mode == "per_file") {
    m.stash = make_per_file_stash(directory.empty() ? default_spill_directory() : directory);
  }
  if (m.mode != "ram" && m.mode != "disk") return m;
  ArenaOptions o;
  o.directory = directory;
  o.capacity_bytes = capacity_bytes;
  o.backing = m.mode == "ram" ? Backing::ram : Backing::disk;
  o.start_writeback_after_write = tuning.start_writeback_after_write;
  o.io = tuning.io;
  if (tuning.staging_bytes > 0) o.staging_bytes = tuning.staging_bytes;
  o.when_full = tuning.when_full;
  o.grow = tuning.grow;
  o.growth_margin = tuning.growth_margin;
  m.arena = std::make_unique<SpillArena>(o);
  m.stash = make_arena_stash(*m.arena);
  return m;
}

}  // namespace spill::harness
