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
#include <mutex>
#include <optional>

#include "serial_worker.h"
#include "spill/tensor_stash.h"
#include "stash_entry.h"

namespace spill::detail {

// What every stash of one arena shares, kept with the arena (SpillArena::attachment): the host
// pool — made at the first accelerator input, then reused by every step's stash (the shared
// stash of spill::checkpoint(arena, ...) lives only as long as a graph) — and the counters.
struct ArenaShared {
  std::mutex mutex;  // guards pool
  std::shared_ptr<HostPool> pool;
  const std::shared_ptr<StashCounters> counters = std::make_shared<StashCounters>();
  StashStats stats();
};
std::shared_ptr<ArenaShared> shared_state_of(const SpillArena& arena);

class Chain {
 public:
  explicit Chain(const SpillArena& arena);
  ~Chain();

  const SpillArena& arena() const { return arena_; }
  const ArenaOptions& options() const { return options_; }
  const std::shared_ptr<StashCounters>& counters() const { return counters_; }
  StashStats stats() const { return shared_->stats(); }

  // store(): links `e` after the last stored entry and spills those keep_last no longer keeps.
  void stored(const EntryPtr& e);
  // restore(): `e` back where it was stored; queues its predecessors' reads first.
  torch::Tensor restore(const EntryPtr& e);
  // Starts bringing `e` back without waiting (a no-op where there is nothing to move).
  void prefetch(Entry& e);  // caller holds e.mutex
  // Rethrows, once, a failure of the progress thread.
  void rethrow_failure();
  [[noreturn]] void throw_abandoned_wait();

 private:
  // --- common (arena_stash.cc)
  void spill(const EntryPtr& e);  // caller holds e->mutex
  void prefetch_predecessors(const Entry& e);
  void record_failure(std::exception_ptr failure);
  bool failed() const;
  void post(std::function<void()> job);  // on the progress thread, or at once if synchronous
  torch::Tensor give_back_input(Entry& e);

  // --- CPU inputs (arena_stash.cc)
  void spill_cpu(const EntryPtr& e);
  void wait_for_room(std::uint64_t bytes);
  void finish_cpu_write(const EntryPtr& e);
  void queue_cpu_read(Entry& e);
  torch::Tensor restore_cpu(Entry& e);
  torch::Tensor aligned_host_buffer(const Entry& e) const;

  // --- accelerator inputs (device_spill.cc)
  HostPool& pool_for(const Entry& e);
  std::optional<HostPool::Lease> lease_for_store(Entry& e, HostPool& pool);
  void spill_device(const EntryPtr& e);
  void spill_in_pieces(Entry& e, HostPool& pool);
  void after_copy(const EntryPtr& e, void (Chain::*next)(const EntryPtr&));
  void finish_copy_locked(const EntryPtr& e);
  void finish_device_write(const EntryPtr& e);
  void finish_device_write_locked(Entry& e);
  void queue_device_read(Entry& e, bool wait_for_room);
  void start_upload(Entry& e);
  void upload_if_read(Entry& e);
  torch::Tensor finish_device_restore(Entry& e);
  torch::Tensor restore_in_pieces(Entry& e, HostPool& pool);

  // --- io = gds (device_spill.cc): device memory straight to the file through cuFile
  bool through_gds(const Entry& e) const { return gds_ && !e.options.device().is_cpu(); }
  void spill_gds(const EntryPtr& e);
  void finish_gds_write_locked(const EntryPtr& e);
  torch::Tensor restore_gds(Entry& e);

  SpillArena arena_;
  const ArenaOptions options_;
  const std::shared_ptr<ArenaShared> shared_;
  const std::shared_ptr<StashCounters> counters_;
  const bool gds_;  // the arena was made with io = gds
  mutable std::mutex mutex_;  // guards last_, unspilled_, failure_, largest_input_
  std::condition_variable room_;  // CPU inputs: bytes in flight went down
  std::weak_ptr<Entry> last_;
  std::deque<std::weak_ptr<Entry>> unspilled_;  // stored, not yet spilled, oldest first
  std::exception_ptr failure_;
  std::uint64_t largest_input_ = 0;
  SerialWorker progress_;  // last: joined before the members its jobs use are destroyed
};

}  // namespace spill::detail
