#include "memory_probe.h"

#include <torch/torch.h>

#include <algorithm>

#include "modes.h"
#include "spill/checkpoint.h"
#include "spill/process_memory.h"
#include "spill/sizing.h"

namespace spill::harness {

MemoryProbe probe_stack_memory(const std::string& mode, int layers, std::int64_t rows,
                               std::int64_t hidden, const std::string& directory) {
  torch::manual_seed(0);
  std::vector<torch::Tensor> weights;
  for (int i = 0; i < layers; ++i) {
    weights.push_back((torch::randn({hidden, hidden}) / std::sqrt(hidden)).requires_grad_(true));
  }
  const std::uint64_t input_bytes = static_cast<std::uint64_t>(rows * hidden) * sizeof(float);
  ModeSetup m = make_mode(
      mode,
      bytes_for_layer_inputs(
          layers, {1, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(hidden)},
          torch::kFloat),
      directory);
  torch::Tensor x = torch::randn({rows, hidden}, torch::TensorOptions().requires_grad(true));

  const std::uint64_t before = resident_anonymous_bytes();
  std::uint64_t peak = before;
  torch::Tensor h = x;
  for (int i = 0; i < layers; ++i) {
    torch::Tensor w = weights[i];
    auto layer = [w](const torch::Tensor& in) { return in + torch::tanh(in.matmul(w)); };
    h = m.stash ? checkpoint(*m.stash, layer, h) : layer(h);
    peak = std::max(peak, resident_anonymous_bytes());
  }
  torch::Tensor loss = h.square().mean();
  h = torch::Tensor();
  const std::uint64_t after_forward = resident_anonymous_bytes();
  peak = std::max(peak, after_forward);
  loss.backward();
  peak = std::max(peak, resident_anonymous_bytes());

  MemoryProbe r;
  r.mode = m.mode;
  r.layers = layers;
  r.input_bytes_per_layer = input_bytes;
  r.held_after_forward_bytes = after_forward > before ? after_forward - before : 0;
  r.peak_during_step_bytes = peak - before;
  r.spilled_bytes = m.arena ? m.arena->stats().bytes_written : 0;
  return r;
}

}  // namespace spill::harness
