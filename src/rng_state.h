// RngState: the random-number state a layer saw in forward, replayed for its recomputation in
// backward so dropout draws the same masks (else the gradients are wrong).
#pragma once

#include <torch/torch.h>

#include <optional>

namespace spill::detail {

struct RngState {
  torch::Tensor cpu_state;
  std::optional<torch::Device> device;  // the input's device, when it has its own generator
  torch::Tensor device_state;
};

// The CPU generator's state and, for an input on another device, that device's generator state.
RngState capture_rng_state(const torch::Device& input_device);

// Installs a captured state for its lifetime, and puts back the states it found on destruction,
// so the recomputation does not disturb the random stream of the rest of the backward pass.
class RngReplay {
 public:
  explicit RngReplay(const RngState& replay);
  ~RngReplay();
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;

 private:
  RngState saved_;
};

}  // namespace spill::detail
