// The arena stash's three ways of moving a stashed tensor, one type each behind SpillPath, each
// with a PathState of its own per entry: CPU inputs straight to the region (cpu_path.cc),
// accelerator inputs through the host pool (device_path.cc), accelerator inputs through cuFile
// with io = gds (gds_path.cc). Chain (chain.h) picks one per entry and keeps what is common,
// ArenaShared (arena_shared.h) what every stash of the arena shares: the host pool, the cuFile
// resources. See Note [A path and its state], Note [Overlapped spilling] in chain.cc and Note
// [Lifecycle of a stashed tensor] in stash_entry.cc.
//
//   spill::detail::StashContext context(arena, options);
//   spill::detail::Progress progress(/*asynchronous=*/true);
//   auto cpu = spill::detail::make_cpu_path(context, progress);
//   cpu->spill(entry);                                   // held -> writing (or kept)
//   // in backward, once the write completed (spilled):
//   bool ready = cpu->begin_restore(*entry);             // its read queued: -> reading
//   spill::detail::Buffer x = cpu->finish_restore(*entry);  // waited for: -> restored
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "arena_shared.h"
#include "core/os/mutex.h"
#include "serial_worker.h"
#include "spill/stash.h"
#include "stash_entry.h"

namespace spill::detail {

// Note [A path and its state]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A path is one file: a SpillPath that moves the entries it takes, and a PathState (stash_entry.h)
// with what it keeps of each beside the shared lifecycle (CpuState: the input's write and a read
// ahead's host buffer; DeviceState: the pool block's Piece and the upload; GdsState: the stream
// marker), made by state_of at its first call for the entry and read by no one else. The chain
// makes every path of kPaths (chain.cc), and path_for gives an entry to the first that takes it,
// asking in that order: io = gds (where the arena asks for it), the host pool's path (the other
// accelerator inputs), the CPU path. takes() reads only the entry's constants and the arena's, so
// an entry keeps its path and its state for life. The lifecycle every path shares (state, input,
// region, failure, previous, prefetched, the counters) stays in Entry, whose code never names a
// path's fields: ~Entry frees the region first (its reads and writes complete, so a read ahead
// no longer lands in the state's memory), then calls PathState::settle (a device copy still
// running, the device bytes of an upload never taken) and destroys the state (a pool block goes
// back last, after its copy and I/O); give_back_input asks PathState::check_write for the
// failure of a write from the input itself; Progress::when_copied waits for the copy the path
// hands it.
//
// So a fourth path (say, operation outputs offloaded to another device's memory) is one new
// file and its registration; Entry, ~Entry, give_back_input, Progress and the other paths stay
// as they are:
//   offload_path.cc  struct OffloadState final : PathState { what it keeps; settle() };
//                    class OffloadPath final : public SpillPath { takes(e): from what the entry
//                    says of itself (its device, layer_input); spill, prefetch, begin_restore,
//                    finish_restore on state_of<OffloadState>(e) }; make_offload_path
//   chain.cc         the one line: make_offload_path in kPaths, before any path that would take
//                    its entries otherwise
// (with make_offload_path declared beside make_cpu_path below, and the file in the build's list
// of sources).

// The progress thread of one stash (Note [Progress on accelerators] in chain.cc) and the
// first failure of its jobs, rethrown once on the training thread.
class Progress {
 public:
  explicit Progress(bool asynchronous) : asynchronous_(asynchronous) {}
  bool asynchronous() const { return asynchronous_; }
  // On the progress thread that waits for writes and returns pool blocks, or at once when the
  // stash is synchronous.
  void post(std::function<void()> job);
  // On a thread of the prefetches' own, or at once when the stash is synchronous; what `job`
  // throws is kept for the training thread (Note [Prefetching off the training thread] in
  // chain.cc).
  void post_prefetch(std::function<void()> job);
  // Runs `next(e)` under e's mutex once `copy` (e's, or a stream marker, which its path hands
  // over) completed: on the progress thread of copies, which waits without holding the mutex and
  // keeps a failure for the training thread, and never waits for a write (Note [The device-held
  // bound] in copy_window.cc); or at once, after the wait, when the stash is synchronous.
  void when_copied(const EntryPtr& e, CopyPtr copy, std::function<void(const EntryPtr&)> next)
      REQUIRES(e->mutex);
  void record_failure(std::exception_ptr failure) EXCLUDES(mutex_);
  bool failed() const EXCLUDES(mutex_);
  void rethrow_failure() EXCLUDES(mutex_);  // once
  // A wait for room that gave up: the failure that ended it, or an IoError naming it.
  [[noreturn]] void throw_abandoned_wait();

