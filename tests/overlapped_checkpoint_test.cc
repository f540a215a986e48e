// spill::checkpoint over the asynchronous engine: every I/O mode and backend, keep_last,
// prefetching, autocast replay, in-place changes, injected failures and random delays.
#include <ATen/autocast_mode.h>
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "core/stash/restore_pool.h"
#include "core/stash/stash_path.h"
#include "gpt_test_support.h"
#include "io_test_support.h"
#include "restore_order_check.h"
#include "stash_test_support.h"
#include "test_support.h"

using spill_test::engine_options;
using spill_test::HookScope;
using spill_test::recompute_checkpoint;
using spill_test::ScratchDir;
using spill_test::stash_arena;
using spill_test::stash_settings;
using spill_test::subcase_name;
using namespace spill_test::gpt;

namespace {}  // namespace

TEST_CASE("overlap: gradients are bit-identical in every I/O mode, backend and keep_last") {
  ScratchDir dir;
  GptReference g(4, 99, {2, 32, 64});
  for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
    for (bool asynchronous : {false, true}) {
      for (auto backend : {spill::IoBackend::thread_pool, spill::IoBackend::automatic}) {
        for (std::uint32_t keep_last : {0u, 1u, 2u}) {
          const char* overlap = asynchronous ? "asynchronous" : "synchronous";
          const std::string keep = "keep_last " + std::to_string(keep_last);
          SUBCASE(subcase_name(io, overlap, backend, keep).c_str()) {
            spill::SpillArena arena = stash_arena(engine_options(dir.path(), io, backend),
                                                  stash_settings(asynchronous, keep_last));
            g.check(gpt_step(g.blocks, spill::make_arena_stash(arena), g.x0));
            CHECK(arena.stats().bytes_in_use == 0);
            CHECK(arena.stats().allocations == 4 - keep_last);
            CHECK(spill::stash_stats(arena).restores == 4);
          }
        }
      }
    }
  }
}

TEST_CASE("overlap: backward queues the reads of the stash's own predecessors") {
  ScratchDir dir;
  auto blocks = gpt_blocks(6);
  const torch::Tensor x0 = torch::randn({1, 16, 64});
  for (std::uint32_t depth : {0u, 1u, 2u}) {
    auto o = engine_options(dir.path(), spill::IoMode::direct, spill::IoBackend::automatic);
    spill::SpillArena arena = stash_arena(o, stash_settings(true, 0, depth));
    auto stash = spill::make_arena_stash(arena);
    spill::SpillArena other(o);  // a second chain in between must not confuse the first
    auto other_stash = spill::make_arena_stash(other);
    torch::Tensor noise = torch::randn({8, 8}, torch::TensorOptions().requires_grad(true));
    torch::Tensor side =
        spill::checkpoint(*other_stash, [](const torch::Tensor& t) { return t * 2; }, noise);
    gpt_step(blocks, stash, x0);
    const spill::StashStats s = spill::stash_stats(arena);
    CAPTURE(depth);
    CHECK(s.restores == 6);
    CHECK(s.prefetches == (depth == 0 ? 0u : 5u));  // every layer but the first has a successor
    CHECK(s.prefetch_hits <= s.prefetches);
    CHECK(spill::stash_stats(other).prefetches == 0);
    side.sum().backward();
  }
}

// Note [Overlapped spilling], on the CPU path (tests/restore_order_check.h says how).
TEST_CASE("overlap: a restore queues its predecessors' reads before it waits for its own") {
  spill_test::check_restore_queues_predecessors_first();
}

TEST_CASE("overlap: keep_last keeps the last inputs where they are and spills the rest") {
  ScratchDir dir;
  auto blocks = gpt_blocks(5);
  const torch::Tensor x0 = torch::randn({1, 16, 64});
  auto o = engine_options(dir.path(), spill::IoMode::buffered, spill::IoBackend::automatic);
  spill::SpillArena arena = stash_arena(o, stash_settings(true, 2));
  gpt_step(blocks, spill::make_arena_stash(arena), x0);
  CHECK(arena.stats().allocations == 3);
  CHECK(arena.stats().bytes_written == 3 * 16 * 64 * 4);
}

TEST_CASE("overlap: spill::checkpoint(arena, ...) chains consecutive layers in one stash") {
  ScratchDir dir;
  auto o = engine_options(dir.path(), spill::IoMode::direct, spill::IoBackend::automatic);
  spill::SpillArena arena = stash_arena(o, stash_settings(true, 1));
  torch::Tensor x = torch::randn({64, 64}, torch::TensorOptions().requires_grad(true));
  torch::Tensor h = x;
  for (int i = 0; i < 5; ++i) {
    h = spill::checkpoint(arena, [](const torch::Tensor& t) { return torch::tanh(t) * 1.5; }, h);
  }
  h.sum().backward();
  const spill::ArenaStats s = arena.stats();
  CHECK(s.allocations == 4);  // keep_last = 1 holds the last input
  CHECK(s.bytes_in_use == 0);
  CHECK(spill::stash_stats(arena).prefetches == 4);  // each spilled input, queued by a successor
}

