// HashPipeline: a thread of its own that hashes what a copy already moved while the copy moves
// the rest, so a hashed copy takes about the time of the copy alone where a second CPU is free.
// See Note [Hashing beside the copy] in hash_pipeline.cc.
//
//   HashPipeline pipeline;  // its thread starts at the first run() that uses it
//   std::vector<std::uint64_t> ready = ...;  // unit i can be hashed once ready[i] bytes are copied
//   const bool beside = pipeline.run(bytes, kHashSliceBytes, ready,
//       [&](std::uint64_t done, std::uint64_t n) { copy(dst + done, src + done, n); return true; },
//       [&](std::size_t i) { hashes[i] = hash_bytes(...unit i...); });
//   // true: returned once the copy was done and every unit hashed (on either thread);
//   // false: nothing done, copy and hash on this thread
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

#include "fork_guard.h"
#include "mutex.h"

namespace spill::detail {

class HashPipeline {
 public:
  HashPipeline() = default;
  ~HashPipeline();
  HashPipeline(const HashPipeline&) = delete;
  HashPipeline& operator=(const HashPipeline&) = delete;

  // Calls copy(done, n) for each slice of `bytes` (`slice` bytes each, in order) on the calling
  // thread, and hash(i) once for each unit i < ready.size() (units are independent: any order,
  // any thread) once ready[i] bytes are copied: on the pipeline's thread while the copy goes on,
  // and on both once it ends. `copy` returns false when it failed: that slice does not count as
  // copied, the run stops, and units not ready by then are not hashed. Neither may throw (a throw
  // terminates), nor leave by longjmp. `slice` > 0. Returns false, having called neither, where
  // it cannot run beside: one unit or none, a process allowed one CPU, or another thread's run
  // holding the pipeline; the caller then copies and hashes on its own thread.
  template <class Copy, class Hash>
  bool run(std::uint64_t bytes, std::uint64_t slice, const std::vector<std::uint64_t>& ready,
           Copy&& copy, Hash&& hash) {
    Run r{&call<std::remove_reference_t<Hash>>, const_cast<void*>(static_cast<const void*>(&hash)),
          ready.data(), ready.size()};
    if (ready.size() < 2 || !begin(&r)) return false;
    std::uint64_t copied = 0;
    while (copied < bytes) {
      const std::uint64_t n = slice < bytes - copied ? slice : bytes - copied;
      if (!copy(copied, n)) break;
      copied += n;
      publish(&r, copied);
    }
    finish(&r, copied);
    return true;
  }

  // Units hashed on the pipeline's thread so far (the rest ran on their callers' threads).
  std::uint64_t units_beside() const { return beside_.load(std::memory_order_relaxed); }

 private:
  // One run, in its caller's frame; the thread reaches it through run_ only.
  struct Run {
    void (*hash)(void* context, std::size_t unit) noexcept;
    void* context;
    const std::uint64_t* ready;
    std::size_t units;
    std::atomic<std::uint64_t> copied{0};
    std::atomic<std::size_t> next{0};  // the first unit nobody has taken
  };
  template <class Hash>
  static void call(void* context, std::size_t unit) noexcept {
    (*static_cast<Hash*>(context))(unit);
  }

  bool begin(Run* r);
  void publish(Run* r, std::uint64_t copied);
  void finish(Run* r, std::uint64_t copied);
  static bool take(Run* r, std::size_t* unit);  // the next unit, if ready
  void loop();                                  // the pipeline's thread
  bool work_waiting();

  ProcessOwner owner_;
  std::atomic<bool> claimed_{false};  // a run holds the pipeline
  bool started_ = false;              // these three: the claiming run's (and the destructor's)
  bool unusable_ = false;
  int skip_runs_ = 0;  // runs left to go alone
  std::atomic<Run*> run_{nullptr};
  std::atomic<int> thread_in_run_{0};  // the thread may be reading *run_
  std::atomic<bool> stop_{false};
  std::atomic<bool> thread_sleeping_{false};
  std::atomic<bool> caller_sleeping_{false};
  Mutex mutex_;                               // for the sleeps only
  ParentOnly<std::condition_variable> work_;  // the thread sleeps on it
  ParentOnly<std::condition_variable> left_;  // a finishing caller sleeps on it
  std::atomic<std::uint64_t> beside_{0};
  ParentOnly<std::thread> thread_;
};

}  // namespace spill::detail
