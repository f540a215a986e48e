// For tests (the spillarena_test_support library, not spillarena itself): while enabled, the
// arena stash treats CPU inputs as accelerator inputs — through the host pool, with device <->
// host copies made on a thread of their own after a random delay of min_delay_us to
// max_delay_us each — so tests check the accelerator path's budget, back-pressure, release
// timing and gradients without a GPU. Entries stored meanwhile keep that engine until they are
// restored. The emulated device pins host memory as a GPU's host allocator does (a power-of-two
// pool, page-aligned host memory standing in for pinned, StashStats::host_pool_pinned true)
// unless pinning_refused. Each call is a fresh device: the host pool's once-per-process warning
// may be given again. The engine goes in through the library's copy seam
// (detail::set_copy_engine_override, src/core/stash/copy_engine.h); see Note [Accelerator
// copies] in src/torch_layer/stream_engine.cc.
//
//   spill::testing::set_accelerator_emulation({true, 200, 7});  // up to 200 us, seed 7
//   ... spill::checkpoint(arena, layer, x) on CPU tensors ...
//   spill::testing::set_accelerator_emulation({});              // off
#pragma once

#include <cstdint>

namespace spill::testing {

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
  // ... or the next this many device -> host copies fail as a device fails one (their
  // synchronize() throws std::runtime_error, as a CUDA error reaches LibTorch's callers).
  std::uint32_t copies_to_host_to_fail = 0;
};
void set_accelerator_emulation(const AcceleratorEmulation& emulation);

}  // namespace spill::testing