TEST_CASE("overlap: stash options are the stash's, set per stash or kept with the arena") {
  ScratchDir dir;
  spill::SpillArena arena(
      engine_options(dir.path(), spill::IoMode::buffered, spill::IoBackend::automatic));
  const spill::StashOptions defaults;
  CHECK(spill::stash_options(arena).keep_last == defaults.keep_last);
  const auto run = [&](auto&& checkpoint_layer) {
    const spill::ArenaStats before = arena.stats();
    torch::Tensor h = torch::randn({32, 32}, torch::TensorOptions().requires_grad(true));
    for (int i = 0; i < 4; ++i) h = checkpoint_layer(h);
    h.sum().backward();
    return arena.stats().allocations - before.allocations;
  };
  const auto tanh = [](const torch::Tensor& t) { return torch::tanh(t); };
  // The arena's options (defaults: keep_last 1) for spill::checkpoint(arena, ...).
  CHECK(run([&](const torch::Tensor& t) { return spill::checkpoint(arena, tanh, t); }) == 3);
  // A stash of its own with keep_last 3: one of four inputs spilled.
  auto own = spill::make_arena_stash(arena, stash_settings(true, 3));
  CHECK(run([&](const torch::Tensor& t) { return spill::checkpoint(*own, tanh, t); }) == 1);
  // set_stash_options: every handle to the arena sees them, the next shared stash uses them.
  spill::set_stash_options(arena.shared_handle(), stash_settings(false, 0));
  CHECK(spill::stash_options(arena).keep_last == 0);
  CHECK_FALSE(spill::stash_options(arena).asynchronous);
  CHECK(run([&](const torch::Tensor& t) { return spill::checkpoint(arena, tanh, t); }) == 4);
  CHECK(arena.stats().bytes_in_use == 0);
}

TEST_CASE("overlap: CPU autocast (bf16) is replayed in the recomputation") {
  ScratchDir dir;
  auto blocks = gpt_blocks(3);
  const torch::Tensor x0 = seeded_input(11, {2, 16, 64});
  const Grads full_precision = gpt_step(blocks, nullptr, x0);
  StepReferences reference;
  {
    Autocast autocast(torch::kCPU);
    reference = gpt_references(blocks, x0);
  }
  // Autocast changes the numbers, so a recomputation in full precision would be caught. Not a
  // matter of rounding: autocast runs the blocks' matrix products in bf16 (8 bits of mantissa
  // against fp32's 24), which leaves no gradient of 2048 elements equal to its fp32 one.
  CHECK_FALSE(torch::equal(reference.recomputed.input, full_precision.input));
  for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
    SUBCASE(subcase_name(io).c_str()) {
      spill::SpillArena arena = stash_arena(
          engine_options(dir.path(), io, spill::IoBackend::automatic), stash_settings(true, 0));
      Grads spilled;
      {
        // Forward under autocast; backward runs inside too, as users do.
        Autocast autocast(torch::kCPU);
        spilled = gpt_step(blocks, spill::make_arena_stash(arena), x0);
      }
      reference.check(spilled);
    }
  }
  // Backward outside the autocast region (the common pattern): the replay restores it.
  spill::SpillArena arena =
      stash_arena(engine_options(dir.path(), spill::IoMode::buffered, spill::IoBackend::automatic),
                  stash_settings(true, 0));
  // `run_blocks(x)`: the blocks' output, checkpointed or not.
  auto run = [&](auto run_blocks) {
    for (auto& p : blocks->parameters()) p.mutable_grad() = torch::Tensor();
    torch::manual_seed(1234);
    torch::Tensor x = x0.clone().requires_grad_(true);
    torch::Tensor loss;
    {
      Autocast autocast(torch::kCPU);
      loss = run_blocks(x).to(torch::kFloat).pow(2).mean();
    }
    loss.backward();
    Grads g{x.grad().clone(), {}, loss.detach()};
    for (auto& p : blocks->parameters()) g.params.push_back(p.grad().clone());
    return g;
  };
  auto through = [&](const std::shared_ptr<spill::TensorStash>& stash) {
    return [&blocks, stash](const torch::Tensor& x) {
      return spill::models::run_blocks(blocks, stash, x);
    };
  };
  const StepReferences outside{run(recomputed_blocks(blocks)), run(through(nullptr))};
  outside.check(run(through(spill::make_arena_stash(arena))));
}

