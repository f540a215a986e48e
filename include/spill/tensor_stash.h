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
// Stashes are thread-safe; a stashed tensor may be restored on another thread. The arena stash
// overlaps its disk traffic with compute (see Note [Overlapped spilling] in
// src/torch_layer/arena_stash.cc): store() returns before the bytes reached the disk, restore()
// finds them already read back when prefetched.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

#include "spill/arena.h"

namespace spill {

// One stored tensor. restore() gives back a tensor equal to the stored one (same values, sizes,
// dtype and device; contiguous), waiting for whatever of its movement is still in flight; on an
// accelerator the current stream is ordered after the copy, the host is not blocked. It may be
// called once. Errors of the asynchronous spill (spill::IoError) are thrown here at the latest.
class StashedTensor {
 public:
  virtual ~StashedTensor() = default;
  virtual torch::Tensor restore() = 0;
  // Starts bringing the tensor back (disk read, host-to-device copy) without waiting; restore()
  // then finds it ready. Idempotent; a no-op where there is nothing to move.
  virtual void prefetch() {}
};

class TensorStash {
 public:
  virtual ~TensorStash() = default;
  // Throws spill::ArenaExhaustedError (naming the tensor's shape and bytes) when there is no room.
  virtual std::unique_ptr<StashedTensor> store(const torch::Tensor& tensor) = 0;
  virtual std::string name() const = 0;  // "disk", "ram", "recompute", "per_file"
};

// Regions of `arena` (disk or RAM backing). The stash holds its own handle to the arena and
// follows its options: asynchronous, prefetch_depth, keep_last.
std::shared_ptr<TensorStash> make_arena_stash(const SpillArena& arena);
// The stash spill::checkpoint(arena, ...) uses: one per arena while any of its tensors is
// stashed, so consecutive layers form one chain for prefetching and keep_last.
std::shared_ptr<TensorStash> shared_arena_stash(const SpillArena& arena);
// Keeps a reference to the input itself: gradient checkpointing without offloading.
std::shared_ptr<TensorStash> make_in_memory_stash();
// One torch::save file per tensor in `directory`, torch::load + delete on restore; deleted as
// well when the stashed tensor dies unrestored. The approach spillarena replaces.
std::shared_ptr<TensorStash> make_per_file_stash(const std::string& directory);

}  // namespace spill
