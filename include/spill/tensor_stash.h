// TensorStash: where spill::checkpoint keeps a layer's input between forward and backward. One
// interface, four places, so users and benchmarks compare like with like:
//
//   spill::SpillArena disk_arena(disk_options);              // options.backing = Backing::disk
//   auto disk = spill::make_arena_stash(disk_arena);         // the spill file (the point)
//   auto ram = spill::make_arena_stash(ram_arena);           // same allocator over host memory
//   auto recompute = spill::make_in_memory_stash();          // classic checkpointing: keep input
//   auto per_file = spill::make_per_file_stash("/mnt/nvme"); // torch::save per tensor (baseline)
//   torch::Tensor y = spill::checkpoint(*disk, layer_fn, x);
//
// Stashes are thread-safe; a stashed tensor may be restored on another thread.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

#include "spill/arena.h"

namespace spill {

// One stored tensor. restore() gives back a tensor equal to the stored one (same values, sizes,
// dtype and device; contiguous). It may be called once.
class StashedTensor {
 public:
  virtual ~StashedTensor() = default;
  virtual torch::Tensor restore() = 0;
  // A hint that restore() of whatever was stashed just before this one comes next.
  virtual void prefetch_previous() {}
};

class TensorStash {
 public:
  virtual ~TensorStash() = default;
  // Throws spill::ArenaExhaustedError (naming the tensor's shape and bytes) when there is no room.
  virtual std::unique_ptr<StashedTensor> store(const torch::Tensor& tensor) = 0;
  virtual std::string name() const = 0;  // "disk", "ram", "recompute", "per_file"
};

// Regions of `arena` (disk or RAM backing). The stash holds its own handle to the arena.
std::shared_ptr<TensorStash> make_arena_stash(const SpillArena& arena);
// Keeps a reference to the input itself: gradient checkpointing without offloading.
std::shared_ptr<TensorStash> make_in_memory_stash();
// One torch::save file per tensor in `directory`, torch::load + delete on restore; deleted as
// well when the stashed tensor dies unrestored. The approach spillarena replaces.
std::shared_ptr<TensorStash> make_per_file_stash(const std::string& directory);

}  // namespace spill
