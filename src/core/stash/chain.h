// Chain: what an arena stash and its stashed tensors share — the order in which tensors were
// stored (for keep_last and prefetching), the restore switch on each entry's state, and the
// paths that move bytes, one picked per entry (stash_path.h). See Note [Overlapped spilling] in
// chain.cc and Note [A path and its state] in stash_path.h.
//
//   std::shared_ptr<spill::detail::Chain> chain = spill::detail::make_chain(arena, options);
//   auto entry = std::make_shared<spill::detail::Entry>(std::move(input), chain->counters());
//   chain->stored(entry);                               // spills what keep_last no longer keeps
//   spill::detail::Buffer x = chain->restore(entry);    // in backward
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "core/os/mutex.h"
#include "spill/stash.h"
#include "stash_entry.h"
#include "stash_path.h"

namespace spill::detail {

class Chain {
 public:
  Chain(const SpillArena& arena, const StashOptions& options);
  ~Chain();

  const SpillArena& arena() const { return context_.arena; }
  const std::shared_ptr<StashCounters>& counters() const { return context_.counters; }
  StashStats stats() const { return stash_stats_of(*context_.shared); }

  // store(): links `e` after the last stored entry and spills those keep_last no longer keeps.
  void stored(const EntryPtr& e) EXCLUDES(mutex_);
  // restore(): `e` back where it was stored. Queues its own read, then its predecessors', and
  // only then waits for its own bytes.
  Buffer restore(const EntryPtr& e);
  // Starts bringing `e` back without waiting (a no-op where there is nothing to move).
  void prefetch(Entry& e) REQUIRES(e.mutex);
  // Rethrows, once, a failure of the progress thread.
  void rethrow_failure() { progress_.rethrow_failure(); }
  // The warnings not yet given: the arena's sizing notices and the stash's own. A front end
  // gives them after each store, its own way (TORCH_WARN, Python's warnings).
  std::vector<std::string> take_notices();

 private:
  SpillPath& path_for(const Entry& e) const;
  void spill(const EntryPtr& e) REQUIRES(e->mutex);
  void prefetch_predecessors(const Entry& e);
  void prefetch_from(EntryPtr p);  // p and its predecessors, prefetch_depth in all

  StashContext context_;
  // SPILLARENA_PREFETCH_THREAD=worker: Note [Prefetching off the training thread] in chain.cc
  std::string prefetch_notice_ GUARDED_BY(mutex_);  // a value it does not know, said once
  const bool prefetch_on_worker_;
  mutable Mutex mutex_;
  std::weak_ptr<Entry> last_ GUARDED_BY(mutex_);
  // Stored, not yet spilled, oldest first.
  std::deque<std::weak_ptr<Entry>> unspilled_ GUARDED_BY(mutex_);
  // In the order path_for asks them (kPaths in chain.cc).
  std::vector<std::unique_ptr<SpillPath>> paths_;
  Progress progress_;  // last: its thread joined before the paths its jobs use are destroyed
};

// `options`, or an InvalidArgumentError naming the value and the fix.
const StashOptions& checked(const StashOptions& options);
// A chain of its own in the regions of `arena`, after checking `options`.
std::shared_ptr<Chain> make_chain(const SpillArena& arena, const StashOptions& options);
// The arena's shared chain (spill::checkpoint(arena, ...), spillarena.checkpoint): made with the
// arena's stash options, alive while a front end's stash or a stashed tensor holds it.
std::shared_ptr<Chain> shared_chain(const SpillArena& arena);

}  // namespace spill::detail