// Refused in backward, as autograd refuses it; the forward's next store() goes on (it once
// raised there, for another tensor's change, and left the inputs after it unspilled).
TEST_CASE("overlap: an input changed in place before it was spilled is refused in backward") {
  ScratchDir dir;
  spill::SpillArena arena =
      stash_arena(engine_options(dir.path(), spill::IoMode::buffered, spill::IoBackend::automatic),
                  stash_settings(true, 1));
  auto stash = spill::make_arena_stash(arena);
  torch::Tensor x = torch::randn({16, 16}, torch::TensorOptions().requires_grad(true));
  torch::Tensor h = x * 1;
  torch::Tensor y = spill::checkpoint(*stash, [](const torch::Tensor& t) { return t * 2; }, h);
  {
    torch::NoGradGuard no_grad;
    h.add_(1);  // h is held (keep_last), not yet spilled
  }
  torch::Tensor z = spill::checkpoint(*stash, [](const torch::Tensor& t) { return t * 2; }, y);
  for (int i = 0; i < 3; ++i) {  // the forward goes on, and the inputs after it spill
    z = spill::checkpoint(*stash, [](const torch::Tensor& t) { return t * 2; }, z);
  }
  CHECK(stash->stats().inputs_spilled >= 2);
  CHECK_THROWS_WITH_AS(z.sum().backward(), doctest::Contains("modified by an inplace operation"),
                       spill::CheckpointError);
}

// Kernels choose their paths by strides: a transposed input restored contiguous made the
// recomputation's matmul differ from the forward's in the last bits (the red-team pass).
TEST_CASE("overlap: a transposed input comes back in its own layout, gradients bit-identical") {
  ScratchDir dir;
  for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
    SUBCASE(subcase_name(io).c_str()) {
      spill::SpillArena arena = stash_arena(
          engine_options(dir.path(), io, spill::IoBackend::thread_pool), stash_settings(true, 0));
      torch::manual_seed(3);
      const torch::Tensor w = torch::randn({48, 48}, torch::kFloat64);
      const torch::Tensor base = torch::randn({48, 96}, torch::kFloat64);
      enum class Run { plain, recomputed, spilled };
      auto run = [&](Run how) {
        torch::Tensor wl = w.clone().requires_grad_(true);
        torch::Tensor b = base.clone().requires_grad_(true);
        torch::Tensor xt = b.t();  // non-contiguous, non-overlapping and dense
        auto layer = [&](const torch::Tensor& t) { return torch::matmul(t, wl).tanh(); };
        torch::Tensor y = how == Run::spilled      ? spill::checkpoint(arena, layer, xt)
                          : how == Run::recomputed ? recompute_checkpoint(layer, xt)
                                                   : layer(xt);
        auto stored_strides = xt.strides().vec();
        if (how == Run::spilled) {
          auto stash = spill::make_arena_stash(arena, stash_settings(false, 0));
          torch::Tensor back = stash->store(xt)->restore();
          CHECK(back.strides().vec() == stored_strides);
          CHECK(torch::equal(back, xt));
        }
        y.square().sum().backward();
        return spill_test::RunResults{{"weight grad", wl.grad()}, {"input grad", b.grad()}};
      };
      // The recompute reference keeps the input's strides, as torch's checkpoint does.
      const auto plain = run(Run::plain);
      const auto recomputed = run(Run::recomputed);
      spill_test::check_with_references(run(Run::spilled), recomputed, plain);
      CHECK(arena.stats().bytes_in_use == 0);
    }
  }
}

TEST_CASE("overlap: a non-contiguous input changed in place after store is refused") {
  ScratchDir dir;
  spill::SpillArena arena = stash_arena(
      engine_options(dir.path(), spill::IoMode::buffered, spill::IoBackend::thread_pool),
      stash_settings(true, 0));
  torch::Tensor b = torch::randn({32, 64}, torch::TensorOptions().requires_grad(true));
  torch::Tensor h = b * 1;
  torch::Tensor xt = h.t();  // the stash stores a contiguous copy of it
  torch::Tensor y = spill::checkpoint(arena, [](const torch::Tensor& t) { return t * 2; }, xt);
  {
    torch::NoGradGuard no_grad;
    xt.add_(1);  // changes h too; the stashed copy does not see it, the version counter does
  }
  CHECK_THROWS_WITH_AS(y.sum().backward(), doctest::Contains("modified by an inplace operation"),
                       spill::CheckpointError);
}

