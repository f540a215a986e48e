// The arena stash's accelerator path on the CPU, through the copy seam's emulation
// (spill::testing::set_accelerator_emulation): the host pool's budget, back-pressure, release of
// device memory when the device -> host copy completes, inputs larger than the pool, keep on
// device, bounded restores, in-place changes, bitwise gradients, pinning refused (the same pool,
// pageable, one warning), host memory flat in the depth — and the CPU path's bounded bytes in
// flight. Every run of CI exercises what a GPU machine would.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "accelerator_emulation.h"
#include "core/stash/chain.h"
#include "core/stash/host_pool.h"
#include "core/stash/stash_entry.h"
#include "emulated_device.h"
#include "gpt_test_support.h"
#include "io_test_support.h"
#include "restore_order_check.h"
#include "spill/process_memory.h"
#include "spill/units.h"
#include "stash_test_support.h"
#include "test_support.h"
#include "torch_layer/stream_engine.h"
#include "torch_warnings.h"

// LibTorch's logging header defines its own CHECK, which aborts the process at the first failure
// instead of reporting it; the checks below are doctest's.
#undef CHECK
#define CHECK(...) DOCTEST_CHECK(__VA_ARGS__)

using spill_test::Emulation;
using spill_test::engine_options;
using spill_test::HookScope;
using spill_test::ScratchDir;
using spill_test::slow_writes;
using spill_test::stash_arena;
using spill_test::stash_settings;
using spill_test::subcase_name;
using namespace spill_test::gpt;

namespace {

template <class Condition>
bool eventually(Condition condition, int timeout_ms = 5000) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < end) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return condition();
}

constexpr std::uint64_t kInputBytes = 2 * 32 * 64 * sizeof(float);  // GptReference's input

}  // namespace

