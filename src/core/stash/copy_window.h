// CopyWindow: the device -> host copies of one chain's accelerator inputs that are in flight —
// each holding its input's device memory until the progress thread releases it — and a wait
// until few enough are. See Note [The device-held bound] in copy_window.cc.
//
//   spill::detail::CopyWindow window;
//   std::atomic<std::uint64_t> waits{0}, wait_ns{0};
//   auto slot = std::make_shared<spill::detail::CopyWindow::Slot>(window);  // a copy started
//   ...                                       // its job releases the input, then drops the slot
//   window.wait_until_at_most(1, [] { return false; }, waits, wait_ns);  // in store()
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
  // One copy in flight, from construction until destroyed: held by the job that waits for the
  // copy and releases its input, so a copy that fails closes its slot too.
  class Slot {
   public:
    explicit Slot(CopyWindow& window) : window_(window) { window_.opened(); }
    ~Slot() { window_.closed(); }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    CopyWindow& window_;
  };

  // Waits until at most `most` copies are in flight: true. `give_up` is asked every `poll`
  // while waiting; true ends the wait, false returned (a failure elsewhere). A wait is counted
  // in `waits` and `wait_ns` (StashStats::copy_waits, copy_wait_ns).
  static constexpr std::chrono::milliseconds kPoll{5};
  bool wait_until_at_most(std::uint64_t most, const std::function<bool()>& give_up,
                          std::atomic<std::uint64_t>& waits, std::atomic<std::uint64_t>& wait_ns,
                          std::chrono::milliseconds poll = kPoll) EXCLUDES(mutex_);

 private:
  void opened() EXCLUDES(mutex_);
  void closed() EXCLUDES(mutex_);

  mutable Mutex mutex_;
  std::condition_variable changed_;
  std::uint64_t in_flight_ GUARDED_BY(mutex_) = 0;
};

}  // namespace spill::detail
