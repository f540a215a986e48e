#include "spill/checkpoint.h"

#include <atomic>

#include "forward_state.h"
#include "shared_arena_stash.h"

namespace spill {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct CheckpointState {
  Layer layer;
  std::shared_ptr<TensorStash> owned_stash;  // the arena form's shared stash, kept alive
  std::unique_ptr<StashedTensor> stashed;
  std::vector<bool> needs_grad;
  detail::ForwardState forward;
  std::atomic<bool> consumed{false};
};
using StatePtr = std::shared_ptr<CheckpointState>;

// Note [Checkpoint state rides in a tensor deleter]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A custom autograd Function keeps its state in ctx->saved_data, which holds IValues, not C++
// objects. The state (and with it the stashed region) must die exactly when the graph node
// dies, whether or not backward ever runs. So it is wrapped in a 1-byte tensor whose deleter
// owns it: stable LibTorch API (from_blob with a deleter), and the region is freed when the
// node is, by the same reference counting that frees every other saved tensor.
torch::Tensor make_state_token(StatePtr state) {
  auto* holder = new StatePtr(std::move(state));
  return torch::from_blob(
      holder, {1}, [](void* p) { delete static_cast<StatePtr*>(p); },
      torch::TensorOptions().dtype(torch::kUInt8));
}

StatePtr state_of(AutogradContext* ctx) {
  auto it = ctx->saved_data.find("spill_state");
  if (it == ctx->saved_data.end()) return nullptr;
  return *static_cast<StatePtr*>(it->second.toTensor().data_ptr());
}

[[noreturn]] void throw_second_backward() {
  throw CheckpointError(std::string("spill::checkpoint: ") + detail::kSecondBackwardMessage);
}

class SpillCheckpointFunction : public torch::autograd::Function<SpillCheckpointFunction> {
 public:
  // Note [Anchor input]
  // ~~~~~~~~~~~~~~~~~~~
  // `anchor` is an empty tensor that requires grad, so the node joins the graph even when no
  // input does: the layer's parameters still need their gradients.
  static variable_list forward(AutogradContext* ctx, StatePtr state, TensorStash* stash,
                               torch::Tensor anchor, at::TensorList inputs) {
    std::vector<torch::Tensor> in(inputs.begin(), inputs.end());
    state->forward = detail::capture_forward_state(in);
    state->stashed = stash->store(in[0]);
    variable_list outputs = state->layer(in);
    ctx->save_for_backward(variable_list(in.begin() + 1, in.end()));
    ctx->saved_data["spill_state"] = make_state_token(std::move(state));
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    StatePtr state = state_of(ctx);
    if (!state || state->consumed.exchange(true)) throw_second_backward();
    std::vector<torch::Tensor> inputs = restore_inputs(*state, ctx->get_saved_variables());
    std::vector<torch::Tensor> outputs;
    {
      detail::ForwardReplay replay(state->forward);
      torch::AutoGradMode grad_mode(true);
      outputs = state->layer(inputs);
    }
    backpropagate(outputs, grads);
    variable_list result(3);  // state, stash, anchor
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      result.push_back(state->needs_grad[i] ? inputs[i].grad() : torch::Tensor());
    }
    return result;
  }

 private:
  static std::vector<torch::Tensor> restore_inputs(CheckpointState& state,
                                                   const variable_list& extras) {
    // Its read and its predecessors' are queued before it waits for its own bytes.
    torch::Tensor x = state.stashed->restore();
    state.stashed.reset();  // the region is free for the next layer's forward
    std::vector<torch::Tensor> inputs;
    inputs.push_back(x.detach().requires_grad_(state.needs_grad[0]));
    for (std::size_t i = 0; i < extras.size(); ++i) {
      torch::Tensor e = extras[i].detach();
      inputs.push_back(state.needs_grad[i + 1] ? e.requires_grad_(true) : e);
    }
    return inputs;
  }

  static void backpropagate(const std::vector<torch::Tensor>& outputs, const variable_list& grads) {
    variable_list outs;
    variable_list out_grads;
    for (std::size_t i = 0; i < outputs.size() && i < grads.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grads[i].defined()) {
        outs.push_back(outputs[i]);
        out_grads.push_back(grads[i]);
      }
    }
    if (!outs.empty()) torch::autograd::backward(outs, out_grads);
  }
};

void check_inputs(const std::vector<torch::Tensor>& inputs) {
  if (inputs.empty() || !inputs[0].defined()) {
    throw InvalidArgumentError(
        "spill::checkpoint: the first input (the tensor to stash) is missing or undefined; pass "
        "the layer's input tensor first");
  }
  for (std::size_t i = 1; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) {
      throw InvalidArgumentError("spill::checkpoint: extra input " + std::to_string(i) +
                                 " is an undefined tensor; pass a defined tensor");
    }
  }
}

std::vector<torch::Tensor> run_checkpoint(TensorStash& stash, std::shared_ptr<TensorStash> owned,
                                          Layer layer, std::vector<torch::Tensor> inputs) {
  check_inputs(inputs);
  if (!torch::GradMode::is_enabled()) return layer(inputs);  // no backward: nothing to stash
  auto state = std::make_shared<CheckpointState>();
  state->layer = std::move(layer);
  state->owned_stash = std::move(owned);
  for (const auto& t : inputs) state->needs_grad.push_back(t.requires_grad());
  torch::Tensor anchor = torch::empty({0}, torch::TensorOptions().requires_grad(true));
  return SpillCheckpointFunction::apply(std::move(state), &stash, anchor, at::TensorList(inputs));
}

}  // namespace

std::vector<torch::Tensor> checkpoint(TensorStash& stash, Layer layer,
                                      std::vector<torch::Tensor> inputs) {
  return run_checkpoint(stash, nullptr, std::move(layer), std::move(inputs));
}

std::vector<torch::Tensor> checkpoint(const SpillArena& arena, Layer layer,
                                      std::vector<torch::Tensor> inputs) {
  std::shared_ptr<TensorStash> stash = detail::shared_arena_stash(arena);
  TensorStash& ref = *stash;
  return run_checkpoint(ref, std::move(stash), std::move(layer), std::move(inputs));
}

std::uint64_t bytes_for_layer_inputs(std::uint64_t layers, const ActivationShape& shape,
                                     torch::Dtype dtype) {
  return bytes_for_layer_inputs(layers, shape, static_cast<std::uint64_t>(c10::elementSize(dtype)));
}

}  // namespace spill
