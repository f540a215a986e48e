// ForwardState: what a layer's forward saw that its recomputation in backward must see again —
// the random-number state (so dropout draws the same masks) and the autocast state (so the
// recomputation runs in the same precision). Without either, the gradients are wrong.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace spill::detail {

struct AutocastState {
  torch::DeviceType device_type;
  bool enabled = false;
  at::ScalarType dtype = at::kFloat;
};

struct ForwardState {
  torch::Tensor cpu_rng;  // undefined when captured without the random state
  std::vector<std::pair<torch::Device, torch::Tensor>> device_rng;  // every input device
  std::vector<AutocastState> autocast;  // CPU and every input device type
  bool autocast_cache_enabled = true;
};

// The CPU generator's state, the state of every other device among `inputs` (unless `with_rng`
// is false: Python's preserve_rng_state=False), and autocast: what spill::checkpoint replays.
// The Python front end does the same with torch's Python API (Note [The forward's state,
// replayed in Python] in python/spillarena/forward_state.py).
ForwardState capture_forward_state(const std::vector<torch::Tensor>& inputs, bool with_rng = true);

// What both front ends say when backward runs twice through one checkpointed layer, after their
// own name ("spill::checkpoint: ", "spillarena.checkpoint: "): the stash consumed the input.
constexpr const char* kSecondBackwardMessage =
    "backward ran twice through the same checkpointed layer; its stashed input was consumed and "
    "freed by the first backward. Run forward again for a new graph (retain_graph is not "
    "supported with spilled inputs)";

// Installs a captured state for its lifetime, and puts back the states it found on destruction,
// so the recomputation does not disturb the random stream of the rest of the backward pass.
class ForwardReplay {
 public:
  explicit ForwardReplay(const ForwardState& replay);
  ~ForwardReplay();
  ForwardReplay(const ForwardReplay&) = delete;
  ForwardReplay& operator=(const ForwardReplay&) = delete;

 private:
  ForwardState saved_;
};

}  // namespace spill::detail
