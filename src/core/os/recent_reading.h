// A reading that is costly to take and changes slowly, taken again only once the last one is
// older than its maximum age. The automatic host budget reads the memory this process may still
// use this way at every spill (Note [Reading memory once in a while] in
// src/core/stash/host_pool.cc).
//
//   static RecentReading usable(std::chrono::milliseconds(50),
//                               [] { return memory_limits().usable_bytes(); });
//   const std::uint64_t bytes = usable.get();  // read at most once per 50 ms
#pragma once

#include <chrono>
#include <cstdint>

#include "core/os/mutex.h"

namespace spill::detail {

class RecentReading {
 public:
  using Clock = std::chrono::steady_clock;

  RecentReading(Clock::duration max_age, std::uint64_t (*read)())
      : max_age_(max_age), read_(read) {}

  // The last reading, or a new one when there is none yet or it is `max_age` old. Callers wait
  // while another one reads.
  std::uint64_t get() {
    MutexLock lock(mutex_);
    const Clock::time_point now = Clock::now();
    if (reads_ == 0 || now - taken_at_ >= max_age_) {
      value_ = read_();
      taken_at_ = now;
      ++reads_;
    }
    return value_;
  }

  // How many times it was read (for tests).
  std::uint64_t reads() {
    MutexLock lock(mutex_);
    return reads_;
  }

 private:
  const Clock::duration max_age_;
  std::uint64_t (*const read_)();
  Mutex mutex_;
  std::uint64_t value_ GUARDED_BY(mutex_) = 0;
  std::uint64_t reads_ GUARDED_BY(mutex_) = 0;
  Clock::time_point taken_at_ GUARDED_BY(mutex_);
};

}  // namespace spill::detail
