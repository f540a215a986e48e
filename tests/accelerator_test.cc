// spill::checkpoint with inputs on an accelerator (the first CUDA device): gradients bit-identical
// to a recompute (tests/reference_check.h: and to no checkpointing where that recompute is) in fp32
// and bf16 with dropout, in every backing, I/O mode, backend and
// keep_last; CUDA autocast replayed in the recomputation; random queue delays over many steps.
// Every case prints "skipped: no CUDA device" where LibTorch sees none, and ctest reports the
// entry as skipped. SPILLARENA_TEST_DEVICE=cpu runs the same cases on the CPU, which checks the
// tests themselves on a machine without a GPU.
#include <ATen/autocast_mode.h>
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "gpt_test_support.h"
#include "io_test_support.h"
#include "stash_test_support.h"
#include "test_support.h"

using spill_test::engine_options;
using spill_test::HookScope;
using spill_test::ScratchDir;
using spill_test::stash_arena;
using spill_test::stash_settings;
using spill_test::subcase_name;
using namespace spill_test::gpt;

namespace {

std::optional<torch::Device> accelerator() {
  const char* forced = std::getenv("SPILLARENA_TEST_DEVICE");
  if (forced != nullptr && std::string(forced) == "cpu") return torch::Device(torch::kCPU);
  if (torch::cuda::is_available()) return torch::Device(torch::kCUDA, 0);
  MESSAGE("skipped: no CUDA device (this test runs where LibTorch sees one)");
  return std::nullopt;
}

// Note [Deterministic attention for bitwise checks]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// CUDA's fused attention kernels (flash, memory-efficient, cuDNN) may accumulate gradients with
// atomics, so two backwards of the very same graph can differ in the last bits whatever the
// checkpoint does. The bitwise comparisons therefore run the math kernel, which is deterministic
// on one stream like the matrix products around it. The benchmark keeps the fused kernels.
class MathAttention {
 public:
  MathAttention()
      : flash_(ctx().userEnabledFlashSDP()),
        efficient_(ctx().userEnabledMemEfficientSDP()),
        cudnn_(ctx().userEnabledCuDNNSDP()) {
    set(false, false, false);
  }
  ~MathAttention() { set(flash_, efficient_, cudnn_); }
  MathAttention(const MathAttention&) = delete;
  MathAttention& operator=(const MathAttention&) = delete;

 private:
  static at::Context& ctx() { return at::globalContext(); }
  static void set(bool flash, bool efficient, bool cudnn) {
    ctx().setSDPUseFlash(flash);
    ctx().setSDPUseMemEfficient(efficient);
    ctx().setSDPUseCuDNN(cudnn);
  }
  bool flash_, efficient_, cudnn_;
};

// The block stack and its input on `device` in `dtype`.
struct Model {
  torch::nn::Sequential blocks;
  torch::Tensor x0;
};

Model model_on(torch::Device device, torch::Dtype dtype, int layers) {
  Model m{gpt_blocks(layers), seeded_input(99, {4, 64, 64})};
  m.blocks->to(device, dtype);
  m.x0 = m.x0.to(device, dtype);
  return m;
}

// One step through `stash`, checked bit for bit against `references`.
void check_step(Model& m, const StepReferences& references,
                const std::shared_ptr<spill::TensorStash>& stash, torch::Device device) {
  const Grads spilled = gpt_step(m.blocks, stash, m.x0);
  CHECK(spilled.input.device() == device);
  references.check(spilled);
}

// What every case needs: the device (none: the case returns, skipped), deterministic attention
// (see Note [Deterministic attention for bitwise checks]) and a scratch directory.
struct OnDevice {
  std::optional<torch::Device> device = accelerator();
  MathAttention deterministic;
  ScratchDir dir;
  Model model(torch::Dtype dtype, int layers) const { return model_on(*device, dtype, layers); }
};

}  // namespace

