#include "serial_worker.h"

#include <utility>

namespace spill::detail {

// Jobs still queued may post more to this worker: they run too, on the same thread, before the
// join returns. So thread_ stays where post() sees it running. (A copy's job posts its write's
// to the other worker of the stash's Progress, which is destroyed after it: stash_path.h.)
SerialWorker::~SerialWorker() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void SerialWorker::post(std::function<void()> job) {
  {
    MutexLock lock(mutex_);
    jobs_.push_back(std::move(job));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  wake_.notify_one();
}

void SerialWorker::run() {
  MutexLock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this]() REQUIRES(mutex_) { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, and every posted job ran
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    // What the job held (an entry whose destructor waits for its I/O and may take the GIL) goes
    // before the mutex is taken again, so post() is never kept waiting behind it.
    job = nullptr;
    lock.lock();
  }
}

}  // namespace spill::detail
