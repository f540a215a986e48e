// Hooks for tests; not for production use. They make the library misbehave on purpose, so a test
// can prove what happens when a disk does: the system calls at the platform seam return short
// counts or errors, and queued I/O operations run late or fail.
//
//   #include <spill/testing.h>
//   spill::testing::set_fault_hook([](spill::testing::FaultSite site, std::uint64_t bytes,
//                                     std::uint64_t /*offset*/) -> std::int64_t {
//     if (site == spill::testing::FaultSite::pread) return -EIO;  // every pread fails
//     return static_cast<std::int64_t>(std::max<std::uint64_t>(bytes / 2, 1));  // others: half
//   });
//   spill::testing::set_io_test_hook([](spill::IoOp op) {
//     return op == spill::IoOp::write ? ENOSPC : 0;  // every queued write fails whole
//   });
//   // ... arena.allocate(...), write, read: the hooks decide ...
//   spill::testing::set_fault_hook({});    // both gone
//   spill::testing::set_io_test_hook({});
//
// Both hooks are process-wide and may be called on any thread, concurrently; they must not throw.
#pragma once

#include <cstdint>
#include <functional>

#include "spill/io.h"

namespace spill::testing {

// The calls the fault hook may shape: the pwrite/pread of synchronous and thread-pool transfers,
// a read or write piece submitted to io_uring, and the open of a spill file without a name
// (O_TMPFILE: the platform seam's open_unnamed, Note [Unnamed spill file]).
enum class FaultSite { pwrite, pread, ring_write, ring_read, open_unnamed, preallocate };

// Called before each such call with the bytes it asks for (0 for open_unnamed; the file's new
// size for preallocate, which fails with -errno or runs whole) and its file offset.
// Returns what the call may do: `bytes` (all of it), fewer (a real short count: only that many
// move), 0 (nothing moves: end of file), or -errno (it fails and moves nothing). May sleep.
// The sign is the call's own: one number that is either a count or a failure, as pwrite and
// io_uring's cqe->res return it. The hook below only ever fails, so it returns a positive
// errno, as the platform seam (src/core/os/platform.h) does.
using FaultHook =
    std::function<std::int64_t(FaultSite site, std::uint64_t bytes, std::uint64_t offset)>;

// Installs `hook` for every call from now on (any thread); an empty function removes it. Not
// installed, each call pays one relaxed atomic load. See Note [Fault injection at the seam] in
// src/core/os/fault_injection.cc.
void set_fault_hook(FaultHook hook);

// I/O queues created afterwards call `hook` on their worker thread for every read and write,
// before it runs (thread pool) or before its completion is delivered (io_uring). The hook may
// sleep (to shuffle timings) and returns 0, or an errno that fails the whole operation. An empty
// function removes it. See Note [The I/O queue] in src/core/io/io_queue.cc.
void set_io_test_hook(std::function<int(IoOp op)> hook);

// LibTorch layer (spillarena::spillarena): while enabled, the arena stash treats CPU inputs as
// accelerator inputs — through the host pool, with device <-> host copies made on a thread of
// their own after a random delay of min_delay_us to max_delay_us each — so tests check the
// accelerator path's budget, back-pressure, release timing and gradients without a GPU. Entries
// stored meanwhile keep that engine until they are restored. The emulated device pins host memory
// as a GPU's host allocator does (a power-of-two pool, page-aligned host memory standing in for
// pinned, StashStats::host_pool_pinned true) unless pinning_refused. Each call is a fresh device:
// the host pool's once-per-process warning may be given again. See Note [Accelerator copies] in
// src/torch_layer/device_copy.cc.
//
//   spill::testing::set_accelerator_emulation({true, 200, 7});  // up to 200 us, seed 7
//   ... spill::checkpoint(arena, layer, x) on CPU tensors ...
//   spill::testing::set_accelerator_emulation({});              // off
struct AcceleratorEmulation {
  bool enabled = false;
  std::uint32_t max_delay_us = 0;
  std::uint64_t seed = 1;
  std::uint32_t min_delay_us = 0;
  // Faults: the next this many device tensors the stash allocates to restore into fail as
  // LibTorch fails when the device is out of memory (c10::OutOfMemoryError) ...
  std::uint32_t device_allocations_to_fail = 0;
  // ... and the host pool cannot be allocated, pinned or pageable (the memory was gone by the
  // time the first input was stored) ...
  bool host_pool_refused = false;
  // ... or the driver refuses to pin it (cudaHostAlloc failing: a memlock cap the automatic
  // budget did not know, WSL) while pageable memory is still had: the same pool is then
  // pageable, with one warning (TORCH_WARN). An explicit host_pool_bytes above RLIMIT_MEMLOCK
  // is an InvalidArgumentError before any of this.
  bool pinning_refused = false;
};
void set_accelerator_emulation(const AcceleratorEmulation& emulation);

}  // namespace spill::testing