TEST_CASE("device path: gradients are bit-identical through the host pool in every setting") {
  ScratchDir dir;
  GptReference g(4, 99, {2, 32, 64});
  Emulation emulation(300);
  for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
    for (bool asynchronous : {false, true}) {
      for (std::uint32_t keep_last : {0u, 1u}) {
        for (auto backing : {spill::Backing::disk, spill::Backing::ram}) {
          const char* overlap = asynchronous ? "asynchronous" : "synchronous";
          const std::string keep = "keep_last " + std::to_string(keep_last);
          SUBCASE(subcase_name(io, overlap, keep, backing).c_str()) {
            auto o = engine_options(dir.path(), io, spill::IoBackend::automatic, backing);
            spill::SpillArena arena = stash_arena(o, stash_settings(asynchronous, keep_last));
            auto stash = spill::make_arena_stash(arena);
            g.check(gpt_step(g.blocks, stash, g.x0));
            const spill::StashStats s = stash->stats();
            // Asynchronous: the last inputs may still be in their copies when backward takes them
            // back (given back as they are, not spilled).
            if (!asynchronous) CHECK(s.inputs_spilled == 4 - keep_last);
            CHECK(s.inputs_spilled <= 4 - keep_last);
            CHECK(s.host_pool_bytes > 0);  // automatic (64 MiB, or RLIMIT_MEMLOCK below it)
            CHECK(s.host_pool_pinned);     // as the emulated device pins (a power of two)
            CHECK(s.device_bytes_held == 0);
            CHECK(arena.stats().bytes_in_use == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("device path: an input larger than the pool goes through it in pieces") {
  ScratchDir dir;
  GptReference g(3, 5, {2, 32, 64});
  Emulation emulation(100);
  for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
    for (bool asynchronous : {false, true}) {
      SUBCASE(subcase_name(io, asynchronous ? "asynchronous" : "synchronous").c_str()) {
        auto o = engine_options(dir.path(), io, spill::IoBackend::automatic);
        o.host_pool_bytes = 4096;  // a quarter of one input
        spill::SpillArena arena = stash_arena(o, stash_settings(asynchronous, 0));
        auto stash = spill::make_arena_stash(arena);
        g.check(gpt_step(g.blocks, stash, g.x0));
        const spill::StashStats s = stash->stats();
        CHECK(s.host_pool_bytes == 4096);
        CHECK(s.pieces == 6);  // 3 spilled, 3 restored
        CHECK(s.peak_host_pool_bytes_in_use <= 4096);
      }
    }
  }
}

TEST_CASE("device path: a full pool makes store() wait for the oldest write, never exceeding it") {
  // store() waits on the pool: a hang fails by name, not by ctest's timeout.
  spill_test::Deadline deadline("a full pool's wait", 240);
  ScratchDir dir;
  GptReference g(8, 11, {2, 32, 64});
  Emulation emulation(0);
  HookScope slow(slow_writes(100));  // long enough that a loaded machine still fills the pool
  auto o = engine_options(dir.path(), spill::IoMode::direct, spill::IoBackend::thread_pool);
  o.host_pool_bytes = 2 * kInputBytes;
  spill::SpillArena arena = stash_arena(o, stash_settings(true, 0));
  auto stash = spill::make_arena_stash(arena);
  for (int step = 0; step < 2; ++step) {
    g.check(gpt_step(g.blocks, stash, g.x0));
  }
  const spill::StashStats s = stash->stats();
  CHECK(s.pool_waits > 0);
  CHECK(s.pool_wait_ns > 0);
  CHECK(s.peak_host_pool_bytes_in_use <= 2 * kInputBytes);
  // Backward may take back from memory the inputs still in the pool when it begins: at most the
  // pool's two per step (one CI run under load took back three in all).
  CHECK(s.inputs_spilled >= 2 * (8 - 2));
  CHECK(s.inputs_kept_on_device == 0);
}

TEST_CASE("device path: keep_on_device leaves inputs on the device when the pool is full") {
  ScratchDir dir;
  GptReference g(8, 11, {2, 32, 64});
  Emulation emulation(0);
  HookScope slow(slow_writes(400));  // the pool stays full for the whole forward, even under load
  auto o = engine_options(dir.path(), spill::IoMode::direct, spill::IoBackend::thread_pool);
  o.host_pool_bytes = kInputBytes;
  o.when_pool_full = spill::PoolFull::keep_on_device;
  spill::SpillArena arena = stash_arena(o, stash_settings(true, 0));
  auto stash = spill::make_arena_stash(arena);
  g.check(gpt_step(g.blocks, stash, g.x0));
  const spill::StashStats s = stash->stats();
  CHECK(s.inputs_kept_on_device > 0);
  CHECK(s.bytes_kept_on_device == s.inputs_kept_on_device * kInputBytes);
  CHECK(s.inputs_spilled + s.inputs_kept_on_device >= 7);
  CHECK(s.inputs_spilled + s.inputs_kept_on_device <= 8);
}

// As "overlap: a restore queues its predecessors' reads before it waits for its own"
// (overlapped_checkpoint_test.cc), through the host pool: the restore's own read takes a block
// (waiting for room if need be), its predecessors' take what is free beyond that.
TEST_CASE("device path: a restore queues its predecessors' reads before it waits for its own") {
  Emulation emulation(0);
  spill_test::check_restore_queues_predecessors_first();
}

TEST_CASE("device path: device memory is released when the copy completes, before the write") {
  ScratchDir dir;
  Emulation emulation(0);
  HookScope slow(slow_writes(300));
  auto o = engine_options(dir.path(), spill::IoMode::buffered, spill::IoBackend::thread_pool);
  spill::SpillArena arena = stash_arena(o, stash_settings(true, 0));
  auto stash = spill::make_arena_stash(arena);
  torch::Tensor x = torch::randn({1024});
  const torch::Tensor expected = x.clone();
  auto stored = stash->store(x);
  CHECK(eventually([&] { return stash->stats().device_bytes_held == 0; }));
  CHECK(x.storage().use_count() == 1);        // the stash holds no reference any more
  CHECK(stash->stats().inputs_spilled == 0);  // ... while the write is still in flight
  CHECK(stash->stats().peak_device_bytes_held == 4096);
  CHECK(eventually([&] { return stash->stats().inputs_spilled == 1; }));
  CHECK(torch::equal(stored->restore(), expected));
}

TEST_CASE("device path: restored inputs on the device are bounded by prefetch_depth + 1") {
  ScratchDir dir;
  Emulation emulation(50);
  for (std::uint32_t depth : {0u, 1u, 2u}) {
    CAPTURE(depth);
    auto o = engine_options(dir.path(), spill::IoMode::direct, spill::IoBackend::automatic);
    spill::SpillArena arena = stash_arena(o, stash_settings(true, 0, depth));
    auto stash = spill::make_arena_stash(arena);
    std::uint64_t most = 0;
    auto layer = [&](const torch::Tensor& t) {
      if (torch::GradMode::is_enabled()) {  // the recomputation, in backward
        most = std::max(most, stash->stats().device_bytes_held);
      }
      return t * 2;
    };
    torch::Tensor x = torch::randn({1024}).requires_grad_(true);
    torch::Tensor y = x;
    for (int i = 0; i < 8; ++i) y = spill::checkpoint(*stash, layer, y);
    REQUIRE(eventually([&] { return stash->stats().device_bytes_held == 0; }));
    y.sum().backward();
    CHECK(most <= (depth + 1) * 4096);
    CHECK(torch::allclose(x.grad(), torch::full({1024}, 256.0f)));
  }
}

TEST_CASE("device path: an input changed in place during its copy or write is refused") {
  ScratchDir dir;
  for (bool emulated : {true, false}) {
    for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
      SUBCASE(subcase_name(emulated ? "accelerator input" : "CPU input", io).c_str()) {
        std::optional<Emulation> emulation;
        if (emulated) emulation.emplace(100000, 50000);  // a 50-100 ms copy
        HookScope slow(slow_writes(200));
        spill::SpillArena arena = stash_arena(
            engine_options(dir.path(), io, spill::IoBackend::thread_pool), stash_settings(true, 0));
        auto stash = spill::make_arena_stash(arena);
        torch::Tensor x = torch::randn({4096});
        auto stored = stash->store(x);
        x.add_(1);  // the copy or the write is still in flight
        CHECK_THROWS_WITH_AS(stored->restore(), doctest::Contains("modified by an inplace"),
                             spill::CheckpointError);
        CHECK(arena.stats().integrity_failures == 0);  // never blamed on the disk
      }
    }
  }
}

// Note [A small write is made at once] (src/core/arena/arena_core.cc): an asynchronous stash's
// small CPU input is written in store() and let go there, with nothing left for the progress
// thread; a large one is still queued and finished there.
TEST_CASE("CPU path: a small input is spilled within store()") {
  ScratchDir dir;
  for (spill::IoBackend backend : {spill::IoBackend::thread_pool, spill::IoBackend::automatic}) {
    SUBCASE(subcase_name(spill::IoMode::buffered, backend).c_str()) {
      auto o = engine_options(dir.path(), spill::IoMode::buffered, backend);
      spill::SpillArena arena = stash_arena(o, stash_settings(true, 0));
      auto stash = spill::make_arena_stash(arena);
      torch::Tensor small = torch::randn({1024});  // 4 KiB
      const torch::Tensor expected = small.clone();
      auto stored = stash->store(small);
      CHECK(stash->stats().inputs_spilled == 1);  // at once: no wait for the progress thread
      CHECK(stash->stats().host_bytes_in_flight == 0);
      CHECK(small.storage().use_count() == 1);  // the stash holds no reference any more
      CHECK(torch::equal(stored->restore(), expected));
    }
  }
}

// StashInput::layer_input: an offload policy's operation output or offload()'s saved tensor
// goes through the same chain as layer inputs, and is counted apart from them.
namespace {
void check_counted_apart(bool device) {
  ScratchDir dir;
  std::optional<Emulation> emulation;  // the device path on the CPU's stand-in copies
  if (device) emulation.emplace(0);
  auto o = engine_options(dir.path(), spill::IoMode::buffered, spill::IoBackend::thread_pool);
  spill::SpillArena arena = stash_arena(o, stash_settings(false, 0));
  auto chain = spill::detail::make_chain(arena, spill::stash_options(arena));
  std::vector<spill::detail::EntryPtr> entries;
  for (const bool layer_input : {true, false, false}) {
    spill::detail::StashInput in;
    in.bytes = spill::detail::Buffer::host(16384, 64);
    in.layer_input = layer_input;
    in.accelerator = device;
    if (device) in.engine = spill::detail::engine_for_inputs();
    entries.push_back(std::make_shared<spill::detail::Entry>(std::move(in), chain->counters()));
    chain->stored(entries.back());
  }
  const spill::StashStats s = chain->stats();
  CHECK(s.inputs_stored == 1);
  CHECK(s.inputs_spilled == 1);
  CHECK(s.saved_tensors_stored == 2);
  CHECK(s.saved_tensors_spilled == 2);
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) chain->restore(*it);
  CHECK(chain->stats().restores == 3);
}
}  // namespace

TEST_CASE("CPU and device paths: a tensor that is no layer input is counted apart") {
  SUBCASE("CPU path") { check_counted_apart(false); }
  SUBCASE("device path") { check_counted_apart(true); }
}

TEST_CASE("CPU path: an input above 512 KiB is still written in flight") {
  ScratchDir dir;
  // Every pwrite above 512 KiB (the pool's workers make the queued pieces) takes 300 ms.
  spill_test::FaultScope slow(
      [](spill::testing::FaultSite site, std::uint64_t bytes, std::uint64_t) {
        if (spill_test::is_write(site) && bytes > (512u << 10)) {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
        }
        return static_cast<std::int64_t>(bytes);
      });
  auto o = engine_options(dir.path(), spill::IoMode::buffered, spill::IoBackend::thread_pool);
  spill::SpillArena arena = stash_arena(o, stash_settings(true, 0));
  auto stash = spill::make_arena_stash(arena);
  torch::Tensor large = torch::randn({256 * 1024 + 1});  // 1 MiB + 4 bytes
  auto queued = stash->store(large);                     // returns while the pwrite sleeps
  CHECK(stash->stats().inputs_spilled == 0);
  CHECK(stash->stats().host_bytes_in_flight == large.nbytes());
  CHECK(eventually([&] { return stash->stats().inputs_spilled == 1; }));
  CHECK(torch::equal(queued->restore(), large));
}

TEST_CASE("CPU path: inputs held for writes in flight stay within the budget, dropped at once") {
  ScratchDir dir;
  HookScope slow(slow_writes(30));
  auto o = engine_options(dir.path(), spill::IoMode::buffered, spill::IoBackend::thread_pool);
  o.host_pool_bytes = 2 * 16384;
  spill::SpillArena arena = stash_arena(o, stash_settings(true, 0));
  auto stash = spill::make_arena_stash(arena);
  std::vector<std::unique_ptr<spill::StashedTensor>> stored;
  for (int i = 0; i < 8; ++i) stored.push_back(stash->store(torch::randn({4096})));  // 16 KiB
  const spill::StashStats s = stash->stats();
  CHECK(s.peak_host_bytes_in_flight <= 2 * 16384);
  CHECK(s.pool_waits > 0);
  // Dropped when each write completed, with no further store() or restore().
  CHECK(eventually([&] { return stash->stats().host_bytes_in_flight == 0; }));
  CHECK(stash->stats().inputs_spilled == 8);
}

TEST_CASE("host pool: budgets out of range are typed errors naming the value") {
  ScratchDir dir;
  auto o = engine_options(dir.path(), spill::IoMode::buffered, spill::IoBackend::thread_pool);
  o.host_pool_bytes = 0;
  CHECK_THROWS_WITH_AS(spill::SpillArena{o}, doctest::Contains("host_pool_bytes = 0"),
                       spill::InvalidArgumentError);
  o.host_pool_bytes = 100;
  CHECK_THROWS_WITH_AS(spill::SpillArena{o}, doctest::Contains("below one page"),
                       spill::InvalidArgumentError);
  o.host_pool_bytes = 1ull << 50;
  CHECK_THROWS_WITH_AS(spill::SpillArena{o}, doctest::Contains("may still use"),
                       spill::InsufficientSpaceError);
  CHECK(spill_test::list_dir(dir.path()).empty());
}

TEST_CASE("host pool: a budget above RLIMIT_MEMLOCK is refused where the pool is made") {
  ScratchDir dir;
  struct rlimit saved{};
  REQUIRE(getrlimit(RLIMIT_MEMLOCK, &saved) == 0);
  struct rlimit lowered = saved;
  lowered.rlim_cur = 1 << 20;
  REQUIRE(setrlimit(RLIMIT_MEMLOCK, &lowered) == 0);
  Emulation emulation(0);
  auto o = engine_options(dir.path(), spill::IoMode::buffered, spill::IoBackend::thread_pool);
  o.host_pool_bytes = 8 << 20;
  spill::SpillArena arena = stash_arena(o, stash_settings(true, 0));
  auto stash = spill::make_arena_stash(arena);
  CHECK_THROWS_WITH_AS(stash->store(torch::randn({1024})), doctest::Contains("RLIMIT_MEMLOCK"),
                       spill::InvalidArgumentError);
  o.host_pool_bytes = spill::kAutomaticHostPool;  // automatic: capped at the limit instead
  spill::SpillArena capped = stash_arena(o, stash_settings(true, 0));
  auto capped_stash = spill::make_arena_stash(capped);
  auto stored = capped_stash->store(torch::randn({1024}));
  CHECK(capped_stash->stats().host_pool_bytes == 1 << 20);
  stored.reset();
  REQUIRE(setrlimit(RLIMIT_MEMLOCK, &saved) == 0);
}

// ---------------------------------------------------------------------------------------------
// Faults on the accelerator path: each a typed error, the arena left consistent, the next step
// bit-identical.
// ---------------------------------------------------------------------------------------------

namespace {

spill::testing::AcceleratorEmulation with_faults(std::uint32_t device_allocations_to_fail,
                                                 bool host_pool_refused) {
  spill::testing::AcceleratorEmulation e;
  e.enabled = true;
  e.max_delay_us = 50;
  e.seed = 7;
  e.device_allocations_to_fail = device_allocations_to_fail;
  e.host_pool_refused = host_pool_refused;
  return e;
}

void check_drained(const spill::SpillArena& arena) {
  CHECK(arena.stats().bytes_in_use == 0);
  CHECK(arena.stats().live_regions == 0);
  CHECK(spill::stash_stats(arena).device_bytes_held == 0);
}

}  // namespace

TEST_CASE("device path: out of device memory while restoring is LibTorch's OOM error, then exact") {
  ScratchDir dir;
  GptReference g(3, 31, {2, 16, 64});
  for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
    SUBCASE(subcase_name(io).c_str()) {
      // prefetch_depth 0: only restore() allocates on the device, so the fault hits it.
      spill::SpillArena arena =
          stash_arena(engine_options(dir.path(), io, spill::IoBackend::thread_pool),
                      stash_settings(true, 0, 0));
      {
        Emulation faults(with_faults(1, false));
        // Backward waits until every input was written: one still in its copy when backward
        // reaches it is given back as it is, with no device allocation to fail (a loaded CI
        // machine did that).
        torch::manual_seed(1234);
        torch::Tensor x = g.x0.clone().requires_grad_(true);
        torch::Tensor y = spill::models::run_blocks(g.blocks, spill::make_arena_stash(arena), x);
        REQUIRE(eventually([&] { return spill::stash_stats(arena).inputs_spilled >= 3; }, 5000));
        try {
          y.square().mean().backward();
          FAIL("the emulated device allocation failure was lost");
        } catch (const c10::OutOfMemoryError& e) {
          const std::string message = e.what_without_backtrace();
          CAPTURE(message);
          CHECK(message.find("no device memory to restore the stashed") != std::string::npos);
          CHECK(message.find("with prefetch_depth 0") != std::string::npos);
          CHECK(message.find("lower StashOptions::prefetch_depth") != std::string::npos);
        }
      }
      check_drained(arena);
      Emulation emulation(50);
      g.check(gpt_step(g.blocks, spill::make_arena_stash(arena), g.x0));
      check_drained(arena);
    }
  }
}

// keep_last 2: the pool is made mid-forward, at the third input, with two inputs held.
TEST_CASE("host pool: memory refused when the pool is made is a typed error, then exact") {
  // store() waits on the pool: a hang fails by name, not by ctest's timeout.
  spill_test::Deadline deadline("the steps after the pool was refused memory", 240);
  ScratchDir dir;
  GptReference g(4, 32, {2, 16, 64});
  for (std::uint32_t keep_last : {0u, 2u}) {
    SUBCASE(subcase_name("keep_last " + std::to_string(keep_last)).c_str()) {
      auto o = engine_options(dir.path(), spill::IoMode::direct, spill::IoBackend::thread_pool);
      o.host_pool_bytes = spill::MiB;
      spill::SpillArena arena = stash_arena(o, stash_settings(true, keep_last));
      {
        Emulation faults(with_faults(0, true));
        const std::string named = "the host pool of " + spill::bytes_with_units(spill::MiB) +
                                  " could not be allocated; lower ArenaOptions::host_pool_bytes";
        CHECK_THROWS_WITH_AS(gpt_step(g.blocks, spill::make_arena_stash(arena), g.x0),
                             doctest::Contains(named.c_str()), spill::InsufficientSpaceError);
      }
      check_drained(arena);
      CHECK(spill::stash_stats(arena).host_pool_bytes == 0);  // not made: tried again next time
      CHECK(spill_test::list_dir(dir.path()).empty());
      Emulation emulation(50);
      g.check(gpt_step(g.blocks, spill::make_arena_stash(arena), g.x0));
      CHECK(spill::stash_stats(arena).host_pool_bytes == spill::MiB);
      check_drained(arena);
    }
  }
}

// A container's or WSL's memlock cap refuses pinned memory while pageable memory is still had.
TEST_CASE("host pool: pinning refused makes the same pool pageable, with one warning") {
  // store() waits on the pool: a hang fails by name, not by ctest's timeout.
  spill_test::Deadline deadline("the pageable pool after pinning was refused", 240);
  ScratchDir dir;
  GptReference g(8, 41, {2, 32, 64});
  // The first write of each step is held until a store() of that step waits on the full pool
  // (at most 10 s); the progress thread finishes writes in order, so the pool fills behind it
  // (its budget is held, not only sized) however the machine's load times the step. A fixed
  // 150 ms hold saw no wait once, with every core busy.
  struct Gate {
    std::atomic<bool> hold_first{true};
    std::atomic<spill::TensorStash*> stash{nullptr};
    std::atomic<std::uint64_t> waits_before{0};
  };
  auto gate = std::make_shared<Gate>();
  HookScope slow([gate](spill::IoOp op) {
    if (op == spill::IoOp::write && gate->hold_first.exchange(false)) {
      eventually(
          [&] {
            spill::TensorStash* stash = gate->stash.load();
            return stash != nullptr && stash->stats().pool_waits > gate->waits_before.load();
          },
          10000);
    }
    return 0;
  });
  auto o = engine_options(dir.path(), spill::IoMode::direct, spill::IoBackend::thread_pool);
  o.host_pool_bytes = 3 * kInputBytes;  // pinned: 2 inputs (a power of two); pageable: all 3
  for (bool refused : {false, true}) {
    SUBCASE(refused ? "pinning refused" : "pinned") {
      spill_test::SpillarenaWarnings warnings;
      spill::testing::AcceleratorEmulation e = with_faults(0, false);
      e.pinning_refused = refused;
      Emulation emulation(e);
      for (int steps : {2, 1}) {  // two arenas, two pools, one warning
        spill::SpillArena arena = stash_arena(o, stash_settings(true, 0));
        auto stash = spill::make_arena_stash(arena);
        gate->stash.store(stash.get());
        for (int step = 0; step < steps; ++step) {
          gate->waits_before.store(stash->stats().pool_waits);
          gate->hold_first.store(true);
          g.check(gpt_step(g.blocks, stash, g.x0));
        }
        gate->stash.store(nullptr);
        const spill::StashStats s = stash->stats();
        CHECK(s.host_pool_pinned == !refused);
        CHECK(s.host_pool_bytes == (refused ? 3 : 2) * kInputBytes);
        CHECK(s.peak_host_pool_bytes_in_use <= s.host_pool_bytes);
        CHECK(s.pool_waits > 0);
        check_drained(arena);
        CHECK(spill_test::list_dir(dir.path()).empty());
      }
      REQUIRE(warnings.messages.size() == (refused ? 1u : 0u));
      if (refused) {
        CHECK(warnings.messages[0].find("the host pool is pageable") != std::string::npos);
      }
    }
  }
}

TEST_CASE("device path: a write that fails in flight is spill::IoError, then exact") {
  ScratchDir dir;
  GptReference g(3, 33, {2, 16, 64});
  for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
    SUBCASE(subcase_name(io).c_str()) {
      auto failures = std::make_shared<std::atomic<int>>(1);  // the first write fails, then none
      // Installed before the arena: its queue takes the hook when it is made.
      HookScope fail([failures](spill::IoOp op) {
        return op == spill::IoOp::write && failures->fetch_sub(1) > 0 ? EIO : 0;
      });
      spill::SpillArena arena = stash_arena(
          engine_options(dir.path(), io, spill::IoBackend::thread_pool), stash_settings(true, 0));
      Emulation emulation(50);
      try {
        // The failure surfaces at a later store (forward) or at the restore (backward). Backward
        // first waits for the writes: an input still being copied when backward reaches it is
        // given back as it is and never written (a loaded machine does that).
        torch::manual_seed(1234);
        torch::Tensor x = g.x0.clone().requires_grad_(true);
        torch::Tensor y = spill::models::run_blocks(g.blocks, spill::make_arena_stash(arena), x);
        (void)eventually([&] { return spill::stash_stats(arena).inputs_spilled >= 3; }, 5000);
        y.square().mean().backward();
        FAIL("the injected EIO was lost");
      } catch (const spill::IoError& e) {
        CHECK(e.error_number() == EIO);
        CHECK(e.op() == spill::IoOp::write);
      }
      check_drained(arena);
      g.check(gpt_step(g.blocks, spill::make_arena_stash(arena), g.x0));
      check_drained(arena);
    }
  }
}

// Note [Lifecycle of a stashed tensor], arrow by arrow: each move its table allows is
// taken, every other move is refused naming both states, and the entry stays where it was.
TEST_CASE("device path: an entry moves only along the lifecycle's arrows") {
  using spill::detail::State;
  const State all[] = {State::held,    State::kept,      State::copying,
                       State::writing, State::failed,    State::spilled,
                       State::reading, State::uploading, State::restored};
  const std::set<std::pair<State, State>> arrows = {
      {State::held, State::copying},      {State::held, State::writing},
      {State::held, State::spilled},      {State::held, State::kept},
      {State::held, State::restored},     {State::kept, State::restored},
      {State::copying, State::writing},   {State::copying, State::restored},
      {State::writing, State::spilled},   {State::writing, State::kept},
      {State::writing, State::failed},    {State::writing, State::restored},
      {State::spilled, State::reading},   {State::spilled, State::restored},
      {State::reading, State::uploading}, {State::reading, State::restored},
      {State::uploading, State::restored}};
  auto counters = std::make_shared<spill::detail::StashCounters>();
  spill::detail::StashInput input;
  input.bytes = spill::detail::Buffer::host(16, 64);
  spill::detail::Entry e(std::move(input), counters);
  for (const State from : all) {
    for (const State to : all) {
      CAPTURE(spill::detail::to_string(from));
      CAPTURE(spill::detail::to_string(to));
      spill::detail::MutexLock lock(e.mutex);
      e.state = from;
      if (arrows.count({from, to})) {
        spill::detail::advance(e, to);
        CHECK(e.state == to);
      } else {
        const std::string expected = std::string("from ") + spill::detail::to_string(from) +
                                     " to " + spill::detail::to_string(to);
        CHECK_THROWS_WITH_AS(spill::detail::advance(e, to), doctest::Contains(expected.c_str()),
                             std::logic_error);
        CHECK(e.state == from);
      }
    }
  }
  spill::detail::MutexLock lock(e.mutex);
  e.state = State::restored;  // as it would be when freed
}

// O_DIRECT writes a pool block from where it is only when the block is page-aligned (Note
// [Writing from an aligned source] in src/core/io/io_engine.cc); pageable pools are made so too.
TEST_CASE("device path: every block of a pageable host pool is page-aligned") {
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  auto pool = spill::detail::HostPool::make(4 * spill::MiB + 1, nullptr);
  CHECK_FALSE(pool->pinned());
  CHECK(pool->bytes() == 4 * spill::MiB);  // whole pages of the budget
  std::vector<spill::detail::HostPool::Lease> leases;
  for (const std::uint64_t bytes :
       {std::uint64_t{1}, std::uint64_t{5000}, spill::MiB, spill::MiB + 3}) {
    auto lease = pool->try_take(bytes);
    REQUIRE(lease);
    CHECK(reinterpret_cast<std::uintptr_t>(lease->host().data()) % page == 0);
    CHECK(lease->bytes() == bytes);
    leases.push_back(std::move(*lease));
  }
}

// A block given back after a waiter's failed try but before it waits (here: from its own give_up
// callback, exactly that window) must wake it at once, not at the next poll: the waiter reads the
// pool's count of blocks given back before each try and waits for it to change.
TEST_CASE("device path: a block given back between a failed try and the wait wakes the waiter") {
  auto pool = spill::detail::HostPool::make(spill::MiB, nullptr);
  std::optional<spill::detail::HostPool::Lease> held = pool->try_take(spill::MiB);
  REQUIRE(held);
  const auto start = std::chrono::steady_clock::now();
  spill::detail::HostPool::Lease lease = pool->take(
      spill::MiB,
      [&] {
        held.reset();  // gives the block back inside the window
        return false;
      },
      std::chrono::milliseconds(20000));
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(lease);
  CHECK(waited < std::chrono::seconds(5));  // the poll would have taken 20 s
  CHECK(pool->waits() == 1);
}

// A lease is a slice of the pool's one allocation, never memory of its own: a buffer per lease
// would come from LibTorch's caching host allocator on a GPU, which keeps what it pinned, and
// host memory would grow with the inputs spilled instead of staying at the pool.
TEST_CASE("device path: the host pool's leases are disjoint slices of its one allocation") {
  auto pool = spill::detail::HostPool::make(4 * spill::MiB, nullptr);
  std::vector<spill::detail::HostPool::Lease> leases;
  for (const std::uint64_t bytes :
       {std::uint64_t{1}, std::uint64_t{5000}, spill::MiB, spill::MiB + 3}) {
    auto lease = pool->try_take(bytes);
    REQUIRE(lease);
    leases.push_back(std::move(*lease));
  }
  std::vector<std::pair<const char*, const char*>> taken;
  for (const auto& lease : leases) {
    CHECK(lease.host().owner() == leases.front().host().owner());  // one allocation
    const auto* at = static_cast<const char*>(lease.host().data());
    taken.emplace_back(at, at + lease.bytes());
  }
  std::sort(taken.begin(), taken.end());
  for (std::size_t i = 1; i < taken.size(); ++i) CHECK(taken[i - 1].second <= taken[i].first);
  CHECK(static_cast<std::uint64_t>(taken.back().second - taken.front().first) <= pool->bytes());
  leases.pop_back();  // a block given back is handed out again, from the same allocation
  auto again = pool->try_take(spill::MiB);
  REQUIRE(again);
  CHECK(again->host().owner() == leases.front().host().owner());
}

// ---------------------------------------------------------------------------------------------
// Host memory of spilling at two depths: the pool and the staging pool, nothing per layer.
// ---------------------------------------------------------------------------------------------

namespace {

// False under a sanitizer: its allocator keeps freed memory (a quarantine), so resident memory
// says nothing about what is live.
constexpr bool resident_memory_follows_live_memory() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  return false;
#else
  return true;
#endif
#else
  return true;
#endif
}

constexpr std::uint64_t kWideInputBytes = 128 * 32 * 64 * sizeof(float);  // 1 MiB

struct DepthRun {
  spill::StashStats stash;
  std::uint64_t staging_bytes = 0;
  std::uint64_t spilled_bytes = 0;
  std::uint64_t held_bytes = 0;  // RssAnon after forward (every write done) less before the arena
};

// One checkpointed step of `layers` blocks on 1 MiB inputs through a pool of one input (all of
// it touched by the first copy, whatever the timing); gradients bit-identical to the step
// without checkpointing.
DepthRun step_at_depth(int layers, const std::string& dir) {
  GptReference g(layers, 51, {128, 32, 64});  // the reference step warms LibTorch up
  for (auto& p : g.blocks->parameters()) p.mutable_grad() = torch::Tensor();
  auto o = engine_options(dir, spill::IoMode::direct, spill::IoBackend::thread_pool);
  o.capacity_bytes = static_cast<std::uint64_t>(layers + 2) * kWideInputBytes;
  o.host_pool_bytes = kWideInputBytes;
  DepthRun run;
  const std::uint64_t before = spill::resident_anonymous_bytes();
  spill::SpillArena arena = stash_arena(o, stash_settings(true, 0));
  auto stash = spill::make_arena_stash(arena);
  torch::manual_seed(1234);  // as gpt_step
  torch::Tensor x = g.x0.detach().clone().requires_grad_(true);
  torch::Tensor y = spill::models::run_blocks(g.blocks, stash, x);
  REQUIRE(eventually([&] {
    const spill::StashStats s = stash->stats();
    return s.inputs_spilled == static_cast<std::uint64_t>(layers) && s.device_bytes_held == 0;
  }));
  const std::uint64_t after_forward = spill::resident_anonymous_bytes();
  run.held_bytes = after_forward > before ? after_forward - before : 0;
  torch::Tensor loss = (y * y).mean() + torch::dropout(y, 0.2, true).sum() * 1e-3;
  loss.backward();
  Grads grads{x.grad().clone(), {}, loss.detach()};
  for (auto& p : g.blocks->parameters()) grads.params.push_back(p.grad().clone());
  g.check(grads);
  run.stash = stash->stats();
  run.staging_bytes = arena.stats().staging_bytes;
  run.spilled_bytes = arena.stats().bytes_written;
  return run;
}

}  // namespace

