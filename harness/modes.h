// Modes by name: where a training step keeps its checkpointed layer inputs, as the CLI, the
// benchmarks and the memory probe spell them (mode_names() is the one list):
//   none       no checkpointing
//   recompute  checkpointing with the inputs kept in RAM (the usual gradient checkpointing):
//              the stash is spill::make_in_memory_stash(), named for what it does; the mode
//              keeps the name users know from torch and transformers
//   ram        inputs in a RAM SpillArena (Backing::ram)
//   disk       inputs in a disk SpillArena (the point of spillarena)
//   per_file   one torch::save file per input (the approach spillarena replaces)
//
//   spill::harness::ModeSetup m = spill::harness::make_mode("disk", capacity, "/mnt/nvme");
//   torch::Tensor logits = gpt->forward(tokens, m.stash);   // m.arena->stats() for numbers
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "spill/arena.h"
#include "spill/tensor_stash.h"

namespace spill::harness {

// The modes, in the order above; mode_spellings() adds "per-file", accepted for "per_file".
const std::vector<std::string>& mode_names();
const std::vector<std::string>& mode_spellings();
// The mode a spelling names ("per-file" -> "per_file"); InvalidArgumentError naming the modes
// for anything else.
std::string mode_named(const std::string& spelling);

struct ModeSetup {
  std::string mode;
  std::unique_ptr<SpillArena> arena;   // for ram and disk
  std::shared_ptr<TensorStash> stash;  // nullptr for none
};

// Arena settings of the ram and disk modes beyond capacity and directory.
struct ArenaTuning {
  bool start_writeback_after_write = true;  // ArenaOptions::start_writeback_after_write
  IoMode io = IoMode::automatic;            // ArenaOptions::io
  std::uint64_t staging_bytes = 0;          // ArenaOptions::staging_bytes; 0: the arena's default
  WhenFull when_full = ArenaOptions{}.when_full;        // ArenaOptions::when_full
  bool grow = ArenaOptions{}.grow;                      // ArenaOptions::grow
  double growth_margin = ArenaOptions{}.growth_margin;  // ArenaOptions::growth_margin
};

// Throws spill::InvalidArgumentError for an unknown mode (see mode_named) and the arena's errors
// for a bad directory or capacity.
ModeSetup make_mode(const std::string& mode, std::uint64_t capacity_bytes,
                    const std::string& directory, const ArenaTuning& tuning = {});

}  // namespace spill::harness
