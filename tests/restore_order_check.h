// The one check that a restore queues its predecessors' reads before it waits for its own
// (Note [Overlapped spilling] in src/core/stash/chain.cc), for whichever path the caller sets up
// (the CPU path as is; the device path under an emulated accelerator):
//
//   Emulation emulation(0);                          // device_path_test.cc only
//   spill_test::check_restore_queues_predecessors_first();
//
// Every read is held in the I/O queue until the restore's own read and its two predecessors'
// were all queued. A restore that waited for its own bytes before queueing the others would
// leave its read to give up holding (10 s) having seen only itself.
#pragma once

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "io_test_support.h"
#include "stash_test_support.h"
#include "test_support.h"

namespace spill_test {

inline void check_restore_queues_predecessors_first() {
  ScratchDir dir;
  QueuedReads reads(std::chrono::seconds(10));
  HookScope hook(reads.hook());
  spill::SpillArena arena = stash_arena(
      engine_options(dir.path(), spill::IoMode::direct, spill::IoBackend::thread_pool),
      stash_settings(false, 0, 2));  // synchronous: each store() returns with its input written
  auto stash = spill::make_arena_stash(arena);
  std::vector<torch::Tensor> inputs;
  std::vector<std::unique_ptr<spill::StashedTensor>> stored;
  for (int i = 0; i < 4; ++i) {
    inputs.push_back(torch::randn({16, 1024}));
    stored.push_back(stash->store(inputs.back()));
  }
  REQUIRE(stash->stats().inputs_spilled == 4);
  const std::uint64_t bytes = 16 * 1024 * sizeof(float);
  reads.watch(&arena, 3 * bytes);
  const torch::Tensor last = stored[3]->restore();
  reads.watch(nullptr, 0);
  CHECK(reads.fewest_seen() == 3 * bytes);
  CHECK(torch::equal(last, inputs[3]));
  const spill::StashStats s = stash->stats();
  CHECK(s.prefetches == 2);
  CHECK(s.restore_waits == 1);  // its bytes were on disk when it began
  for (int i = 2; i >= 0; --i) CHECK(torch::equal(stored[i]->restore(), inputs[i]));
  CHECK(arena.stats().bytes_in_use == 0);
}

}  // namespace spill_test