TEST_CASE("device path: host memory of spilling is the pool and staging, whatever the depth") {
  spill::return_freed_memory_promptly();  // RssAnon follows live memory
  ScratchDir dir;
  Emulation emulation(0);
  const DepthRun shallow = step_at_depth(4, dir.path());
  const DepthRun deep = step_at_depth(12, dir.path());
  for (const DepthRun* run : {&shallow, &deep}) {
    const spill::StashStats& s = run->stash;
    CAPTURE(s.host_pool_bytes);
    CAPTURE(run->held_bytes);
    CHECK(s.host_pool_bytes == kWideInputBytes);
    // The pool's peak and the CPU path's bytes in flight (none here) within the pool; the
    // staging pool is the engine's fixed size, reported as made.
    CHECK(s.peak_host_pool_bytes_in_use + s.peak_host_bytes_in_flight <= s.host_pool_bytes);
    CHECK(run->spilled_bytes > s.host_pool_bytes + run->staging_bytes);  // the bound binds
    if (resident_memory_follows_live_memory()) {
      // The pool, the staging pool, x and y (the step's input and output), and 1 MiB for the
      // threads and the arena's, the stash's and autograd's bookkeeping (0.3 MiB at most when
      // measured): 4 and 12 MiB more had the inputs stayed in memory.
      CHECK(run->held_bytes <=
            s.host_pool_bytes + run->staging_bytes + 2 * kWideInputBytes + spill::MiB);
    }
  }
  CHECK(deep.spilled_bytes == 3 * shallow.spilled_bytes);
  CHECK(deep.stash.peak_host_pool_bytes_in_use <= shallow.stash.host_pool_bytes);
  if (resident_memory_follows_live_memory()) {
    MESSAGE("held after forward: 4 layers " << spill::human_bytes(shallow.held_bytes)
                                            << ", 12 layers "
                                            << spill::human_bytes(deep.held_bytes));
    // Eight more inputs spilled (8 MiB); held memory grew by less than two of them (RssAnon
    // moves by up to a MiB between runs: glibc trims its heaps when it will).
    CHECK(deep.held_bytes <= shallow.held_bytes + 2 * kWideInputBytes);
  }
}
