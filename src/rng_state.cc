#include "rng_state.h"

#include <mutex>

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

}  // namespace

// Note [Device generators]
// The device comes from the input tensor (never a hard-coded "cuda"), and c10's generic
// defaultGenerator(device) finds its generator. A device type without a default generator
// cannot run random ops either, so there is nothing to replay there.
RngState capture_rng_state(const torch::Device& input_device) {
  RngState s;
  s.cpu_state = get_state(torch::Device(torch::kCPU));
  if (!input_device.is_cpu()) {
    try {
      s.device_state = get_state(input_device);
      s.device = input_device;
    } catch (const c10::Error&) {
      s.device.reset();
    }
  }
  return s;
}

RngReplay::RngReplay(const RngState& replay) {
  saved_ = capture_rng_state(replay.device.value_or(torch::Device(torch::kCPU)));
  set_state(torch::Device(torch::kCPU), replay.cpu_state);
  if (replay.device) set_state(*replay.device, replay.device_state);
}

RngReplay::~RngReplay() {
  try {
    set_state(torch::Device(torch::kCPU), saved_.cpu_state);
    if (saved_.device) set_state(*saved_.device, saved_.device_state);
  } catch (const c10::Error&) {
    // Restoring a state we read ourselves a moment ago cannot fail in practice; never throw here.
  }
}

}  // namespace spill::detail
