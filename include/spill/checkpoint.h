// spill::checkpoint: gradient checkpointing whose saved layer inputs live in a spill arena.
//
//   spill::SpillArena arena(options);                     // sized to the model
//   torch::Tensor h = x;
//   for (auto& layer : layers)
//     h = spill::checkpoint(arena, [layer](const torch::Tensor& in) mutable {
//       return layer->forward(in);
//     }, h);
//   loss_fn(h).backward();                                // read back, recomputed, freed
//
// Extra tensors (masks, position embeddings) follow the input; a layer may return a Tensor or a
// std::vector<torch::Tensor>:
//   auto outs = spill::checkpoint(arena, [&](const torch::Tensor& h, const torch::Tensor& mask) {
//     return std::vector<torch::Tensor>{block->forward(h, mask), aux};
//   }, h, mask);
//
// Forward stores the first tensor in the stash (the arena, or any TensorStash), runs the layer
// without grad and keeps nothing else of it. Backward restores the input, replays the random
// state the forward saw, recomputes the layer with grad and backpropagates through it. Extra
// tensors are kept by reference (they are usually shared by all layers). Gradients are
// bit-identical to a recompute that keeps the input in memory (torch's reentrant checkpoint),
// and so to running the layer without checkpointing wherever that recompute is: on some CPUs a
// gradient summed from several layers rounds differently once its parts are recomputed.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "spill/arena.h"
#include "spill/sizing.h"
#include "spill/tensor_stash.h"

namespace spill {

using Layer = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;

// The general form: inputs[0] is stashed, inputs[1..] are extras. Returns the layer's outputs.
std::vector<torch::Tensor> checkpoint(TensorStash& stash, Layer layer,
                                      std::vector<torch::Tensor> inputs);
std::vector<torch::Tensor> checkpoint(const SpillArena& arena, Layer layer,
                                      std::vector<torch::Tensor> inputs);

namespace detail {

template <class Fn, std::size_t... I>
auto call_with_tensors(Fn& fn, const std::vector<torch::Tensor>& in, std::index_sequence<I...>) {
  return fn(in[I]...);
}

template <class Fn, class... Extra>
Layer make_layer(Fn fn) {
  return [fn = std::move(fn)](const std::vector<torch::Tensor>& in) mutable {
    auto out = call_with_tensors(fn, in, std::index_sequence_for<torch::Tensor, Extra...>{});
    if constexpr (std::is_same_v<std::decay_t<decltype(out)>, torch::Tensor>) {
      return std::vector<torch::Tensor>{std::move(out)};
    } else {
      return std::vector<torch::Tensor>(std::move(out));
    }
  };
}

template <class Target, class Fn, class... Extra>
auto checkpoint_call(Target& target, Fn fn, const torch::Tensor& x, const Extra&... extra) {
  static_assert((std::is_same_v<Extra, torch::Tensor> && ...),
                "spill::checkpoint: extra arguments must be torch::Tensor");
  using Result = std::decay_t<std::invoke_result_t<Fn&, const torch::Tensor&, const Extra&...>>;
  static_assert(
      std::is_same_v<Result, torch::Tensor> || std::is_same_v<Result, std::vector<torch::Tensor>>,
      "spill::checkpoint: the layer must return torch::Tensor or "
      "std::vector<torch::Tensor>");
  std::vector<torch::Tensor> inputs{x, extra...};
  std::vector<torch::Tensor> outs =
      checkpoint(target, make_layer<Fn, Extra...>(std::move(fn)), std::move(inputs));
  if constexpr (std::is_same_v<Result, torch::Tensor>) {
    return outs.at(0);
  } else {
    return outs;
  }
}

}  // namespace detail

// Typed forms: fn(const Tensor& x, const Tensor& extra...) -> Tensor or vector<Tensor>.
template <class Fn, class... Extra>
auto checkpoint(const SpillArena& arena, Fn fn, const torch::Tensor& x, const Extra&... extra) {
  return detail::checkpoint_call(arena, std::move(fn), x, extra...);
}
template <class Fn, class... Extra>
auto checkpoint(TensorStash& stash, Fn fn, const torch::Tensor& x, const Extra&... extra) {
  return detail::checkpoint_call(stash, std::move(fn), x, extra...);
}

// Sizing with a dtype: layers x one [batch, seq, hidden] input of `dtype`, rounding included.
std::uint64_t bytes_for_layer_inputs(std::uint64_t layers, const ActivationShape& shape,
                                     torch::Dtype dtype);

}  // namespace spill
