// One stored tensor of the arena stash and its lifecycle: one State, moved only by advance(),
// which knows the allowed transitions. See Note [Lifecycle of a stashed tensor] in
// src/core/stash/stash_entry.cc.
//
//   spill::detail::MutexLock lock(entry->mutex);
//   spill::detail::advance(*entry, spill::detail::State::writing);  // throws on a bad transition
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "copy_engine.h"
#include "core/os/mutex.h"
#include "spill/arena.h"
#include "stash_fields.h"

namespace spill::detail {

enum class State {
  held,       // stored; the stash references the input where it is; nothing moved yet
  kept,       // left where it is until backward: no room in the arena or the host pool, or a
              // write that failed while the input was still here
  copying,    // accelerator: device -> host pool copy in flight; the input still referenced
  writing,    // write to the region in flight (from the CPU input itself, or from the pool)
  failed,     // the write failed after the input was released: restore() throws `failure`
  spilled,    // only the region holds the bytes
  reading,    // read queued (into the pool or a host buffer; readahead for zero-copy)
  uploading,  // accelerator: host pool -> device copy in flight into a new device tensor
  restored,   // given back to backward; nothing left to do but free
};
const char* to_string(State state);

// Counters shared by a stash and its entries (atomics: any thread updates them): StashStats'
// COUNTED fields (SPILL_STASH_STATS_FIELDS, Note [One list of each struct's fields]).
struct StashCounters {
#define SPILL_STASH_COUNTER(name) std::atomic<std::uint64_t> name{0};
#define SPILL_STASH_NOT_COUNTED(name)
  SPILL_STASH_STATS_FIELDS(SPILL_STASH_COUNTER, SPILL_STASH_NOT_COUNTED)
#undef SPILL_STASH_COUNTER
#undef SPILL_STASH_NOT_COUNTED

  // The COUNTED fields of `stats` from these counters.
  void copy_to(StashStats& stats) const;
  // A stashed tensor was given back; `was_ready` when its I/O had completed, `waited_ns` spent
  // waiting for it; `prefetched` when its read was queued ahead.
  void record_restore(bool prefetched, bool was_ready, std::uint64_t waited_ns);
  // A stored tensor's bytes reached the arena: counted as a layer input or apart.
  void record_spilled(bool layer_input);
  void add_device_bytes(std::uint64_t bytes);
  void sub_device_bytes(std::uint64_t bytes) { device_bytes_held.fetch_sub(bytes); }
  void add_in_flight(std::uint64_t bytes);
  void sub_in_flight(std::uint64_t bytes) { host_bytes_in_flight.fetch_sub(bytes); }
};

// Raises `max` to `value` when `value` is larger (any thread).
void raise_to(std::atomic<std::uint64_t>& max, std::uint64_t value);

// What a front end tells the stash about one input: its bytes (contiguous, kept alive by the
// buffer's owner while the stash holds them) and what only the front end knows about it.
struct StashInput {
  Buffer bytes;
  bool accelerator = false;            // takes the device path (a device, or an emulated one)
  std::shared_ptr<CopyEngine> engine;  // accelerator inputs: the front end's, or the override
  // "layer input of shape [4, 8], dtype float, 128 bytes": for messages.
  std::function<std::string()> describe;
  // Autograd's rule for saved tensors: true after any in-place change since store(), also once
  // the stash let go of the bytes (the front end keeps the version counter). Empty: the front
  // end checks that itself.
  std::function<bool()> changed_in_place;
  // False for a tensor that is not a layer input (an offload policy's operation output,
  // offload()'s saved tensor): StashStats counts it apart, in saved_tensors_*.
  bool layer_input = true;
};

struct Entry;

// What one path keeps of an entry beside the shared lifecycle: a subclass of the path's own, in
// the path's file (CpuState in cpu_path.cc, DeviceState in device_path.cc, GdsState in
// gds_path.cc), made by that path (state_of in stash_path.h) and read only by it. The lifecycle
// reaches it through these calls alone (Note [A path and its state] in stash_path.h).
class PathState {
 public:
  PathState() = default;
  PathState(const PathState&) = delete;
  PathState& operator=(const PathState&) = delete;
  virtual ~PathState() = default;
  // ~Entry, once the region was freed (so its reads and writes completed, and no read ahead
  // still lands in this state's memory): waits for what else uses that memory (a device copy)
  // and gives back what the state counted in `e.counters`. Never throws; the state is destroyed
  // right after.
  virtual void settle(const Entry& e) noexcept { static_cast<void>(e); }
  // give_back_input of an entry in writing, its input still here: the write from the input
  // completed (the region was freed after it); throws its failure (spill::IoError).
  virtual void check_write() const {}
};

// One stored input: the lifecycle every path shares (state, input, region, failure), and its
// path's own state (path_state), all under one mutex.
struct Entry {
  Entry(StashInput input, std::shared_ptr<StashCounters> counters);
  ~Entry();
  Entry(const Entry&) = delete;
  Entry& operator=(const Entry&) = delete;

  Mutex mutex;
  State state GUARDED_BY(mutex) = State::held;
  Buffer input GUARDED_BY(mutex);  // held, kept, copying; writing for a CPU input
  bool prefetched GUARDED_BY(mutex) = false;
  Region region GUARDED_BY(mutex);
  // Its path's own (a PathState subclass), made by that path at its first call for the entry;
  // destroyed after the region was freed (~Entry).
  std::unique_ptr<PathState> path_state GUARDED_BY(mutex);
  // failed: the write's failure; restore() throws it again instead of reading what never
  // reached the region.
  std::exception_ptr failure GUARDED_BY(mutex);
  // Stored just before; set once by Chain::stored (under the chain's mutex, before any other
  // thread sees this entry), then only read.
  std::weak_ptr<Entry> previous;

  // Constant after construction.
  const Device device;  // the input's
  const std::uint64_t bytes;
  const bool accelerator;
  const bool layer_input;                    // StashInput::layer_input
  const std::shared_ptr<CopyEngine> engine;  // accelerator inputs
  const std::shared_ptr<StashCounters> counters;

  std::string describe() const { return describe_ ? describe_() : "layer input"; }
  bool changed_in_place() const { return changed_in_place_ && changed_in_place_(); }

 private:
  const std::function<std::string()> describe_;
  const std::function<bool()> changed_in_place_;
};
using EntryPtr = std::shared_ptr<Entry>;

// Moves `e` to `to`; throws std::logic_error naming both states when the Note's table has no
// such arrow. The caller holds e.mutex.
void advance(Entry& e, State to) REQUIRES(e.mutex);

// held, kept, copying, and a CPU input in writing: the input itself goes back to backward, and
// the region with it (after a write still in flight). The caller (Chain::restore) has refused an
// input changed in place since store().
Buffer give_back_input(Entry& e) REQUIRES(e.mutex);

// Autograd's words for a stashed input changed in place; `when` says when it was seen.
[[noreturn]] void throw_modified(const Entry& e, const char* when);

}  // namespace spill::detail
