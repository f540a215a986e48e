// SerialWorker: one thread that runs posted jobs in order, started at the first post. The
// destructor runs the jobs already posted, then joins. Jobs must not throw (a job that does ends
// the process): they report their own failures. See Note [Progress on accelerators] in
// src/torch_layer/arena_stash.cc for its use.
//
//   spill::detail::SerialWorker worker;
//   worker.post([entry] { entry->copy.synchronize(); queue_write(*entry); });
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "core/mutex.h"

namespace spill::detail {

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
