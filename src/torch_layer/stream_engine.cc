#include "stream_engine.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstdint>
#include <string>
#include <utility>

#include "tensor_bytes.h"

namespace spill::detail {
namespace {

// Note [Accelerator copies]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A layer's input is copied off the device on a side stream from the device's pool, after an
// event recorded on the current stream (the input is complete there); the copy records its own
// event. The tensors it reads and writes stay referenced until that event completed, so the
// caching allocator cannot hand their memory to the next layer while the copy still uses it —
// the race torchtune, TRL and Megatron shipped. The current stream is taken at every call, never
// cached. Host memory is a block of the stash's pool (Note [The host pool] in
// src/core/stash/host_pool.cc), which goes back to the pool only after its copy completed.
//
// Without a GPU the same path runs under emulation, an engine the tests install through
// set_copy_engine_override (tests/support/accelerator_emulation.cc, not in the library): CPU
// tensors, one copy thread, a random delay before each copy, and order_current_stream() waits
// on the host (a CPU "stream" is the calling thread). The stash cannot tell the difference,
// which is the point. The emulated device pins too: its host pool is page-aligned host memory
// reported as pinned, or, with pinning refused, the pageable fallback a memlock cap forces on a
// real device (Note [The host pool]).

c10::Event record_on(const c10::Stream& stream) {
  c10::Event event(stream.device_type());
  event.record(stream);
  return event;
}

class StreamCopy final : public Copy {
 public:
  StreamCopy(torch::Tensor from, torch::Tensor to, c10::Event event)
      : from_(std::move(from)), to_(std::move(to)), event_(std::move(event)) {}
  bool done() const override { return event_.query(); }
  void synchronize() const override { event_.synchronize(); }
  void order_current_stream() override {
    c10::impl::VirtualGuardImpl impl(event_.device_type());
    event_.block(impl.getStream(torch::Device(event_.device_type(), event_.device_index())));
  }

 private:
  torch::Tensor from_;
  torch::Tensor to_;
  c10::Event event_;
};

CopyPtr on_side_stream(const torch::Device& device, torch::Tensor from, torch::Tensor to) {
  c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Stream current = impl.getStream(device);
  const c10::Stream side = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
  c10::Event inputs_ready = record_on(current);
  inputs_ready.block(side);
  c10::StreamGuard guard(side);
  to.copy_(from, /*non_blocking=*/true);
  return std::make_shared<StreamCopy>(std::move(from), std::move(to), record_on(side));
}

class StreamEngine final : public CopyEngine {
 public:
  CopyPtr to_host(const Buffer& source, std::uint64_t offset, std::uint64_t bytes,
                  const Buffer& host) override {
    return on_side_stream(torch_device(source.device()), tensor_of(source.slice(offset, bytes)),
                          tensor_of(host));
  }
  CopyPtr to_device(const Buffer& host, const Buffer& dest, std::uint64_t offset) override {
    return on_side_stream(torch_device(dest.device()), tensor_of(host),
                          tensor_of(dest.slice(offset, host.bytes())));
  }
  CopyPtr marker(const Device& device) override {
    const torch::Device d = torch_device(device);
    c10::impl::VirtualGuardImpl impl(d.type());
    return std::make_shared<StreamCopy>(torch::Tensor(), torch::Tensor(),
                                        record_on(impl.getStream(d)));
  }
  Buffer empty(const Device& device, std::uint64_t bytes,
               const ExplainOutOfMemory& explain) override {
    try {
      return bytes_of(
          torch::empty({static_cast<std::int64_t>(bytes)},
                       torch::TensorOptions().dtype(torch::kUInt8).device(torch_device(device))));
    } catch (const c10::OutOfMemoryError& x) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, explain(x.what_without_backtrace()));
    }
  }
  Buffer pinned_host(std::uint64_t bytes) override {
    try {
      return bytes_of(
          torch::empty({static_cast<std::int64_t>(bytes)},
                       torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true)));
    } catch (const c10::Error&) {  // cudaHostAlloc refused: over memlock, or no memory to lock
      return Buffer();
    }
  }
};

}  // namespace

std::shared_ptr<CopyEngine> engine_for_inputs() {
  static const auto real = std::make_shared<StreamEngine>();
  if (std::shared_ptr<CopyEngine> engine = CopyEngine::override_engine()) return engine;
  return real;
}

bool is_accelerator_input(const torch::Tensor& t) {
  return !t.device().is_cpu() || CopyEngine::overridden();
}

}  // namespace spill::detail
