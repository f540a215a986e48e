#include "hash_pipeline.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "platform.h"

namespace spill::detail {

// Note [Hashing beside the copy]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A copy and its hash on one core take turns (Note [Hashing while the bytes are in cache] in
// integrity.cc): the hash adds a quarter to a third of the copy's time. Where the arena makes
// the copy itself it fuses the two (Note [Copying and hashing in one pass] in integrity.cc); two
// synchronous paths have no copy of the arena's own to fuse with: a write to a file (the
// kernel's pwrite copies) and read_in_place's check (nothing is copied). There, a thread of the
// arena's own hashes 4 MiB integrity chunks while the caller's pwrite moves on, or beside the
// caller's own hashing of the mapping: where the thread keeps up, the caller waits for its copy
// and for the chunks left when it ends.
//  - When a unit may be hashed: run() takes, for each unit, how many bytes of the copy must be
//    done first (a unit hashed from the copy's destination waits for them). Both users pass 0: a
//    write's source is whole from the start and the mapping is checked where it is, so the
//    thread starts at the first chunk, beside the pwrite or ahead of it, and what it reads ahead
//    is in L3 when the pwrite gets there. BM_Integrity's 16 MiB `copy` round trip went from 0.77
//    to 1.12 of unhashed with this and the fused read (docs/bench/integrity_fused*.json); in two
//    uncommitted runs that differed only in the write's units being ready at once, 0.80 to 1.07.
//  - Units: chunks hash on their own (one XXH3 each), so the thread and the caller may take them
//    in any order: each takes the next ready one with a compare-and-swap. When the copy ends the
//    caller takes units too, until none is left, then waits for the one the thread is in, if any.
//    Alone (one CPU, or the pipeline taken), the caller takes the one-thread path of
//    Note [Hashing while the bytes are in cache] instead. The hashes
//    are those of the one-thread path, and a check still compares the bytes the caller gets.
//  - No spinning: the thread sleeps on a condition variable until a unit is ready (with every
//    unit ready at once, one wake-up per run), so under oversubscription (every core busy: a
//    spinning helper would take time from the copy it helps) it costs one sleeping thread, and
//    the caller hashes what the thread did not reach, as it did alone.
//  - The run lives in its caller's frame. The thread counts itself in (thread_in_run_) before it
//    reads run_; the caller clears run_ and then waits for the count to drop to zero before it
//    returns (both sequentially consistent: one of them always sees the other's store).
//  - When the thread took less than half of the units it could have taken before a copy ended
//    (those ready by then, less one), it was not getting a CPU (every core busy: a compile, other
//    processes, LibTorch's own threads), and waking it cost more than it saved; the next
//    kRunsAloneWhenBusy runs take the one-thread path, then it tries again. (CPUs are counted
//    in the affinity mask: a container held to one CPU by a CFS quota on a larger machine still
//    starts the thread, and this rule is what sends its copies back to one thread.)
//  - One run at a time holds the pipeline; a run that finds it taken (another thread copying in
//    the same arena), a single chunk, a process allowed one CPU, or SPILLARENA_HASH_BESIDE=0 in
//    the environment hashes on its own thread. The
//    thread starts at the first run that uses it and lives as long as the arena.
//  - Nothing here throws or jumps: a copy that fails (an IoError, a SIGBUS on the mapping) says
//    so to its caller and stops; the units then ready are hashed before run() returns.
// Measured: docs/benchmarks.md, "Hashing beside the copy".

namespace {
constexpr int kRunsAloneWhenBusy = 16;

// Two CPUs at least, and not turned off: SPILLARENA_HASH_BESIDE=0 keeps every hash on the
// copying thread (to compare, or to keep a process to the threads it was given). Read once.
bool wanted() {
  static const bool wanted = [] {
    const char* env = std::getenv("SPILLARENA_HASH_BESIDE");
    const bool off = env != nullptr && std::string(env) == "0";
    return !off && platform::capabilities().cpus >= 2;
  }();
  return wanted;
}
}  // namespace

HashPipeline::~HashPipeline() {
  if (owner_.forked() || !started_) return;  // a fork() child has no thread of ours
  {
    MutexLock lock(mutex_);
    stop_.store(true);
    work_->notify_one();
  }
  thread_->join();
}

bool HashPipeline::begin(Run* r) {
  if (!wanted() || owner_.forked()) return false;
  if (claimed_.exchange(true, std::memory_order_acquire)) return false;
  if (skip_runs_ > 0) {  // the thread was not getting a CPU lately: see finish()
    --skip_runs_;
    claimed_.store(false, std::memory_order_release);
    return false;
  }
  if (!started_ && !unusable_) {
    try {
      *thread_ = std::thread([this] { loop(); });
      started_ = true;
    } catch (const std::system_error&) {
      unusable_ = true;  // no thread to be had: every run hashes on its caller's thread
    }
  }
  if (!started_) {
    claimed_.store(false, std::memory_order_release);
    return false;
  }
  run_.store(r);
  if (r->ready[0] == 0 && thread_sleeping_.load()) {  // ready at once: a write, a check
    MutexLock lock(mutex_);
    work_->notify_one();
  }
  return true;
}

void HashPipeline::publish(Run* r, std::uint64_t copied) {
  const std::size_t next = r->next.load();
  const bool newly_ready =
      next < r->units && r->ready[next] > r->copied.load() && r->ready[next] <= copied;
  r->copied.store(copied);
  if (!newly_ready || !thread_sleeping_.load()) return;
  MutexLock lock(mutex_);
  work_->notify_one();
}

bool HashPipeline::take(Run* r, std::size_t* unit) {
  std::size_t i = r->next.load();
  while (i < r->units && r->ready[i] <= r->copied.load()) {
    if (r->next.compare_exchange_weak(i, i + 1)) {
      *unit = i;
      return true;
    }
  }
  return false;
}

void HashPipeline::finish(Run* r, std::uint64_t copied) {
  // Of the units it could have taken before the copy ended (those ready by then, less one: where
  // units wait for the copy, the last became ready only at its end), the thread took less than
  // half: it was not getting a CPU while the copy ran (every core busy), and waking it cost more
  // than it saved.
  std::size_t ready = 0;
  while (ready < r->units && r->ready[ready] <= copied) ++ready;
  const std::size_t taken = std::min(r->next.load(), ready);
  if (copied > 0 && ready > 1 && 2 * taken < ready - 1) skip_runs_ = kRunsAloneWhenBusy;
  r->copied.store(copied);
  for (std::size_t i; take(r, &i);) r->hash(r->context, i);  // beside the thread, if it is too
  run_.store(nullptr);
  if (thread_in_run_.load() != 0) {
    MutexLock lock(mutex_);
    caller_sleeping_.store(true);
    left_->wait(lock, [this] { return thread_in_run_.load() == 0; });
    caller_sleeping_.store(false);
  }
  claimed_.store(false, std::memory_order_release);
}

// With thread_in_run_ raised: is there a ready unit (or the end)?
bool HashPipeline::work_waiting() {
  if (stop_.load()) return true;
  Run* r = run_.load();
  if (r == nullptr) return false;
  const std::size_t i = r->next.load();
  return i < r->units && r->ready[i] <= r->copied.load();
}

void HashPipeline::loop() {
  for (;;) {
    {
      MutexLock lock(mutex_);
      thread_sleeping_.store(true);
      work_->wait(lock, [this] {
        thread_in_run_.fetch_add(1);
        if (work_waiting()) return true;  // leaves the count raised
        thread_in_run_.fetch_sub(1);
        return false;
      });
      thread_sleeping_.store(false);
    }
    if (stop_.load()) return;
    if (Run* r = run_.load()) {
      for (std::size_t i; take(r, &i);) {
        r->hash(r->context, i);
        beside_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    if (thread_in_run_.fetch_sub(1) == 1 && caller_sleeping_.load()) {
      MutexLock lock(mutex_);
      left_->notify_one();
    }
  }
}

}  // namespace spill::detail
