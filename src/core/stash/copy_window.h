// CopyWindow: the device -> host copies of one chain's accelerator inputs that are in flight —
// each holding its input's device memory until the progress thread releases it — and a wait
// until few enough are. See Note [The device-held bound] in copy_window.cc.
//
//   spill::detail::CopyWindow window;
//   window.opened();                          // a copy started (the input still on its device)
//   window.closed();                          // its device memory released (progress thread)
//   window.wait_until_at_most(1, [] { return failed(); });  // store(), on the training thread
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>

#include "core/os/mutex.h"

namespace spill::detail {

class CopyWindow {
 public:
  void opened() EXCLUDES(mutex_);
  void closed() EXCLUDES(mutex_);
  std::uint64_t in_flight() const EXCLUDES(mutex_);
  // Waits until at most `most` copies are in flight: true. `give_up` is asked every `poll`
  // while waiting; true ends the wait, false returned (a failure elsewhere). A wait is counted
  // in `waits` and `wait_ns` (StashStats::copy_waits, copy_wait_ns).
  static constexpr std::chrono::milliseconds kPoll{5};
  bool wait_until_at_most(std::uint64_t most, const std::function<bool()>& give_up,
                          std::atomic<std::uint64_t>& waits, std::atomic<std::uint64_t>& wait_ns,
                          std::chrono::milliseconds poll = kPoll) EXCLUDES(mutex_);

 private:
  mutable Mutex mutex_;
  std::condition_variable changed_;
  std::uint64_t in_flight_ GUARDED_BY(mutex_) = 0;
};

}  // namespace spill::detail
