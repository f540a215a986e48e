#include "forward_state.h"

#include <ATen/autocast_mode.h>

#include <algorithm>
#include <mutex>
#include <optional>

namespace spill::detail {
namespace {

torch::Tensor get_state(const torch::Device& device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_state(const torch::Device& device, const torch::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Note [Device generators]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Devices come from the input tensors (never a hard-coded "cuda"), and c10's generic
// defaultGenerator(device) finds each one's generator. A device type without a default
// generator cannot run random ops either, so there is nothing to replay there.
std::vector<torch::Device> devices_of(const std::vector<torch::Tensor>& inputs) {
  std::vector<torch::Device> devices;
  for (const auto& t : inputs) {
    if (!t.defined() || t.device().is_cpu()) continue;
    if (std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  return devices;
}

// Autocast's state for `type`, where autocast knows the type (meta, for one, it does not).
std::optional<AutocastState> autocast_of(torch::DeviceType type) {
  try {
    return AutocastState{type, at::autocast::is_autocast_enabled(type),
                         at::autocast::get_autocast_dtype(type)};
  } catch (const c10::Error&) {
    return std::nullopt;
  }
}

ForwardState capture(const std::vector<torch::Device>& devices, bool with_rng) {
  ForwardState s;
  if (with_rng) s.cpu_rng = get_state(torch::Device(torch::kCPU));
  std::vector<torch::DeviceType> types{torch::kCPU};
  for (const auto& d : devices) {
    try {
      if (with_rng) s.device_rng.emplace_back(d, get_state(d));
    } catch (const c10::Error&) {
      // No generator for this device type: nothing random runs there.
    }
    if (std::find(types.begin(), types.end(), d.type()) == types.end()) types.push_back(d.type());
  }
  for (auto type : types) {
    if (auto a = autocast_of(type)) s.autocast.push_back(*a);
  }
  s.autocast_cache_enabled = at::autocast::is_autocast_cache_enabled();
  return s;
}

void install(const ForwardState& s) {
  if (s.cpu_rng.defined()) set_state(torch::Device(torch::kCPU), s.cpu_rng);
  for (const auto& [device, state] : s.device_rng) set_state(device, state);
  for (const auto& a : s.autocast) {
    at::autocast::set_autocast_enabled(a.device_type, a.enabled);
    at::autocast::set_autocast_dtype(a.device_type, a.dtype);
  }
  at::autocast::set_autocast_cache_enabled(s.autocast_cache_enabled);
}

}  // namespace

ForwardState capture_forward_state(const std::vector<torch::Tensor>& inputs, bool with_rng) {
  return capture(devices_of(inputs), with_rng);
}

// Note [Replaying autocast]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Autocast state is thread-local, and backward runs outside the forward's autocast region (on
// the caller's thread for CPU, on device threads otherwise): without replay the recomputation
// runs in full precision and the gradients differ. Like torch.utils.checkpoint, the replay
// enters a nesting level and clears the cast cache when it leaves the outermost one.
ForwardReplay::ForwardReplay(const ForwardState& replay) {
  std::vector<torch::Device> devices;
  for (const auto& d : replay.device_rng) devices.push_back(d.first);
  saved_ = capture(devices, replay.cpu_rng.defined());
  for (const auto& a : replay.autocast) {  // device types the forward saw but saved_ lacks
    const bool known =
        std::any_of(saved_.autocast.begin(), saved_.autocast.end(),
                    [&](const AutocastState& s) { return s.device_type == a.device_type; });
    if (!known) saved_.autocast.push_back(*autocast_of(a.device_type));
  }
  install(replay);
  at::autocast::increment_nesting();
}

ForwardReplay::~ForwardReplay() {
  try {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    install(saved_);
  } catch (const c10::Error&) {
    // Restoring a state we read ourselves a moment ago cannot fail in practice; never throw here.
  }
}

}  // namespace spill::detail
