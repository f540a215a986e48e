#include "spill/checkpointed_sequential.h"

#include "spill/checkpoint.h"

namespace spill {

CheckpointedSequentialImpl::CheckpointedSequentialImpl(torch::nn::Sequential inner,
                                                       std::shared_ptr<TensorStash> stash)
    : inner_(register_module("inner", std::move(inner))), stash_(std::move(stash)) {}

CheckpointedSequentialImpl::CheckpointedSequentialImpl(torch::nn::Sequential inner,
                                                       const SpillArena& arena)
    : CheckpointedSequentialImpl(std::move(inner), make_arena_stash(arena)) {}

torch::Tensor CheckpointedSequentialImpl::forward(torch::Tensor x) {
  for (std::size_t i = 0; i < inner_->size(); ++i) {
    if (!stash_) {
      x = inner_->begin()[static_cast<std::ptrdiff_t>(i)].forward(x);
      continue;
    }
    // The closure holds the Sequential itself, so the graph stays valid if this wrapper dies.
    torch::nn::Sequential seq = inner_;
    x = checkpoint(
        *stash_,
        [seq, i](const torch::Tensor& in) mutable {
          return seq->begin()[static_cast<std::ptrdiff_t>(i)].forward(in);
        },
        x);
  }
  return x;
}

torch::Tensor checkpoint_layers(
    const std::shared_ptr<TensorStash>& stash,
    const std::vector<std::function<torch::Tensor(const torch::Tensor&)>>& layers,
    torch::Tensor x) {
  for (const auto& layer : layers) x = stash ? checkpoint(*stash, layer, x) : layer(x);
  return x;
}

}  // namespace spill
