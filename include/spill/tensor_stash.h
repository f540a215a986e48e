// TensorStash: where spill::checkpoint keeps a layer's input between forward and backward. One
// interface, four places, so users and benchmarks compare like with like:
//
//   #include <spill/checkpoint.h>                           // spill::checkpoint
//   spill::SpillArena disk_arena(disk_options);              // options.backing = Backing::disk
//   auto disk = spill::make_arena_stash(disk_arena);         // the spill file (the point)
//   spill::StashOptions sync;                                // the stash's own settings
//   sync.asynchronous = false;
//   auto disk_sync = spill::make_arena_stash(disk_arena, sync);
//   spill::set_stash_options(disk_arena, sync);              // for spill::checkpoint(arena, ...)
//   auto ram = spill::make_arena_stash(ram_arena);           // same allocator over host memory
//   auto recompute = spill::make_in_memory_stash();          // classic checkpointing: keep input
//   auto per_file = spill::make_per_file_stash("/mnt/nvme"); // torch::save per tensor (baseline)
//   torch::Tensor y = spill::checkpoint(*disk, layer_fn, x);
//
// Stashes are thread-safe; a stashed tensor may be restored on another thread. The arena stash
// overlaps its disk traffic with compute (see Note [Overlapped spilling] in
// src/core/stash/chain.cc): store() returns before the bytes reached the disk, restore()
// finds them already read back when prefetched.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>

#include "spill/arena.h"
#include "spill/stash.h"

namespace spill {

// One stored tensor. restore() gives back a tensor equal to the stored one (same values, sizes,
// dtype and device; the stored strides when they were non-overlapping and dense, as for a
// transpose, else contiguous), waiting for whatever of its movement is still in flight; on an
// accelerator the current stream is ordered after the copy, the host is not blocked. It may be
// called once: a second call is spill::CheckpointError ("already restored"). Errors of the
// asynchronous spill (spill::IoError) are thrown here at the latest, and again if called again.
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
  virtual StashStats stats() const { return {}; }
};

// Regions of `arena` (disk or RAM backing). The stash holds its own handle to the arena, follows
// `options` (without them: the arena's, set_stash_options) and the arena's host budget
// (host_pool_bytes, when_pool_full).
std::shared_ptr<TensorStash> make_arena_stash(const SpillArena& arena);
std::shared_ptr<TensorStash> make_arena_stash(const SpillArena& arena, const StashOptions& options);
// Keeps a reference to the input itself: gradient checkpointing without offloading.
std::shared_ptr<TensorStash> make_in_memory_stash();
// One torch::save file per tensor in `directory`, torch::load + delete on restore; deleted as
// well when the stashed tensor dies unrestored. The approach spillarena replaces.
std::shared_ptr<TensorStash> make_per_file_stash(const std::string& directory);

}  // namespace spill
