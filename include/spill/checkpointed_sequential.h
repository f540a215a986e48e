// CheckpointedSequential: checkpoint every child of a torch::nn::Sequential into a stash in one
// call. It is a module: parameters(), to(), train()/eval() and serialization see the wrapped
// Sequential, registered as "inner".
//
//   torch::nn::Sequential blocks(Block{cfg}, Block{cfg}, Block{cfg});
//   spill::SpillArena arena(options);
//   spill::CheckpointedSequential net(blocks, arena);          // disk (or RAM) arena
//   torch::Tensor y = net->forward(x);                         // each child's input spilled
//
//   spill::CheckpointedSequential baseline(blocks, spill::make_per_file_stash("/mnt/nvme"));
//   spill::CheckpointedSequential plain(blocks, nullptr);      // no checkpointing at all
//
// For a ModuleList or any list of layers, use spill::checkpoint_layers below.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "spill/arena.h"
#include "spill/tensor_stash.h"

namespace spill {

class CheckpointedSequentialImpl : public torch::nn::Module {
 public:
  // stash == nullptr runs the children plainly (no checkpointing): the "none" mode.
  CheckpointedSequentialImpl(torch::nn::Sequential inner, std::shared_ptr<TensorStash> stash);
  CheckpointedSequentialImpl(torch::nn::Sequential inner, const SpillArena& arena);

  torch::Tensor forward(torch::Tensor x);

  torch::nn::Sequential& inner() { return inner_; }
  const std::shared_ptr<TensorStash>& stash() const { return stash_; }

 private:
  torch::nn::Sequential inner_;
  std::shared_ptr<TensorStash> stash_;
};
TORCH_MODULE(CheckpointedSequential);

// Runs x through `layers` in order, each checkpointed into `stash` (nullptr: plainly).
torch::Tensor checkpoint_layers(
    const std::shared_ptr<TensorStash>& stash,
    const std::vector<std::function<torch::Tensor(const torch::Tensor&)>>& layers, torch::Tensor x);

}  // namespace spill
