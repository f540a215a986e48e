// The arena stash's settings and counters, kept with its arena: what LibTorch's C++ API
// (spill/tensor_stash.h) and the Python package share, without LibTorch.
//
//   spill::SpillArena arena(spill::ArenaOptions{});
//   spill::StashOptions o = spill::stash_options(arena);
//   o.prefetch_depth = 4;
//   spill::set_stash_options(arena, o);        // for the stashes made without options
//   spill::StashStats s = spill::stash_stats(arena);
//   std::cout << s.restore_waits << " restores waited for their bytes\n";
#pragma once

#include <cstdint>
#include <string>

#include "spill/arena.h"

namespace spill {

// The arena stash's own settings (the arena itself never reads them). See Note [Overlapped
// spilling] in src/core/stash/chain.cc.
struct StashOptions {
  // Overlap spilling with compute; false spills and restores synchronously (the comparison
  // point).
  bool asynchronous = true;
  // In backward, reads of this many predecessors are queued when a layer's input is restored.
  std::uint32_t prefetch_depth = 2;
  // The inputs of the last layers stored are kept where they are, not spilled: their backward
  // comes first, so spilling them would only cost time.
  std::uint32_t keep_last = 1;
  // io = gds: the device staging buffer registered with cuFile once, through which every
  // transfer goes (larger inputs piece by piece), rounded up to 4 KiB. One per arena, made at
  // its first device input by the stash storing it. See Note [One registered staging buffer] in
  // src/core/stash/gds_path.cc.
  std::uint64_t gds_buffer_bytes = 16ull << 20;
};

// What the arena stashes of one arena did and hold (zeros for the other stashes). Device bytes are
// those of accelerator inputs the stash references: stored and not yet copied off, or brought back
// and not yet restored. See Note [The host pool] in src/core/stash/host_pool.cc. Each field is
// listed once more, in src/core/stash/stash_fields.h (Note [One list of each struct's fields]).
struct StashStats {
  std::uint64_t inputs_stored = 0;
  // Inputs whose bytes reached the arena: writes that completed, including an input backward
  // took back from memory while its write was in flight (keep_last inputs are never written).
  std::uint64_t inputs_spilled = 0;
  // The same two counts for the tensors that are not layer inputs, counted apart from them: the
  // operation outputs an offload policy spills and the saved tensors of spillarena.offload()
  // (front ends say which through StashInput::layer_input).
  std::uint64_t saved_tensors_stored = 0;
  std::uint64_t saved_tensors_spilled = 0;
  std::uint64_t device_bytes_held = 0;
  std::uint64_t peak_device_bytes_held = 0;
  std::uint64_t host_pool_bytes = 0;  // the pool's size once made (first accelerator input)
  // Times the automatic pool was made anew, larger, after store()s waited for room in it (Note
  // [A pool sized from what the disk does] in src/core/stash/host_pool.cc).
  std::uint64_t host_pool_grows = 0;
  bool host_pool_pinned = false;
  std::uint64_t peak_host_pool_bytes_in_use = 0;
  std::uint64_t host_bytes_in_flight = 0;  // CPU inputs held while their writes are in flight
  std::uint64_t peak_host_bytes_in_flight = 0;
  std::uint64_t pool_waits = 0;  // store()s and restores that waited for room in the budget
  std::uint64_t pool_wait_ns = 0;
  // store()s that waited for device -> host copies to complete, so that the stash holds at most
  // max(prefetch_depth, keep_last) + 1 inputs on the device (Note [The device-held bound] in
  // src/core/stash/copy_window.cc), and their time.
  std::uint64_t copy_waits = 0;
  std::uint64_t copy_wait_ns = 0;
  // Accelerator inputs backward took back from the device while their copy to the host was still
  // in flight: the step ran shorter than the copy, so they were never written (not counted in
  // inputs_spilled).
  std::uint64_t inputs_back_before_copied = 0;
  std::uint64_t inputs_kept_on_device = 0;  // PoolFull::keep_on_device found no room
  std::uint64_t bytes_kept_on_device = 0;
  std::uint64_t pieces = 0;         // transfers of inputs larger than the pool, piece by piece
  std::uint64_t restores = 0;       // stashed tensors given back
  std::uint64_t restore_waits = 0;  // ... that had to wait for their I/O
  std::uint64_t restore_wait_ns = 0;
  std::uint64_t prefetches = 0;     // reads queued ahead of backward
  std::uint64_t prefetch_hits = 0;  // ... whose tensor was ready when backward asked
  // CPU restores that landed in host memory a restore before them had used (Note [Restoring
  // into reused memory] in src/core/stash/restore_pool.cc), not fresh pages.
  std::uint64_t restores_into_reused_memory = 0;
  // io = gds (zeros and "" until the first device input): the registered device staging buffer
  // (device memory besides the inputs), cuFile's mode, the host memory its bounce buffers may
  // take (compatibility mode; part of the host budget: Note [cuFile's bounce buffers] in
  // src/core/io/gds.cc) and the bytes moved through cuFile (the sub-4 KiB tails go the host path).
  std::uint64_t gds_buffer_bytes = 0;
  bool gds_buffer_registered = false;
  std::string cufile_mode;
  std::uint64_t cufile_bounce_bytes = 0;
  std::uint64_t cufile_bytes_written = 0;
  std::uint64_t cufile_bytes_read = 0;
};

// The options of the stashes made for `arena` without options of their own (the shared stash
// of spill::checkpoint(arena, ...) among them: one per arena while any of its tensors is
// stashed), kept with the arena for every handle to it; a shared stash already in use keeps the
// options it was made with.
void set_stash_options(const SpillArena& arena, const StashOptions& options);
StashOptions stash_options(const SpillArena& arena);
// What every arena stash of `arena` did and holds: the host pool and counters are kept with the
// arena, so they outlive the shared stash (which lives as long as a graph) and span steps.
StashStats stash_stats(const SpillArena& arena);
}  // namespace spill
