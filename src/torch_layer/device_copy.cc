#include "device_copy.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "core/os/mutex.h"
#include "serial_worker.h"
#include "spill/testing.h"

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
// Without a GPU the same path runs under emulation: CPU tensors, one copy thread, a random delay
// before each copy, and order_current_stream() waits on the host (a CPU "stream" is the calling
// thread). The stash cannot tell the difference, which is the point. The emulated device pins
// too: its host pool is page-aligned host memory reported as pinned, or, with pinning_refused,
// the pageable fallback a memlock cap forces on a real device (Note [The host pool]).

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
// Emulation (tests)
// ---------------------------------------------------------------------------------------------

class EmulatedCopy final : public Copy {
 public:
  EmulatedCopy(torch::Tensor from, torch::Tensor to) : from_(std::move(from)), to_(std::move(to)) {}
  void run() {
    if (to_.defined()) {
      std::memcpy(to_.data_ptr(), from_.data_ptr(), static_cast<std::size_t>(to_.nbytes()));
    }
    MutexLock lock(mutex_);
    from_ = torch::Tensor();
    to_ = torch::Tensor();
    done_ = true;
    finished_.notify_all();
  }
  bool done() const override {
    MutexLock lock(mutex_);
    return done_;
  }
  void synchronize() const override {
    MutexLock lock(mutex_);
    finished_.wait(lock, [this]() REQUIRES(mutex_) { return done_; });
  }
  void order_current_stream() override { synchronize(); }

 private:
  mutable Mutex mutex_;
  mutable std::condition_variable finished_;
  // Read by run() before it takes the mutex: set at construction, before the copy is queued.
  torch::Tensor from_;
  torch::Tensor to_;
  bool done_ GUARDED_BY(mutex_) = false;
};

class EmulatedEngine final : public CopyEngine {
 public:
  explicit EmulatedEngine(const testing::AcceleratorEmulation& e)
      : min_delay_us_(std::min(e.min_delay_us, e.max_delay_us)),
        max_delay_us_(e.max_delay_us),
        random_(e.seed),
        allocations_to_fail_(e.device_allocations_to_fail) {}

  torch::Tensor empty(at::IntArrayRef sizes, const torch::TensorOptions& options) override {
    std::uint32_t left = allocations_to_fail_.load();
    while (left > 0 && !allocations_to_fail_.compare_exchange_weak(left, left - 1)) {
    }
    TORCH_CHECK_WITH(OutOfMemoryError, left == 0,
                     "emulated device out of memory (spill::testing::AcceleratorEmulation)");
    return torch::empty(sizes, options);
  }

  CopyPtr to_host(const torch::Tensor& source, std::uint64_t offset, std::uint64_t bytes,
                  const torch::Tensor& host) override {
    return queue(bytes_of(source, offset, bytes), host);
  }
  CopyPtr to_device(const torch::Tensor& host, const torch::Tensor& dest,
                    std::uint64_t offset) override {
    return queue(host, bytes_of(dest, offset, static_cast<std::uint64_t>(host.numel())));
  }
  CopyPtr marker(const torch::Device&) override {  // CPU work is done when it returns
    auto done = std::make_shared<EmulatedCopy>(torch::Tensor(), torch::Tensor());
    done->run();
    return done;
  }

 private:
  CopyPtr queue(torch::Tensor from, torch::Tensor to) {
    auto copy = std::make_shared<EmulatedCopy>(std::move(from), std::move(to));
    std::uint32_t delay_us = 0;
    {
      MutexLock lock(mutex_);
      delay_us = min_delay_us_ + random_() % (max_delay_us_ - min_delay_us_ + 1);
    }
    worker_.post([copy, delay_us] {
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      copy->run();
    });
    return copy;
  }

  const std::uint32_t min_delay_us_;
  const std::uint32_t max_delay_us_;
  Mutex mutex_;
  std::mt19937 random_ GUARDED_BY(mutex_);
  std::atomic<std::uint32_t> allocations_to_fail_;
  SerialWorker worker_;  // last: runs the copies already queued, then joins
};

Mutex emulation_mutex;
std::shared_ptr<CopyEngine> emulated GUARDED_BY(emulation_mutex);
std::atomic<bool> emulating{false};
std::atomic<EmulatedHostMemory> host_memory{EmulatedHostMemory::off};
std::atomic<std::uint64_t> epoch{0};

EmulatedHostMemory host_memory_of(const testing::AcceleratorEmulation& e) {
  if (!e.enabled) return EmulatedHostMemory::off;
  if (e.host_pool_refused) return EmulatedHostMemory::refused;
  return e.pinning_refused ? EmulatedHostMemory::pinning_refused : EmulatedHostMemory::pinned;
}

}  // namespace

std::shared_ptr<CopyEngine> CopyEngine::for_inputs() {
  static const auto real = std::make_shared<StreamEngine>();
  if (emulating.load(std::memory_order_acquire)) {
    MutexLock lock(emulation_mutex);
    if (emulated) return emulated;
  }
  return real;
}

EmulatedHostMemory emulated_host_memory() { return host_memory.load(); }

std::uint64_t emulation_epoch() { return epoch.load(); }

bool CopyEngine::is_accelerator_input(const torch::Tensor& t) {
  return !t.device().is_cpu() || emulating.load(std::memory_order_acquire);
}

}  // namespace spill::detail

namespace spill::testing {

void set_accelerator_emulation(const AcceleratorEmulation& emulation) {
  std::shared_ptr<detail::CopyEngine> previous;
  {
    detail::MutexLock lock(detail::emulation_mutex);
    previous = std::move(detail::emulated);
    if (emulation.enabled) detail::emulated = std::make_shared<detail::EmulatedEngine>(emulation);
    detail::host_memory.store(detail::host_memory_of(emulation));
    detail::epoch.fetch_add(1);
    detail::emulating.store(emulation.enabled, std::memory_order_release);
  }
}

}  // namespace spill::testing
