// Modes by name, as the CLI, the benchmarks and the memory probe spell them:
//   none       no checkpointing
//   recompute  checkpointing with the inputs kept in RAM (the usual gradient checkpointing)
//   ram        inputs in a RAM-backed SpillArena
//   disk       inputs in a disk SpillArena (the point of spillarena)
//   per_file   one torch::save file per input (the approach spillarena replaces)
//
//   spill::models::ModeSetup m = spill::models::make_mode("disk", capacity, "/mnt/nvme");
//   torch::Tensor logits = gpt->forward(tokens, m.stash);   // m.arena->stats() for numbers
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "spill/arena.h"
#include "spill/tensor_stash.h"

namespace spill::models {

const std::vector<std::string>& mode_names();

struct ModeSetup {
  std::string mode;
  std::unique_ptr<SpillArena> arena;   // for ram and disk
  std::shared_ptr<TensorStash> stash;  // nullptr for none
};

// Arena settings of the ram and disk modes beyond capacity and directory.
struct ArenaTuning {
  bool eager_writeback = true;        // ArenaOptions::start_writeback_after_write
  IoMode io = IoMode::automatic;      // ArenaOptions::io
  std::uint64_t staging_bytes = 0;    // ArenaOptions::staging_bytes; 0: the arena's default
};

// Throws spill::InvalidArgumentError for an unknown mode (naming the valid ones) and the arena's
// errors for a bad directory or capacity. "per-file" is accepted for "per_file".
// eager_writeback sets ArenaOptions::start_writeback_after_write and `io` ArenaOptions::io for
// the disk mode.
ModeSetup make_mode(const std::string& mode, std::uint64_t capacity_bytes,
                    const std::string& directory, bool eager_writeback = true,
                    IoMode io = IoMode::automatic);
ModeSetup make_mode(const std::string& mode, std::uint64_t capacity_bytes,
                    const std::string& directory, const ArenaTuning& tuning);

}  // namespace spill::models
