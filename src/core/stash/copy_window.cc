#include "copy_window.h"

#include "core/os/counted_wait.h"

namespace spill::detail {

// Note [The device-held bound]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The stash exists to take layer inputs off the device, so the device memory it holds must stay
// small and known: at most max(prefetch_depth, keep_last) + 1 inputs, in forward and in
// backward (StashStats::peak_device_bytes_held), inputs kept for lack of room (kept) aside.
// Backward was bounded already: a restore uploads its own input and those of at most
// prefetch_depth predecessors. Forward was not: an input stays on its device from store() until
// its device -> host copy completed and the progress thread released it, and nothing bounded how
// many were at that point. On an H200 (16 blocks, 128 MiB inputs) the stash held six inputs where
// three were meant, and a 4 KiB input with copies slower than its layer reached twelve on the
// CPU emulation (tests/device_held_test.cc). Two things made it so: copies that had not
// completed, and copies that had but whose release waited on the progress thread behind a job
// waiting for an earlier input's disk write. So:
//   - the releases have a thread of their own (Progress's copies worker, chain.cc): a slow disk
//     delays the pool's blocks, never the device's memory;
//   - each copy holds a Slot of the window from its start until the job that waited for it and
//     released its input is gone — also when the copy failed, so a failure never leaves a slot
//     counted and the next store() waiting for it;
//   - store() returns only once at most max(prefetch_depth, keep_last) - keep_last copies are in
//     flight (this window; Chain::stored), so with the keep_last inputs kept the stash holds at
//     most max(prefetch_depth, keep_last) inputs between stores, one more while a store() runs.
//     It waits for the oldest copies, which a layer's compute normally covers (a device -> host
//     copy at 25 GB/s moves 128 MiB in 5 ms); the wait is counted (copy_waits, copy_wait_ns).
// The cost is the bound itself: a forward whose copies are slower than its layers runs at the
// copies' pace, as it runs at the disk's when the host pool is full. And a copy on the side
// stream starts only after the compute stream's work queued before it, so store() waiting for
// the oldest copy lets the training thread run at most about max(prefetch_depth, keep_last) -
// keep_last layers ahead of the device (none where prefetch_depth <= keep_last: every store()
// then waits for the device). Whether that costs step time on a GPU is not measured yet (the GPU
// check's first call reports copy_waits and copy_wait_ns per mode); bounding device bytes held
// instead of copies would let small inputs run further ahead. An input backward reaches
// while its copy is still in flight goes back as it is (it never left the device) and is counted
// in inputs_back_before_copied: the step was shorter than the copy.

void CopyWindow::opened() {
  MutexLock lock(mutex_);
  ++in_flight_;
}

void CopyWindow::closed() {
  {
    MutexLock lock(mutex_);
    --in_flight_;  // each Slot opened one
  }
  changed_.notify_all();
}

bool CopyWindow::wait_until_at_most(std::uint64_t most, const std::function<bool()>& give_up,
                                    std::atomic<std::uint64_t>& waits,
                                    std::atomic<std::uint64_t>& wait_ns,
                                    std::chrono::milliseconds poll) {
  MutexLock lock(mutex_);
  if (in_flight_ <= most) return true;
  const CountedWait counted(waits, wait_ns);
  for (;;) {
    if (changed_.wait_for(lock, poll, [&]() REQUIRES(mutex_) { return in_flight_ <= most; })) {
      return true;
    }
    lock.unlock();
    const bool stop = give_up();
    lock.lock();
    if (stop) return in_flight_ <= most;
  }
}

}  // namespace spill::detail
