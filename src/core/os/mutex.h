// Mutex and MutexLock: std::mutex and its scoped lock with clang's thread-safety annotations
// (libstdc++'s std::mutex carries none, so -Wthread-safety cannot see what it guards). Every
// mutex in src/core is a Mutex and names the members it guards; see thread_annotations.h.
//
//   Mutex mutex_;
//   std::condition_variable idle_;
//   int in_flight_ GUARDED_BY(mutex_) = 0;
//
//   MutexLock lock(mutex_);                // held until the end of the scope
//   idle_.wait(lock, [this]() REQUIRES(mutex_) { return in_flight_ == 0; });
//   lock.unlock();                         // and lock.lock() again, both checked
//
// MutexLock is a std::unique_lock<std::mutex>, so a std::condition_variable waits on it as is.
// A wait's predicate runs with the mutex held, but clang checks a lambda on its own: the
// predicate says so with REQUIRES.
#pragma once

#include <mutex>

#include "core/os/thread_annotations.h"

namespace spill::detail {

class CAPABILITY("mutex") Mutex {
 public:
  void lock() ACQUIRE() NO_THREAD_SAFETY_ANALYSIS { mutex_.lock(); }
  void unlock() RELEASE() NO_THREAD_SAFETY_ANALYSIS { mutex_.unlock(); }

 private:
  friend class MutexLock;
  std::mutex mutex_;
};

class SCOPED_CAPABILITY MutexLock : public std::unique_lock<std::mutex> {
 public:
  explicit MutexLock(Mutex& mutex) ACQUIRE(mutex) NO_THREAD_SAFETY_ANALYSIS
      : std::unique_lock<std::mutex>(mutex.mutex_) {}
  ~MutexLock() RELEASE() NO_THREAD_SAFETY_ANALYSIS {}

  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void lock() ACQUIRE() NO_THREAD_SAFETY_ANALYSIS { std::unique_lock<std::mutex>::lock(); }
  void unlock() RELEASE() NO_THREAD_SAFETY_ANALYSIS { std::unique_lock<std::mutex>::unlock(); }
};

}  // namespace spill::detail
