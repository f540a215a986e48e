#include "stash_entry.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "spill/error.h"

namespace spill::detail {

// Note [Lifecycle of a stashed tensor]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each stored tensor is in exactly one State; advance() is the one place it changes, and it
// refuses what this table does not list:
//
//   held       ──▶ copying (accelerator), writing (CPU), spilled (0 bytes), kept, restored
//   kept       ──▶ restored
//   copying    ──▶ writing, restored
//   writing    ──▶ spilled, kept, failed, restored
//   failed         (none: restore() throws its failure)
//   spilled    ──▶ reading, restored
//   reading    ──▶ uploading (accelerator), restored
//   uploading  ──▶ restored
//
// kept: left where it is until backward gives it back — no room in the arena (WhenFull::
// keep_in_memory), none in the host pool (PoolFull::keep_on_device), an input changed in place
// before it was written (restore refuses it), or a write that failed while the input was still
// here (its failure goes to the training thread's next call). failed:
// a write that failed after the input was released (io = gds releases it before the last
// piece is written); restore() throws the kept failure rather than read what never reached
// the region. The entry dies in failed.
//
// spilled goes to reading in the first half of its restore at the latest (begin_restore in
// stash_path.h), and straight to restored where nothing is read ahead: a RAM arena's view, a 0-byte
// input, an accelerator input larger than the pool (read in pieces), and io = gds (cuFile reads
// into the arena's staging buffer, copied into the new device tensor piece by piece, synchronously:
// Note [One registered staging buffer] in gds_path.cc). An io = gds input is copying until the
// progress thread takes it, then writing only while it holds the entry's mutex. copying and writing
// may also end in restored: backward reached a tensor whose bytes are still in memory (the input
// itself), so it is given back as it is; the copy or write finishes on its own and its pool block
// goes back then. An accelerator input in writing is no longer in memory (its device bytes were
// released when the copy finished): restore() waits for the write and reads it back; a CPU input in
// writing is still in memory and goes back as it is. So restore() is a switch on the state
// (Chain::restore in chain.cc); each path (SpillPath in stash_path.h) reads back its own, in two
// halves. Where each state's memory lives:
//   held, kept, copying  the input (device or CPU memory), counted in device_bytes_held
//   writing              accelerator: a pool block (io = gds: the staging buffer); CPU: the
//                        input, counted in host_bytes_in_flight
//   spilled              the region only
//   reading              accelerator: a pool block; CPU: a host buffer or the page cache
//   uploading            a pool block and the new device tensor (device_bytes_held)
// An entry destroyed in any state first frees its region after the region's I/O, then settles its
// path's state (PathState::settle: a copy still running) and destroys it, which returns a pool
// block (Note [A path and its state] in stash_path.h).

namespace {

bool allowed(State from, State to) {
  switch (from) {
    case State::held:
      return to == State::copying || to == State::writing || to == State::spilled ||
             to == State::kept || to == State::restored;
    case State::kept:
      return to == State::restored;
    case State::copying:
      return to == State::writing || to == State::restored;
    case State::writing:
      return to == State::spilled || to == State::kept || to == State::failed ||
             to == State::restored;
    case State::failed:
      return false;
    case State::spilled:
      return to == State::reading || to == State::restored;
    case State::reading:
      return to == State::uploading || to == State::restored;
    case State::uploading:
      return to == State::restored;
    case State::restored:
      return false;
  }
  return false;
}

}  // namespace

const char* to_string(State state) {
  static const char* const names[] = {"held",    "kept",    "copying",   "writing", "failed",
                                      "spilled", "reading", "uploading", "restored"};
  const auto i = static_cast<std::size_t>(state);
  return i < std::size(names) ? names[i] : "?";
}

void advance(Entry& e, State to) {
  if (!allowed(e.state, to)) {
    throw std::logic_error(std::string("spill: stashed tensor moved from ") + to_string(e.state) +
                           " to " + to_string(to) + "; see Note [Lifecycle of a stashed tensor]");
  }
  e.state = to;
}

void raise_to(std::atomic<std::uint64_t>& max, std::uint64_t value) {
  std::uint64_t seen = max.load();
  while (value > seen && !max.compare_exchange_weak(seen, value)) {
  }
}

void StashCounters::copy_to(StashStats& stats) const {
#define SPILL_COPY_STASH_COUNTER(name) stats.name = name.load();
#define SPILL_STASH_NOT_COUNTED(name)
  SPILL_STASH_STATS_FIELDS(SPILL_COPY_STASH_COUNTER, SPILL_STASH_NOT_COUNTED)
#undef SPILL_COPY_STASH_COUNTER
#undef SPILL_STASH_NOT_COUNTED
}

void StashCounters::record_spilled(bool layer_input) {
  (layer_input ? inputs_spilled : saved_tensors_spilled).fetch_add(1);
}

void StashCounters::add_device_bytes(std::uint64_t bytes) {
  raise_to(peak_device_bytes_held, device_bytes_held.fetch_add(bytes) + bytes);
}

void StashCounters::record_restore(bool prefetched, bool was_ready, std::uint64_t waited_ns) {
  restores.fetch_add(1);
  if (prefetched && was_ready) prefetch_hits.fetch_add(1);
  if (!was_ready) {
    restore_waits.fetch_add(1);
    restore_wait_ns.fetch_add(waited_ns);
  }
}

void StashCounters::add_in_flight(std::uint64_t bytes) {
  raise_to(peak_host_bytes_in_flight, host_bytes_in_flight.fetch_add(bytes) + bytes);
}

Entry::Entry(StashInput in, std::shared_ptr<StashCounters> c)
    : input(std::move(in.bytes)),
      device(input.device()),
      bytes(input.bytes()),
      accelerator(in.accelerator),
      layer_input(in.layer_input),
      engine(std::move(in.engine)),
      counters(std::move(c)),
      describe_(std::move(in.describe)),
      changed_in_place_(std::move(in.changed_in_place)) {
  (layer_input ? counters->inputs_stored : counters->saved_tensors_stored).fetch_add(1);
  if (accelerator) counters->add_device_bytes(bytes);
}

// The region first, after its I/O: a read ahead may still land in the path's state, settled and
// destroyed after it (a pool block goes back only then).
Entry::~Entry() {
  region.free();
  if (path_state) path_state->settle(*this);
  if (accelerator && input.defined()) counters->sub_device_bytes(bytes);
}

// The region goes back now, after a write still in flight completed (a short wait: it was
// queued before backward began), so the arena is drained when backward ends. A write in flight
// with the input still here is a write from the input itself (a CPU input's: input_still_here in
// chain.cc).
Buffer give_back_input(Entry& e) {
  if (e.accelerator) e.counters->sub_device_bytes(e.bytes);
  // Note [The device-held bound] in copy_window.cc: the step ran shorter than the copy
  if (e.state == State::copying) e.counters->inputs_back_before_copied.fetch_add(1);
  const bool write_in_flight = e.state == State::writing;
  e.region.free();  // after the write in flight, if any
  advance(e, State::restored);
  Buffer input = std::exchange(e.input, Buffer());
  if (!write_in_flight) return input;
  // Written all the same: counted as spilled (the CLI's "wrote N inputs" must match its bytes),
  // here rather than when the write completed, which finds the entry restored. A write that
  // failed fails the step as it would had backward come later (and read the region): whether a
  // full or failing disk is reported must not depend on how fast backward caught up with it.
  if (e.path_state) e.path_state->check_write();  // throws the write's spill::IoError
  e.counters->record_spilled(e.layer_input);
  return input;
}

void throw_modified(const Entry& e, const char* when) {
  throw CheckpointError(
      "spillarena: one of the variables needed for gradient computation "
      "has been modified by an inplace operation: the stashed " +
      e.describe() + " was changed " + when +
      "; clone it before changing it, or do not modify it in place");
}

}  // namespace spill::detail
