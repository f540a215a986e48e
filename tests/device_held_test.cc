// The device memory the arena stash holds on an accelerator, on the CPU through the copy seam's
// emulation (spill::testing::set_accelerator_emulation): at most prefetch_depth + 1 inputs (or
// keep_last + 1, when more are kept) in forward and backward, whatever the copies' delays and
// order and however full the pool (Note [The device-held bound] in src/core/stash/copy_window.cc);
// and the inputs backward takes back from the device before their copy finished, counted.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include "emulated_device.h"
#include "spill/checkpoint.h"
#include "spill/tensor_stash.h"
#include "stash_test_support.h"
#include "test_support.h"

#undef CHECK
#define CHECK(...) DOCTEST_CHECK(__VA_ARGS__)

using spill_test::Emulation;
using spill_test::engine_options;
using spill_test::HookScope;
using spill_test::ScratchDir;
using spill_test::slow_writes;
using spill_test::stash_arena;
using spill_test::stash_settings;

namespace {

constexpr std::int64_t kElements = 1024;
constexpr std::uint64_t kInputBytes = kElements * sizeof(float);
constexpr int kLayers = 12;

// The most device bytes the stash held, seen at every layer call of a forward and its backward
// (run at once after it: copies still in flight), and the stash's own peak.
struct Held {
  std::uint64_t forward = 0;
  std::uint64_t backward = 0;
  std::uint64_t peak = 0;
};

Held one_step(spill::TensorStash& stash) {
  Held held;
  auto layer = [&](const torch::Tensor& t) {
    const std::uint64_t now = stash.stats().device_bytes_held;
    std::uint64_t& most = torch::GradMode::is_enabled() ? held.backward : held.forward;
    most = std::max(most, now);
    return t * 2;
  };
  torch::Tensor x = torch::randn({kElements}).requires_grad_(true);
  torch::Tensor y = x;
  for (int i = 0; i < kLayers; ++i) y = spill::checkpoint(stash, layer, y);
  y.sum().backward();
  CHECK(torch::equal(x.grad(), torch::full({kElements}, double(1 << kLayers))));
  held.peak = stash.stats().peak_device_bytes_held;
  return held;
}

}  // namespace

// SPILLARENA_PREFETCH_THREAD for the scope (Note [Prefetching off the training thread] in
// src/core/stash/chain.cc; read when a chain is made).
class PrefetchThread {
 public:
  explicit PrefetchThread(const char* where) { setenv("SPILLARENA_PREFETCH_THREAD", where, 1); }
  ~PrefetchThread() { unsetenv("SPILLARENA_PREFETCH_THREAD"); }
  PrefetchThread(const PrefetchThread&) = delete;
  PrefetchThread& operator=(const PrefetchThread&) = delete;
};

TEST_CASE("device held: at most prefetch_depth + 1 inputs, whatever the copies' delays") {
  for (const char* where : {"training", "worker"}) {
    CAPTURE(where);
    const PrefetchThread prefetches(where);
    ScratchDir dir;
    // Copies slower than the layers, in random order; writes slower still; a pool from roomy to
    // one input.
    Emulation emulation(8000, 2000, 11);
    HookScope slow(slow_writes(5));
    for (std::uint64_t pool_inputs : {0ull, 1ull, 4ull}) {  // 0: the automatic pool (64 MiB)
      for (std::uint32_t depth : {0u, 1u, 2u}) {
        for (std::uint32_t keep_last : {0u, 1u}) {
          CAPTURE(pool_inputs);
          CAPTURE(depth);
          CAPTURE(keep_last);
          auto o = engine_options(dir.path(), spill::IoMode::direct, spill::IoBackend::automatic);
          if (pool_inputs != 0) o.host_pool_bytes = pool_inputs * kInputBytes;
          spill::SpillArena arena = stash_arena(o, stash_settings(true, keep_last, depth));
          auto stash = spill::make_arena_stash(arena);
          const std::uint64_t bound = (std::max(depth, keep_last) + 1) * kInputBytes;
          const Held held = one_step(*stash);
          CHECK(held.forward <= bound);
          CHECK(held.backward <= bound);
          CHECK(held.peak <= bound);
          const spill::StashStats s = stash->stats();
          // The copies are slower than the layers, so store() waited for them; with a pool of one
          // input it waits for room in the pool instead.
          if (pool_inputs != 1) {
            CHECK(s.copy_waits > 0);
            CHECK(s.copy_wait_ns > 0);
          }
          // Every input that left keep_last was written, or is counted as taken back from the
          // device mid-copy: at most the copies the window leaves in flight when forward ends.
          CHECK(s.inputs_spilled + s.inputs_back_before_copied == kLayers - keep_last);
          CHECK(s.inputs_back_before_copied <= std::max(depth, keep_last) - keep_last);
          CHECK(s.device_bytes_held == 0);
          CHECK(arena.stats().bytes_in_use == 0);
        }
      }
    }
  }
}

TEST_CASE("device held: prefetching on a worker gives the same gradients on the CPU path") {
  // the device path's are checked above; the CPU path's prefetches are reads ahead in direct
  // mode and the page cache's readahead in buffered mode
  const PrefetchThread prefetches("worker");
  ScratchDir dir;
  for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
    CAPTURE(static_cast<int>(io));
    auto o = engine_options(dir.path(), io, spill::IoBackend::automatic);
    spill::SpillArena arena = stash_arena(o, stash_settings(true, 0, 2));
    auto stash = spill::make_arena_stash(arena);
    // how many prefetches the worker makes before backward reaches their inputs is timing
    for (int step = 0; step < 2; ++step) one_step(*stash);
    CHECK(stash->stats().restores == 2 * kLayers);
    CHECK(arena.stats().bytes_in_use == 0);
  }
}

TEST_CASE("device held: a copy that fails is reported, and the steps after it do not hang") {
  // store() waits for the copies beyond the window; a failed copy's slot must close with it, or
  // every later store() would wait for it forever (a hang fails by name, not by ctest's timeout).
  spill_test::Deadline deadline("the steps after a failed copy", 120);
  ScratchDir dir;
  for (bool asynchronous : {true, false}) {
    CAPTURE(asynchronous);
    spill::testing::AcceleratorEmulation faults{true, 2000, 3, 500};
    faults.copies_to_host_to_fail = 1;
    Emulation emulation(faults);
    auto o = engine_options(dir.path(), spill::IoMode::direct, spill::IoBackend::automatic);
    // prefetch_depth 0 and keep_last 0: store() returns only once no copy is in flight
    spill::SpillArena arena = stash_arena(o, stash_settings(asynchronous, 0, 0));
    auto stash = spill::make_arena_stash(arena);
    CHECK_THROWS_WITH(one_step(*stash), doctest::Contains("emulated device copy failed"));
    for (int step = 0; step < 2; ++step) one_step(*stash);
    CHECK(stash->stats().device_bytes_held == 0);
    CHECK(arena.stats().bytes_in_use == 0);
  }
}