TEST_CASE("overlap: a failed asynchronous write surfaces as spill::IoError, never a hang") {
  ScratchDir dir;
  for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
    for (auto backend : {spill::IoBackend::thread_pool, spill::IoBackend::automatic}) {
      SUBCASE(subcase_name(io, backend).c_str()) {
        HookScope fail([](spill::IoOp op) { return op == spill::IoOp::write ? EIO : 0; });
        spill::SpillArena arena =
            stash_arena(engine_options(dir.path(), io, backend), stash_settings(true, 0));
        auto blocks = gpt_blocks(3);
        const torch::Tensor x0 = torch::randn({1, 16, 64});
        try {
          gpt_step(blocks, spill::make_arena_stash(arena), x0);
          FAIL("the injected EIO was lost");
        } catch (const spill::IoError& e) {
          CHECK(e.error_number() == EIO);
          CHECK(e.op() == spill::IoOp::write);
          CHECK(e.bytes() > 0);
        }
      }
    }
  }
}

TEST_CASE("overlap: random delays in the queue over many steps keep gradients identical") {
  ScratchDir dir;
  GptReference g(4, 21, {2, 16, 64});
  steps_under_random_delays(dir.path(), [&](const std::shared_ptr<spill::TensorStash>& stash) {
    g.check(gpt_step(g.blocks, stash, g.x0));
  });
}

// Note [Restoring into reused memory] in src/core/stash/restore_pool.cc.
TEST_CASE("restore pool: a freed restore's block serves the next restore that fits") {
  auto pool = std::make_shared<spill::detail::RestorePool>();
  void* first = nullptr;
  {
    spill::detail::Buffer b = pool->take(1 << 20, 4096);
    first = b.data();
    CHECK(reinterpret_cast<std::uintptr_t>(first) % 4096 == 0);
    CHECK(b.bytes() == 1u << 20);
  }
  CHECK(pool->idle_bytes() >= 1u << 20);
  {
    spill::detail::Buffer again = pool->take((1 << 20) - 100, 64);  // fits: the same block
    CHECK(again.data() == first);
    CHECK(pool->reused() == 1);
  }
  spill::detail::Buffer small = pool->take(4096, 64);  // much smaller: not the 1 MiB block
  CHECK(small.data() != first);
  spill::detail::Buffer aligned = pool->take(1 << 20, 1 << 16);  // a stricter alignment: new
  CHECK(reinterpret_cast<std::uintptr_t>(aligned.data()) % (1 << 16) == 0);
  CHECK(pool->reused() == 1);
}

TEST_CASE("restore pool: idle blocks are bounded, released on demand, freed after the pool") {
  auto pool = std::make_shared<spill::detail::RestorePool>();
  std::vector<spill::detail::Buffer> held;
  for (int i = 0; i < 5; ++i) held.push_back(pool->take(64 << 10, 64));
  held.clear();  // five given back: only kMaxIdleBlocks stay
  CHECK(pool->idle_bytes() == spill::detail::RestorePool::kMaxIdleBlocks * (64u << 10));
  spill::detail::Buffer alive = pool->take(64 << 10, 64);
  pool->release_idle();
  CHECK(pool->idle_bytes() == 0);
  alive = {};  // given back after the release: freed, not kept for the next forward
  CHECK(pool->idle_bytes() == 0);
  spill::detail::Buffer tiny = pool->take(100, 64);  // below a page: not the pool's
  tiny = {};
  CHECK(pool->idle_bytes() == 0);
  {
    spill::detail::Buffer next = pool->take(64 << 10, 64);
  }  // a take ends the release
  CHECK(pool->idle_bytes() == 64u << 10);
  spill::detail::Buffer outlives = pool->take(8192, 64);
  pool.reset();  // the block's owner frees it once the pool is gone (ASan: no leak, no reuse)
  static_cast<char*>(outlives.data())[8191] = 1;
}

TEST_CASE("restore pool: a backward's restores reuse memory, gradients bit-identical") {
  ScratchDir dir;
  GptReference g(4, 7, {2, 64, 64});
  spill::SpillArena arena =
      stash_arena(engine_options(dir.path(), spill::IoMode::buffered, spill::IoBackend::automatic),
                  stash_settings(true, 0));
  const auto pool = spill::detail::shared_state_of(arena)->restore_pool;
  for (int step = 1; step <= 2; ++step) {
    g.check(gpt_step(g.blocks, spill::make_arena_stash(arena), g.x0));
    // Each backward's first restore takes fresh memory (nothing was carried over); of the other
    // three, those restored after an earlier restored input died reuse its block (how many
    // depends on when the progress thread lets inputs go: two or three here). Nothing is left
    // idle for the next forward.
    const std::uint64_t reused = spill::stash_stats(arena).restores_into_reused_memory;
    CHECK(reused >= 1u * step);
    CHECK(reused <= 3u * step);
    CHECK(pool->idle_bytes() == 0);
  }
  CHECK(arena.stats().bytes_in_use == 0);
}
