#include "device_copy.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <atomic>
#include <utility>

#include "core/os/mutex.h"

namespace spill::detail {
namespace {

// Note [Accelerator copies]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A layer's input is copied off the device on a side stream from the device's pool, after an
// event recorded on the current stream (the input is complete there); the copy records its own
// event. The tensors it reads and writes stay referenced until that event completed, so the
// caching allocator cannot hand their memory to the next layer while the copy still uses it —
// the race torchtune, TRL and Megatron shipped. The current stream is taken at every call, never
// cached. Host memory is a view of the stash's pool (Note [The host pool] in host_pool.cc): a
// view, not a blob, so LibTorch's host allocator sees its own block in every copy.
//
// Without a GPU the same path runs under emulation, an engine the tests install through
// set_copy_engine_override (tests/support/accelerator_emulation.cc, not in the library): CPU
// tensors, one copy thread, a random delay before each copy, and order_current_stream() waits
// on the host (a CPU "stream" is the calling thread). The stash cannot tell the difference,
// which is the point. The emulated device pins too: its host pool is page-aligned host memory
// reported as pinned, or, with pinning refused, the pageable fallback a memlock cap forces on a
// real device (Note [The host pool]).

torch::Tensor bytes_of(const torch::Tensor& t, std::uint64_t offset, std::uint64_t bytes) {
  return t.reshape({-1})
      .view(torch::kUInt8)
      .narrow(0, static_cast<std::int64_t>(offset), static_cast<std::int64_t>(bytes));
}

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

// Runs `from` -> `to` on a side stream of `device`, ordered after the current stream.
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
  CopyPtr to_host(const torch::Tensor& source, std::uint64_t offset, std::uint64_t bytes,
                  const torch::Tensor& host) override {
    return on_side_stream(source.device(), bytes_of(source, offset, bytes), host);
  }
  CopyPtr to_device(const torch::Tensor& host, const torch::Tensor& dest,
                    std::uint64_t offset) override {
    const auto bytes = static_cast<std::uint64_t>(host.numel());
    return on_side_stream(dest.device(), host, bytes_of(dest, offset, bytes));
  }
  CopyPtr marker(const torch::Device& device) override {
    c10::impl::VirtualGuardImpl impl(device.type());
    return std::make_shared<StreamCopy>(torch::Tensor(), torch::Tensor(),
                                        record_on(impl.getStream(device)));
  }
};

// ---------------------------------------------------------------------------------------------
// The override (tests)
// ---------------------------------------------------------------------------------------------

Mutex override_mutex;
std::shared_ptr<CopyEngine> override_engine GUARDED_BY(override_mutex);
std::atomic<bool> overridden{false};
std::atomic<EmulatedHostMemory> host_memory{EmulatedHostMemory::off};
std::atomic<std::uint64_t> epoch{0};

}  // namespace

std::shared_ptr<CopyEngine> CopyEngine::for_inputs() {
  static const auto real = std::make_shared<StreamEngine>();
  if (overridden.load(std::memory_order_acquire)) {
    MutexLock lock(override_mutex);
    if (override_engine) return override_engine;
  }
  return real;
}

bool CopyEngine::is_accelerator_input(const torch::Tensor& t) {
  return !t.device().is_cpu() || overridden.load(std::memory_order_acquire);
}

EmulatedHostMemory emulated_host_memory() { return host_memory.load(); }

std::uint64_t emulation_epoch() { return epoch.load(); }

void set_copy_engine_override(std::shared_ptr<CopyEngine> engine, EmulatedHostMemory memory) {
  std::shared_ptr<CopyEngine> previous;  // dies after the lock: its copy thread joins
  {
    MutexLock lock(override_mutex);
    previous = std::exchange(override_engine, std::move(engine));
    host_memory.store(memory);
    epoch.fetch_add(1);
    overridden.store(override_engine != nullptr, std::memory_order_release);
  }
}

}  // namespace spill::detail
