// The emulated accelerator: a copy engine for CPU tensors, installed in the library's copy seam.
// See Note [Accelerator copies] in src/torch_layer/stream_engine.cc.
#include "accelerator_emulation.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>

#include <c10/util/Exception.h>

#include "core/os/mutex.h"
#include "core/stash/copy_engine.h"
#include "core/stash/serial_worker.h"

namespace spill::testing {
namespace {

using detail::Copy;
using detail::CopyPtr;
using detail::Mutex;
using detail::MutexLock;

class EmulatedCopy final : public Copy {
 public:
  EmulatedCopy(detail::Buffer from, detail::Buffer to, bool fails = false)
      : from_(std::move(from)), to_(std::move(to)), fails_(fails) {}
  void run() {
    if (to_.defined()) std::memcpy(to_.data(), from_.data(), static_cast<std::size_t>(to_.bytes()));
    MutexLock lock(mutex_);
    from_ = detail::Buffer();
    to_ = detail::Buffer();
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
    if (fails_) {
      throw std::runtime_error(
          "emulated device copy failed (AcceleratorEmulation::"
          "copies_to_host_to_fail)");
    }
  }
  void order_current_stream() override { synchronize(); }

 private:
  mutable Mutex mutex_;
  mutable std::condition_variable finished_;
  // Read by run() before it takes the mutex: set at construction, before the copy is queued.
  detail::Buffer from_;
  detail::Buffer to_;
  const bool fails_;
  bool done_ GUARDED_BY(mutex_) = false;
};

class EmulatedEngine final : public detail::CopyEngine {
 public:
  explicit EmulatedEngine(const AcceleratorEmulation& e)
      : min_delay_us_(std::min(e.min_delay_us, e.max_delay_us)),
        max_delay_us_(e.max_delay_us),
        random_(e.seed),
        allocations_to_fail_(e.device_allocations_to_fail),
        copies_to_fail_(e.copies_to_host_to_fail) {}

  detail::Buffer empty(const detail::Device&, std::uint64_t bytes,
                       const detail::ExplainOutOfMemory& explain) override {
    TORCH_CHECK_WITH(
        OutOfMemoryError, !take_one(allocations_to_fail_),
        explain("emulated device out of memory (spill::testing::AcceleratorEmulation)"));
    return detail::Buffer::host(bytes, 64);
  }
  detail::Buffer pinned_host(std::uint64_t) override { return detail::Buffer(); }

  CopyPtr to_host(const detail::Buffer& source, std::uint64_t offset, std::uint64_t bytes,
                  const detail::Buffer& host) override {
    return queue(source.slice(offset, bytes), host, take_one(copies_to_fail_));
  }
  CopyPtr to_device(const detail::Buffer& host, const detail::Buffer& dest,
                    std::uint64_t offset) override {
    return queue(host, dest.slice(offset, host.bytes()));
  }
  CopyPtr marker(const detail::Device&) override {  // CPU work is done when it returns
    auto done = std::make_shared<EmulatedCopy>(detail::Buffer(), detail::Buffer());
    done->run();
    return done;
  }

 private:
  // Whether a fault is left in `count` (one is taken): the next that many operations fail.
  static bool take_one(std::atomic<std::uint32_t>& count) {
    std::uint32_t left = count.load();
    while (left > 0 && !count.compare_exchange_weak(left, left - 1)) {
    }
    return left > 0;
  }

  CopyPtr queue(detail::Buffer from, detail::Buffer to, bool fails = false) {
    auto copy = std::make_shared<EmulatedCopy>(std::move(from), std::move(to), fails);
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
  std::atomic<std::uint32_t> copies_to_fail_;
  detail::SerialWorker worker_;  // last: runs the copies already queued, then joins
};

detail::EmulatedHostMemory host_memory_of(const AcceleratorEmulation& e) {
  if (!e.enabled) return detail::EmulatedHostMemory::off;
  if (e.host_pool_refused) return detail::EmulatedHostMemory::refused;
  return e.pinning_refused ? detail::EmulatedHostMemory::pinning_refused
                           : detail::EmulatedHostMemory::pinned;
}

}  // namespace

void set_accelerator_emulation(const AcceleratorEmulation& emulation) {
  detail::set_copy_engine_override(
      emulation.enabled ? std::make_shared<EmulatedEngine>(emulation) : nullptr,
      host_memory_of(emulation));
}

}  // namespace spill::testing
