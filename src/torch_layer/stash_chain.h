// Chain: what an arena stash and its stashed tensors share — the arena, the order in which
// tensors were stored (for keep_last and prefetching), the host pool, the progress thread and
// the counters. The CPU path lives in arena_stash.cc, the accelerator path in device_spill.cc.
// See Note [Overlapped spilling] in src/torch_layer/arena_stash.cc.
//
//   auto chain = std::make_shared<spill::detail::Chain>(arena);
//   chain->stored(entry);                  // spills what keep_last no longer keeps
//   torch::Tensor x = chain->restore(entry);  // in backward
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <optional>

#include "core/gds.h"
#include "core/mutex.h"
#include "serial_worker.h"
#include "spill/tensor_stash.h"
#include "stash_entry.h"

namespace spill::detail {

// io = gds: the device buffer every cuFile transfer of an arena's stashes goes through, one at a
// time, registered with cuFile once. See Note [One registered staging buffer] in
// device_spill.cc.
class GdsStaging {
 public:
  // `bytes` (a multiple of 4 KiB) on `device`, through `engine`'s allocator; throws
  // c10::OutOfMemoryError. A registration cuFile refuses leaves it unregistered.
  GdsStaging(CopyEngine& engine, const torch::Device& device, std::uint64_t bytes,
             std::shared_ptr<GdsDriver> driver);
  GdsStaging(const GdsStaging&) = delete;
  GdsStaging& operator=(const GdsStaging&) = delete;

  Mutex mutex;  // held for a whole transfer: copies and cuFile calls
  std::uint64_t bytes() const { return static_cast<std::uint64_t>(memory_.numel()); }
  bool registered() const { return registration_ != nullptr; }
  // The first `bytes` of the buffer (uint8) and its address, 4 KiB aligned.
  torch::Tensor first(std::uint64_t bytes) const;
  void* data() const { return memory_.data_ptr(); }

 private:
  const torch::Tensor allocation_;  // one page more than memory_, for the alignment
  const torch::Tensor memory_;
  std::unique_ptr<GdsRegistration> registration_;  // last: deregistered before the memory goes
};

// What every stash of one arena shares, kept with the arena (spill::detail::attachment): the host
// pool — made at the first accelerator input, then reused by every step's stash (the shared
// stash of spill::checkpoint(arena, ...) lives only as long as a graph) — and the counters.
struct ArenaShared {
  Mutex mutex;
  std::shared_ptr<HostPool> pool GUARDED_BY(mutex);
  StashOptions options GUARDED_BY(mutex);  // set_stash_options
  // shared_arena_stash, while a graph holds it.
  std::weak_ptr<TensorStash> shared_stash GUARDED_BY(mutex);
  // io = gds, from the first device input spilled on: the staging buffer, and the cuFile
  // session (its mode and bounce buffers, capped to the host budget then, for the stats).
  std::shared_ptr<GdsStaging> gds_staging GUARDED_BY(mutex);
  std::shared_ptr<GdsDriver> cufile GUARDED_BY(mutex);
  const std::shared_ptr<StashCounters> counters = std::make_shared<StashCounters>();
  StashStats stats();
};
std::shared_ptr<ArenaShared> shared_state_of(const SpillArena& arena);

class Chain {
 public:
  Chain(const SpillArena& arena, const StashOptions& options);
  ~Chain();

  const SpillArena& arena() const { return arena_; }
  const std::shared_ptr<StashCounters>& counters() const { return counters_; }
  StashStats stats() const { return shared_->stats(); }

  // store(): links `e` after the last stored entry and spills those keep_last no longer keeps.
  void stored(const EntryPtr& e);
  // restore(): `e` back where it was stored; queues its predecessors' reads first.
  torch::Tensor restore(const EntryPtr& e);
  // Starts bringing `e` back without waiting (a no-op where there is nothing to move).
  void prefetch(Entry& e) REQUIRES(e.mutex);
  // Rethrows, once, a failure of the progress thread.
  void rethrow_failure();
  [[noreturn]] void throw_abandoned_wait();

 private:
  // --- common (arena_stash.cc)
  void spill(const EntryPtr& e) REQUIRES(e->mutex);
  void prefetch_predecessors(const Entry& e);
  void record_failure(std::exception_ptr failure);
  bool failed() const EXCLUDES(mutex_);
  void post(std::function<void()> job);  // on the progress thread, or at once if synchronous
  torch::Tensor give_back_input(Entry& e) REQUIRES(e.mutex);

