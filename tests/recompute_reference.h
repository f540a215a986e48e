// Tensor results for tests/reference_check.h's rule, and the checkpointing reference LibTorch
// lacks: torch's reentrant checkpoint, written out in the test.
//
//   torch::Tensor y = spill_test::recompute_checkpoint(layer, x, extra...);  // as
//   spill::checkpoint
//   ...
//   spill_test::check_with_references({{"input grad", ours_x.grad()}},
//                                     {{"input grad", recomputed_x.grad()}},
//                                     {{"input grad", plain_x.grad()}});
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "reference_check.h"
#include "spill/checkpoint.h"

namespace spill_test {

using RunResults = Results<torch::Tensor>;

// Bit for bit, as torch::equal sees it: the same dtype, shape and values; both undefined is equal.
inline bool same_result(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && torch::equal(a, b);
}

inline ReferenceCheck compare_with_references(const RunResults& ours,
                                              const RunResults& checkpointing,
                                              const RunResults& plain) {
  return compare_with_references<torch::Tensor>(ours, checkpointing, plain, same_result);
}

inline void check_with_references(const RunResults& ours, const RunResults& checkpointing,
                                  const RunResults& plain) {
  check_reference_verdict(compare_with_references(ours, checkpointing, plain));
}

// ---------------------------------------------------------------------------------------------
// The checkpointing reference: torch's reentrant checkpoint, written out
// ---------------------------------------------------------------------------------------------
//
// What torch.utils.checkpoint(use_reentrant=True) does, with none of spillarena's code: forward
// runs the layer without grad and keeps its inputs as they are; backward restores the CPU's and
// the inputs' devices' generator states and the autocast state the forward saw, reruns the layer
// with grad on detached inputs, backpropagates through it and gives back its inputs' gradients.
// One addition, as spill::checkpoint has it: an anchor that requires grad, so the layer's
// parameters get their gradients when no input requires grad (torch's reentrant form gives them
// none there, its non-reentrant form does).

namespace recompute_detail {

struct AutocastSetting {
  torch::DeviceType type;
  bool enabled;
  at::ScalarType dtype;
};

// What a recomputation must see again: the generators' states and autocast.
struct SeenState {
  torch::Tensor cpu_rng;
  std::vector<std::pair<torch::Device, torch::Tensor>> device_rng;
  std::vector<AutocastSetting> autocast;
  bool autocast_cache_enabled = true;
};

struct Recomputation {
  spill::Layer layer;
  std::vector<bool> needs_grad;
  SeenState forward;
};
using RecomputationPtr = std::shared_ptr<Recomputation>;

inline torch::Tensor generator_state(const torch::Device& device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

inline void set_generator_state(const torch::Device& device, const torch::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

inline AutocastSetting autocast_of(torch::DeviceType type) {
  return {type, at::autocast::is_autocast_enabled(type), at::autocast::get_autocast_dtype(type)};
}

// The state of the CPU, of `devices` and of autocast on the CPU and `devices`' types.
inline SeenState seen_now(const std::vector<torch::Device>& devices) {
  SeenState s;
  s.cpu_rng = generator_state(torch::Device(torch::kCPU));
  std::vector<torch::DeviceType> types{torch::kCPU};
  for (const torch::Device& d : devices) {
    s.device_rng.emplace_back(d, generator_state(d));
    if (std::find(types.begin(), types.end(), d.type()) == types.end()) types.push_back(d.type());
  }
  for (const torch::DeviceType type : types) s.autocast.push_back(autocast_of(type));
  s.autocast_cache_enabled = at::autocast::is_autocast_cache_enabled();
  return s;
}

inline std::vector<torch::Device> devices_of(const std::vector<torch::Tensor>& inputs) {
  std::vector<torch::Device> devices;
  for (const torch::Tensor& t : inputs) {
    if (t.device().is_cpu()) continue;
    if (std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  return devices;
}

inline void install(const SeenState& s) {
  set_generator_state(torch::Device(torch::kCPU), s.cpu_rng);
  for (const auto& [device, state] : s.device_rng) set_generator_state(device, state);
  for (const AutocastSetting& a : s.autocast) {
    at::autocast::set_autocast_enabled(a.type, a.enabled);
    at::autocast::set_autocast_dtype(a.type, a.dtype);
  }
  at::autocast::set_autocast_cache_enabled(s.autocast_cache_enabled);
}

// The forward's state for its lifetime (torch.random.fork_rng and torch.autocast around the
// recomputation); the state it found is put back after.
class Replay {
 public:
  explicit Replay(const SeenState& forward) {
    std::vector<torch::Device> devices;
    for (const auto& d : forward.device_rng) devices.push_back(d.first);
    found_ = seen_now(devices);
    install(forward);
    at::autocast::increment_nesting();
  }
  ~Replay() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    install(found_);
  }
  Replay(const Replay&) = delete;
  Replay& operator=(const Replay&) = delete;

 private:
  SeenState found_;
};

// ctx->saved_data holds IValues: the recomputation rides in a 1-byte tensor whose deleter owns it,
// and dies with the graph node.
inline torch::Tensor token_of(RecomputationPtr r) {
  auto* owned = new RecomputationPtr(std::move(r));
  return torch::from_blob(
      owned, {1}, [](void* p) { delete static_cast<RecomputationPtr*>(p); },
      torch::TensorOptions().dtype(torch::kUInt8));
}

class RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                RecomputationPtr r, torch::Tensor /*anchor*/,
                                                at::TensorList inputs) {
    std::vector<torch::Tensor> in(inputs.begin(), inputs.end());
    r->forward = seen_now(devices_of(in));
    torch::autograd::variable_list outputs = r->layer(in);  // without grad, as apply() runs it
    ctx->save_for_backward(in);
    ctx->saved_data["recomputation"] = token_of(std::move(r));
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const RecomputationPtr r =
        *static_cast<RecomputationPtr*>(ctx->saved_data.at("recomputation").toTensor().data_ptr());
    std::vector<torch::Tensor> inputs;
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    for (std::size_t i = 0; i < saved.size(); ++i) {
      torch::Tensor x = saved[i].detach();
      inputs.push_back(r->needs_grad[i] ? x.requires_grad_(true) : x);
    }
    std::vector<torch::Tensor> outputs;
    {
      Replay replay(r->forward);
      torch::AutoGradMode grad_mode(true);
      outputs = r->layer(inputs);
    }
    torch::autograd::variable_list with_grad, their_grads;
    for (std::size_t i = 0; i < outputs.size() && i < grads.size(); ++i) {
      if (outputs[i].requires_grad() && grads[i].defined()) {
        with_grad.push_back(outputs[i]);
        their_grads.push_back(grads[i]);
      }
    }
    if (!with_grad.empty()) torch::autograd::backward(with_grad, their_grads);
    torch::autograd::variable_list result(2);  // the recomputation, the anchor
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      result.push_back(r->needs_grad[i] ? inputs[i].grad() : torch::Tensor());
    }
    return result;
  }
};

}  // namespace recompute_detail

// The general form: the layer's outputs, with a recomputation in backward.
inline std::vector<torch::Tensor> recompute_checkpoint(spill::Layer layer,
                                                       std::vector<torch::Tensor> inputs) {
  if (!torch::GradMode::is_enabled()) return layer(inputs);
  auto r = std::make_shared<recompute_detail::Recomputation>();
  r->layer = std::move(layer);
  for (const torch::Tensor& t : inputs) r->needs_grad.push_back(t.requires_grad());
  const torch::Tensor anchor = torch::empty({0}, torch::TensorOptions().requires_grad(true));
  return recompute_detail::RecomputeFunction::apply(std::move(r), anchor, at::TensorList(inputs));
}

// The typed form, as spill::checkpoint's: fn(x, extra...) returning a Tensor or a vector of them.
template <class Fn, class... Extra>
auto recompute_checkpoint(Fn fn, const torch::Tensor& x, const Extra&... extra) {
  using Result = std::decay_t<std::invoke_result_t<Fn&, const torch::Tensor&, const Extra&...>>;
  std::vector<torch::Tensor> outs =
      recompute_checkpoint(spill::detail::make_layer<Fn, Extra...>(std::move(fn)),
                           std::vector<torch::Tensor>{x, extra...});
  if constexpr (std::is_same_v<Result, torch::Tensor>) {
    return outs.at(0);
  } else {
    return outs;
  }
}

}  // namespace spill_test
