// SerialWorker: one thread that runs posted jobs in order, started at the first post. The
// destructor runs the jobs already posted, then joins. Jobs must not throw (a job that does ends
// the process): they report their own failures. See Note [Progress on accelerators] in
// src/core/stash/chain.cc for its use, and Note [Two kinds of worker threads].
//
//   spill::detail::SerialWorker worker;
//   worker.post([entry] { entry->copy.synchronize(); queue_write(*entry); });
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "core/os/mutex.h"

namespace spill::detail {

// Note [Two kinds of worker threads]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The core's thread-pool queue (src/core/io/thread_pool_queue.cc) and this worker both run jobs on
// threads, and were kept apart on purpose. The pool runs I/O requests, several at once, in any
// order, each with an IoStatus and a Completion to wait on, a fault-injection hook and fork
// inertness, and lives in the torch-free core. This worker runs one stash's progress jobs (wait
// for a device copy, then queue its write, then return the pool block) strictly in order, on one
// thread, started lazily, and its jobs block on CUDA events: put on the pool, they would take a
// slot an I/O request needs and could run out of order. One executor would need both
// disciplines behind flags; two small ones each keep one.
class SerialWorker {
 public:
  SerialWorker() = default;
  ~SerialWorker();
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  void post(std::function<void()> job);

 private:
  void run();

  Mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_ GUARDED_BY(mutex_);
  bool stopping_ GUARDED_BY(mutex_) = false;
  std::thread thread_ GUARDED_BY(mutex_);  // started by the first post()
};

}  // namespace spill::detail