 private:
  void after_copy(const EntryPtr& e, CopyPtr copy, const std::function<void(const EntryPtr&)>& next)
      EXCLUDES(e->mutex);

  const bool asynchronous_;
  mutable Mutex mutex_;
  std::exception_ptr failure_ GUARDED_BY(mutex_);
  // Last: joined before the failure they may record is destroyed; prefetches_ and copies_
  // first, as their jobs post to writes_.
  SerialWorker writes_;
  SerialWorker copies_;
  SerialWorker prefetches_;
};

// What a path needs of its stash, made once per stash.
struct StashContext {
  StashContext(const SpillArena& arena, const StashOptions& options);
  SpillArena arena;
  const ArenaOptions arena_options;  // the host budget: host_pool_bytes, when_pool_full
  const StashOptions options;
  const std::shared_ptr<ArenaShared> shared;
  const std::shared_ptr<StashCounters> counters;
  std::atomic<std::uint64_t> largest_input{0};  // of those stored so far
  // The arena's host_pool_bytes, or room for prefetch_depth + 2 inputs of `bytes`.
  std::uint64_t host_budget(std::uint64_t bytes) const;
  // A region for `e`, empty where there is no room under WhenFull::keep_in_memory; an
  // ArenaExhaustedError names the input. With `src`, its bytes' write is queued too
  // (SpillArena::spill_from: the CPU path's one call going forward).
  Region region_for(const Entry& e, const void* src = nullptr);
};

// One way of moving a stashed tensor's bytes. Each call but takes() holds the entry's mutex.
// See Note [A path and its state].
class SpillPath {
 public:
  SpillPath(StashContext& context, Progress& progress) : context_(context), progress_(progress) {}
  virtual ~SpillPath() = default;
  // Whether this path moves `e`, from the entry's constants and the arena's alone: the answer
  // never changes, so an entry keeps its path (and its PathState) for life.
  virtual bool takes(const Entry& e) const = 0;
  // held -> writing, copying or kept: the bytes start towards the region.
  virtual void spill(const EntryPtr& e) REQUIRES(e->mutex) = 0;
  // Starts bringing the bytes back without waiting; never waits for room.
  virtual void prefetch(Entry& e) REQUIRES(e.mutex) = 0;
  // restore() of an entry whose input is gone (an accelerator input in writing; spilled,
  // reading, uploading), in two calls — submit and complete, as liburing has them — so that the
  // chain queues the predecessors' reads while this one is in flight (Note [Overlapped
  // spilling] in chain.cc). begin_restore queues the entry's own read where no prefetch did (a
  // read into the pool may wait for room) and returns whether its bytes were in memory already,
  // before anything was queued. finish_restore, after the entry's mutex was let go and taken
  // again (a prefetch may have moved it on meanwhile), waits for the bytes, frees the region and
  // gives back the tensor; -> restored.
  virtual bool begin_restore(Entry& e) REQUIRES(e.mutex) = 0;
  virtual Buffer finish_restore(Entry& e) REQUIRES(e.mutex) = 0;
  // Waits until at most `most` of this path's device -> host copies are in flight (Note [The
  // device-held bound] in copy_window.cc); no entry's mutex held. Paths without copies return.
  virtual void wait_for_copies(std::uint64_t most) { static_cast<void>(most); }

 protected:
  StashContext& context_;
  Progress& progress_;
};

// The paths, each in its own file; the chain lists them in the order it asks them (kPaths in
// chain.cc).
std::unique_ptr<SpillPath> make_cpu_path(StashContext& context, Progress& progress);
std::unique_ptr<SpillPath> make_device_path(StashContext& context, Progress& progress);
std::unique_ptr<SpillPath> make_gds_path(StashContext& context, Progress& progress);

// The state of type `S` (a PathState) that `e`'s path keeps in it, made at the path's first
// call for the entry. An entry has one path for life (SpillPath::takes), so its state is always
// that path's own type.
template <class S>
S& state_of(Entry& e) REQUIRES(e.mutex) {
  if (!e.path_state) e.path_state = std::make_unique<S>();
  return static_cast<S&>(*e.path_state);
}

// New device memory for `e` through its copy engine; out of device memory, the front end's own
// error type (trainers catch it to lower the batch size), naming the input and the fix.
Buffer device_buffer(const Entry& e, std::uint32_t prefetch_depth);

// Host memory to restore a CPU input into, from the arena's restore pool: aligned for O_DIRECT
// in direct mode (Note [Writing from an aligned source] in src/core/io/io_engine.cc), to
// LibTorch's 64 bytes otherwise.
Buffer host_buffer(const StashContext& context, std::uint64_t bytes);

}  // namespace spill::detail
