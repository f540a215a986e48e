// Helpers for the checkpoint tests: a GPT block stack with dropout, one training step through
// a stash, and its gradients compared bit for bit with the step's references (reference_check.h).
#pragma once

#include <ATen/autocast_mode.h>
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "io_test_support.h"
#include "recompute_reference.h"
#include "spill/spill.h"
#include "test_support.h"
#include "tiny_gpt.h"

namespace spill_test::gpt {

// keep_last = 0: every layer input is spilled, so tests see a region per checkpointed layer.
inline spill::SpillArena make_arena(const std::string& dir, std::uint64_t capacity,
                                    spill::Backing backing = spill::Backing::disk,
                                    spill::IoMode io = spill::IoMode::buffered) {
  spill::ArenaOptions o = options_in(dir, capacity, io);
  o.backing = backing;
  spill::SpillArena arena(o);
  spill::StashOptions every_input;
  every_input.keep_last = 0;
  spill::set_stash_options(arena, every_input);
  return arena;
}

struct Grads {
  torch::Tensor input;
  std::vector<torch::Tensor> params;
  torch::Tensor loss;
};

// One forward + backward of a GPT block stack with dropout, from a fixed RNG seed: `run(x)` runs
// the blocks.
template <class RunBlocks>
Grads gpt_step_with(torch::nn::Sequential& blocks, RunBlocks run, const torch::Tensor& x0) {
  for (auto& p : blocks->parameters()) p.mutable_grad() = torch::Tensor();
  torch::manual_seed(1234);
  torch::Tensor x = x0.detach().clone().requires_grad_(true);
  torch::Tensor y = run(x);
  torch::Tensor loss = (y * y).mean() + torch::dropout(y, 0.2, true).sum() * 1e-3;
  loss.backward();
  Grads g{x.grad().clone(), {}, loss.detach()};
  for (auto& p : blocks->parameters()) g.params.push_back(p.grad().clone());
  return g;
}

// ... each block checkpointed through `stash` (none: no checkpointing).
inline Grads gpt_step(torch::nn::Sequential& blocks,
                      const std::shared_ptr<spill::TensorStash>& stash, const torch::Tensor& x0) {
  return gpt_step_with(
      blocks, [&](const torch::Tensor& x) { return spill::models::run_blocks(blocks, stash, x); },
      x0);
}

// Runs `blocks` with each checkpointed by torch's reentrant recompute (recompute_reference.h).
inline auto recomputed_blocks(torch::nn::Sequential& blocks) {
  return [&blocks](torch::Tensor x) {
    for (std::size_t i = 0; i < blocks->size(); ++i) {
      auto block = blocks->ptr<spill::models::GptBlockImpl>(i);
      x = recompute_checkpoint([block](const torch::Tensor& in) { return block->forward(in); }, x);
    }
    return x;
  };
}

// ... so: the checkpointing reference of a step.
inline Grads gpt_step_recomputed(torch::nn::Sequential& blocks, const torch::Tensor& x0) {
  return gpt_step_with(blocks, recomputed_blocks(blocks), x0);
}

// A step's results by name, for check_with_references.
inline RunResults results_of(const Grads& g) {
  RunResults r{{"loss", g.loss}, {"input grad", g.input}};
  for (std::size_t i = 0; i < g.params.size(); ++i) {
    r.push_back({"parameter " + std::to_string(i) + " grad", g.params[i]});
  }
  return r;
}

// A step's two references: checkpointed by torch's recompute, and without checkpointing.
struct StepReferences {
  Grads recomputed;
  Grads plain;
  // `ours` bit for bit against them, as tests/reference_check.h says.
  void check(const Grads& ours) const {
    check_with_references(results_of(ours), results_of(recomputed), results_of(plain));
  }
};

inline StepReferences gpt_references(torch::nn::Sequential& blocks, const torch::Tensor& x0) {
  StepReferences r;
  r.recomputed = gpt_step_recomputed(blocks, x0);
  r.plain = gpt_step(blocks, nullptr, x0);
  return r;
}

// A random input drawn right after seeding the CPU generator with `seed`.
inline torch::Tensor seeded_input(std::uint64_t seed, at::IntArrayRef shape) {
  torch::manual_seed(seed);
  return torch::randn(shape);
}

inline torch::nn::Sequential gpt_blocks(int layers) {
  torch::manual_seed(7);
  spill::models::GptConfig cfg;
  cfg.hidden = 64;
  cfg.heads = 4;
  cfg.dropout = 0.1;
  torch::nn::Sequential blocks;
  for (int i = 0; i < layers; ++i) blocks->push_back(spill::models::GptBlock(cfg));
  blocks->train();
  return blocks;
}

// Twelve training steps through an arena stash under random queue delays, in each I/O mode with
// the thread-pool and the automatic backend; `step(stash)` runs and checks one step. Every region
// is freed by the end of each setting.
template <class Step>
void steps_under_random_delays(const std::string& dir, Step step) {
  HookScope jitter(random_delays(7, 3000));
  for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
    for (auto backend : {spill::IoBackend::thread_pool, spill::IoBackend::automatic}) {
      SUBCASE(subcase_name(io, backend).c_str()) {
        spill::SpillArena arena(engine_options(dir, io, backend));  // default stash options
        auto stash = spill::make_arena_stash(arena);
        for (int i = 0; i < 12; ++i) step(stash);
        CHECK(arena.stats().bytes_in_use == 0);
        CHECK(arena.stats().live_regions == 0);
      }
    }
  }
}

// A block stack, its input, and the references of one step.
struct GptReference {
  GptReference(int layers, std::uint64_t seed, at::IntArrayRef shape)
      : blocks(gpt_blocks(layers)),
        x0(seeded_input(seed, shape)),
        references(gpt_references(blocks, x0)) {}
  // A step's gradients, `ours`, against the references.
  void check(const Grads& ours) const { references.check(ours); }
  torch::nn::Sequential blocks;  // declared first: the references are computed with it
  torch::Tensor x0;
  StepReferences references;
};

// Autocast to bfloat16 on `device`'s type for its lifetime, as torch.autocast(device) sets it.
class Autocast {
 public:
  explicit Autocast(torch::Device device) : type_(device.type()) {
    at::autocast::set_autocast_enabled(type_, true);
    at::autocast::set_autocast_dtype(type_, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~Autocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(type_, false);
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  c10::DeviceType type_;
};

}  // namespace spill_test::gpt
