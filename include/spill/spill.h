// spillarena: gradient checkpointing whose saved layer inputs live in one preallocated,
// memory-mapped spill file.
//
//   #include <spill/spill.h>
//   spill::ArenaOptions options;
//   options.directory = "/mnt/nvme/spill";
//   options.capacity_bytes = spill::bytes_for_layer_inputs(32, {1, 8192, 4096}, torch::kBFloat16);
//   spill::SpillArena arena(options);
//   spill::CheckpointedSequential net(blocks, arena);
//   net->forward(x).sum().backward();
//   std::cout << arena.stats().peak_bytes_in_use << "\n";
#pragma once

#include "spill/checkpoint.h"
#include "spill/checkpointed_sequential.h"
#include "spill/core.h"
#include "spill/tensor_stash.h"