  // --- CPU inputs (arena_stash.cc)
  void spill_cpu(const EntryPtr& e) REQUIRES(e->mutex);
  void wait_for_room(std::uint64_t bytes) EXCLUDES(mutex_);
  void finish_cpu_write(const EntryPtr& e) EXCLUDES(e->mutex);
  // The one test of how a CPU input comes back: buffered I/O reads it through the mapping (the
  // file's or the RAM arena's), with readahead while queued; direct I/O reads it into an aligned
  // host buffer through the engine (Note [Restoring from the mapping] in arena_stash.cc).
  bool reads_through_mapping() const { return arena_.io_mode() == IoMode::buffered; }
  void queue_cpu_read(Entry& e) REQUIRES(e.mutex);
  torch::Tensor restore_cpu(Entry& e) REQUIRES(e.mutex);
  torch::Tensor aligned_host_buffer(const Entry& e) const;

  // --- accelerator inputs (device_spill.cc)
  HostPool& pool_for(const Entry& e);
  std::optional<HostPool::Lease> lease_for_store(Entry& e, HostPool& pool) REQUIRES(e.mutex);
  void spill_device(const EntryPtr& e) REQUIRES(e->mutex);
  void spill_in_pieces(Entry& e, HostPool& pool) REQUIRES(e.mutex);
  // `next` runs with e->mutex held (clang cannot check a call through a member pointer).
  void after_copy(const EntryPtr& e, void (Chain::*next)(const EntryPtr&)) EXCLUDES(e->mutex);
  void finish_copy_locked(const EntryPtr& e) REQUIRES(e->mutex);
  void finish_device_write(const EntryPtr& e) EXCLUDES(e->mutex);
  void finish_device_write_locked(Entry& e) REQUIRES(e.mutex);
  void queue_device_read(Entry& e, bool wait_for_room) REQUIRES(e.mutex);
  void start_upload(Entry& e) REQUIRES(e.mutex);
  void upload_if_read(Entry& e) REQUIRES(e.mutex);
  torch::Tensor finish_device_restore(Entry& e) REQUIRES(e.mutex);
  torch::Tensor device_tensor(const Entry& e) const;
  torch::Tensor restore_in_pieces(Entry& e, HostPool& pool) REQUIRES(e.mutex);

  // --- io = gds (device_spill.cc): device memory to the file through cuFile, by way of the
  // arena's registered staging buffer. Keyed on the entry, not its device: accelerator inputs
  // (CPU tensors too under the copy seam's emulation) take it, CPU inputs the CPU path.
  bool through_gds(const Entry& e) const { return gds_ && e.accelerator; }
  std::uint64_t host_budget(const Entry& e) const;
  GdsStaging& staging_for(const Entry& e);
  void spill_gds(const EntryPtr& e) REQUIRES(e->mutex);
  void finish_gds_write_locked(const EntryPtr& e) REQUIRES(e->mutex);
  void write_through_staging(Entry& e) REQUIRES(e.mutex);
  void release_input(Entry& e) REQUIRES(e.mutex);
  torch::Tensor restore_gds(Entry& e) REQUIRES(e.mutex);

  SpillArena arena_;
  const ArenaOptions arena_options_;  // the host budget: host_pool_bytes, when_pool_full
  const StashOptions options_;
  const std::shared_ptr<ArenaShared> shared_;
  const std::shared_ptr<StashCounters> counters_;
  const bool gds_;  // the arena was made with io = gds
  mutable Mutex mutex_;
  std::condition_variable room_;  // CPU inputs: bytes in flight went down
  std::weak_ptr<Entry> last_ GUARDED_BY(mutex_);
  // Stored, not yet spilled, oldest first.
  std::deque<std::weak_ptr<Entry>> unspilled_ GUARDED_BY(mutex_);
  std::exception_ptr failure_ GUARDED_BY(mutex_);
  std::uint64_t largest_input_ GUARDED_BY(mutex_) = 0;
  SerialWorker progress_;  // last: joined before the members its jobs use are destroyed
};

}  // namespace spill::detail
