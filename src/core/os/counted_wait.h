// A wait the stats report: counted when it starts, its nanoseconds added when it ends. The host
// pool's waits() and wait_ns() and the stash's pool_waits and pool_wait_ns are kept this way.
//
//   std::atomic<std::uint64_t> waits_{0}, wait_ns_{0};  // atomics: read without the mutex
//   ...
//   MutexLock lock(mutex_);
//   if (!ready()) {
//     const CountedWait counted(waits_, wait_ns_);
//     cv_.wait(lock, ready);
//   }
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace spill::detail {

// Nanoseconds since `since`.
inline std::uint64_t elapsed_ns(std::chrono::steady_clock::time_point since) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since)
          .count());
}

// One wait: `waits` counts it when made, `wait_ns` gets its time when destroyed (also when the
// wait throws). Atomics, so the counters need no lock and a wait may release its mutex.
class CountedWait {
 public:
  CountedWait(std::atomic<std::uint64_t>& waits, std::atomic<std::uint64_t>& wait_ns)
      : wait_ns_(wait_ns) {
    waits.fetch_add(1);
  }
  ~CountedWait() { wait_ns_.fetch_add(elapsed_ns(start_)); }
  CountedWait(const CountedWait&) = delete;
  CountedWait& operator=(const CountedWait&) = delete;

 private:
  std::atomic<std::uint64_t>& wait_ns_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace spill::detail