TEST_CASE_FIXTURE(
    OnDevice, "accelerator: fp32 and bf16 gradients with dropout are identical in every setting") {
  if (!device) return;
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    SUBCASE(c10::toString(dtype)) {
      Model m = model(dtype, 4);
      const StepReferences reference = gpt_references(m.blocks, m.x0);
      for (auto backing : {spill::Backing::ram, spill::Backing::disk}) {
        for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
          if (backing == spill::Backing::ram && io == spill::IoMode::direct) continue;
          for (bool asynchronous : {false, true}) {
            for (auto backend : {spill::IoBackend::thread_pool, spill::IoBackend::automatic}) {
              for (std::uint32_t keep_last : {0u, 1u}) {
                const char* overlap = asynchronous ? "asynchronous" : "synchronous";
                const std::string keep = "keep_last " + std::to_string(keep_last);
                SUBCASE(subcase_name(backing, io, overlap, backend, keep).c_str()) {
                  spill::SpillArena arena =
                      stash_arena(engine_options(dir.path(), io, backend, backing),
                                  stash_settings(asynchronous, keep_last));
                  check_step(m, reference, spill::make_arena_stash(arena), *device);
                  CHECK(arena.stats().bytes_in_use == 0);
                  CHECK(arena.stats().allocations == 4 - keep_last);
                }
              }
            }
          }
        }
      }
      SUBCASE("per-file stash") {
        check_step(m, reference, spill::make_per_file_stash(dir.path()), *device);
      }
      SUBCASE("in-memory stash") {
        check_step(m, reference, spill::make_in_memory_stash(), *device);
      }
    }
  }
}

TEST_CASE_FIXTURE(OnDevice,
                  "accelerator: backward prefetches the spilled inputs back to the device") {
  if (!device) return;
  Model m = model(torch::kFloat, 6);
  const StepReferences reference = gpt_references(m.blocks, m.x0);
  spill::SpillArena arena =
      stash_arena(engine_options(dir.path(), spill::IoMode::direct, spill::IoBackend::automatic),
                  stash_settings(true, 1));
  check_step(m, reference, spill::make_arena_stash(arena), *device);
  const spill::ArenaStats s = arena.stats();
  CHECK(s.allocations == 5);
  CHECK(s.bytes_in_use == 0);
  const spill::StashStats st = spill::stash_stats(arena);
  CHECK(st.restores == 6);    // every input, the one kept_last too
  CHECK(st.prefetches == 5);  // each spilled input, queued by its successor's restore
}

// See Note [Progress on accelerators] in src/torch_layer/arena_stash.cc: the training thread queues
// kernels ahead of the device, so without a thread of the stash's own the last layers' inputs would
// wait for backward on the device.
TEST_CASE_FIXTURE(OnDevice,
                  "accelerator: inputs are written during forward, without waiting for backward") {
  if (!device) return;
  Model m = model(torch::kFloat, 6);
  const std::uint64_t spilled_bytes = 5 * m.x0.nbytes();  // keep_last 1
  for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
    SUBCASE(subcase_name(io).c_str()) {
      spill::SpillArena arena = stash_arena(
          engine_options(dir.path(), io, spill::IoBackend::automatic), stash_settings(true, 1));
      auto stash = spill::make_arena_stash(arena);
      torch::Tensor x = m.x0.clone().requires_grad_(true);
      torch::Tensor y = spill::models::run_blocks(m.blocks, stash, x);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (arena.stats().bytes_written < spilled_bytes &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      CHECK(arena.stats().bytes_written == spilled_bytes);
      y.sum().backward();
      CHECK(arena.stats().bytes_read == spilled_bytes);
      CHECK(arena.stats().bytes_in_use == 0);
    }
  }
}

TEST_CASE_FIXTURE(OnDevice,
                  "accelerator: autocast (bf16) on the device is replayed in the recomputation") {
  if (!device) return;
  Model m = model(torch::kFloat, 3);
  const Grads full_precision = gpt_step(m.blocks, nullptr, m.x0);
  StepReferences reference;
  {
    Autocast autocast(*device);
    reference = gpt_references(m.blocks, m.x0);
  }
  // Autocast changes the numbers, so a recomputation in full precision would be caught. Not a
  // matter of rounding: autocast runs the blocks' matrix products in bf16 (8 bits of mantissa
  // against fp32's 24), which leaves no gradient of 16384 elements equal to its fp32 one.
  CHECK_FALSE(torch::equal(reference.recomputed.input, full_precision.input));
  for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
    SUBCASE(subcase_name(io).c_str()) {
      spill::SpillArena arena = stash_arena(
          engine_options(dir.path(), io, spill::IoBackend::automatic), stash_settings(true, 0));
      Grads spilled;
      {
        Autocast autocast(*device);
        spilled = gpt_step(m.blocks, spill::make_arena_stash(arena), m.x0);
      }
      reference.check(spilled);
    }
  }
}

TEST_CASE_FIXTURE(
    OnDevice, "accelerator: random delays in the queue over many steps keep gradients identical") {
  if (!device) return;
  Model m = model(torch::kFloat, 4);
  const StepReferences reference = gpt_references(m.blocks, m.x0);
  steps_under_random_delays(dir.path(), [&](const std::shared_ptr<spill::TensorStash>& stash) {
    check_step(m, reference, stash, *device);
  });
}
