#include "device_copy.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace spill::detail {
namespace {

// Note [Accelerator copies]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A layer's input is copied off the device on a side stream from the device's pool, after an
// event recorded on the current stream (the input is complete there); the copy records its own
// event. The source tensor stays referenced until that event completed, so the caching
// allocator cannot hand its memory to the next layer while the copy still reads it — the race
// torchtune, TRL and Megatron shipped. The current stream is taken at every call, never cached.
// Host buffers are pinned (LibTorch's host allocator for the device type), so copies are truly
// asynchronous; where pinning is refused (containers, WSL cap it) pageable memory works, slower.
torch::Tensor host_buffer_like(const torch::Tensor& t) {
  const auto options = t.options().device(torch::kCPU);
  try {
    return torch::empty(t.sizes(), options.pinned_memory(true));
  } catch (const c10::Error&) {
    TORCH_WARN_ONCE("spillarena: pinned host memory is unavailable; spilling through pageable "
                    "memory (device copies are then synchronous)");
    return torch::empty(t.sizes(), options);
  }
}

c10::Event record_on(const c10::Stream& stream) {
  c10::Event event(stream.device_type());
  event.record(stream);
  return event;
}

// Runs `copy` on a side stream of `device` ordered after the current stream; returns its event.
template <class Copy>
c10::Event on_side_stream(const torch::Device& device, Copy copy) {
  c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Stream current = impl.getStream(device);
  const c10::Stream side = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
  c10::Event inputs_ready = record_on(current);
  inputs_ready.block(side);
  c10::StreamGuard guard(side);
  copy();
  return record_on(side);
}

}  // namespace

DeviceCopy::DeviceCopy(torch::Tensor source, torch::Tensor result, c10::Event event)
    : source_(std::move(source)), result_(std::move(result)), event_(std::move(event)) {}

DeviceCopy DeviceCopy::to_host(const torch::Tensor& source) {
  torch::Tensor host = host_buffer_like(source);
  c10::Event done =
      on_side_stream(source.device(), [&] { host.copy_(source, /*non_blocking=*/true); });
  return DeviceCopy(source, host, std::move(done));
}

DeviceCopy DeviceCopy::to_device(const torch::Tensor& host, const torch::Device& device) {
  torch::Tensor result = torch::empty(host.sizes(), host.options().device(device));
  c10::Event done = on_side_stream(device, [&] { result.copy_(host, /*non_blocking=*/true); });
  return DeviceCopy(host, result, std::move(done));
}

bool DeviceCopy::done() const { return event_->query(); }

void DeviceCopy::synchronize() const { event_->synchronize(); }

void DeviceCopy::order_current_stream() {
  c10::impl::VirtualGuardImpl impl(event_->device_type());
  event_->block(impl.getStream(torch::Device(event_->device_type(), event_->device_index())));
}

void DeviceCopy::release_source_if_done() {
  if (source_.defined() && done()) source_ = torch::Tensor();
}

}  // namespace spill::detail
