#include "stash_entry.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <string>

namespace spill::detail {

// Note [Lifecycle of a stashed tensor]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each stored tensor is in exactly one State; advance() is the one place it changes, and it
// refuses what the diagram does not draw:
//
//            ┌──────────────────────────────── restore() of an unspilled input ─────────┐
//   held ──▶ copying ──▶ writing ──▶ spilled ──▶ reading ──▶ uploading ──▶ restored ◀───┘
//     │    (accelerator)    ▲            ▲           │       (accelerator)      ▲
//     └──── CPU input ──────┘            │           └──────── CPU input ───────┘
//                                        └── a 0-byte input: nothing to write
//
// spilled goes straight to restored where a restore reads nothing into the pool: a 0-byte input,
// and io = gds (cuFile reads into the arena's staging buffer, copied into the new device tensor
// piece by piece, synchronously: Note [One registered staging buffer] in device_spill.cc). An
// io = gds input is copying until the progress thread takes it, then writing only while it holds
// the entry's mutex; one left in writing failed (its failure kept for restore(), unless the input
// was still there to give back).
// copying and writing may also end in restored: backward reached a tensor whose bytes are still
// in memory (the input itself), so it is given back as it is; the copy or write finishes on its
// own and its pool block goes back then. An accelerator input in writing is no longer in memory
// (its device bytes were released when the copy finished): restore() waits for the write and
// reads it back. Where each state's memory lives:
//   held, copying      the input (device or CPU memory), counted in device_bytes_held
//   writing            accelerator: a pool block (io = gds: the staging buffer); CPU: the input,
//                      counted in host_bytes_in_flight
//   spilled            the region only
//   reading            accelerator: a pool block; CPU: a host buffer or the page cache
//   uploading          a pool block and the new device tensor (device_bytes_held)
// An entry destroyed in any state first waits for its copy and its I/O, then returns its pool
// block and its region (Piece, Region).

namespace {

bool allowed(State from, State to) {
  switch (from) {
    case State::held:
      return to == State::copying || to == State::writing || to == State::spilled ||
             to == State::restored;
    case State::copying:
      return to == State::writing || to == State::restored;
    case State::writing:
      return to == State::spilled || to == State::restored;
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

void raise_peak(std::atomic<std::uint64_t>& peak, std::uint64_t now) {
  std::uint64_t seen = peak.load();
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
}

}  // namespace

const char* to_string(State state) {
  static const char* const names[] = {"held",    "copying",   "writing", "spilled",
                                      "reading", "uploading", "restored"};
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

void StashCounters::add_device_bytes(std::uint64_t bytes) {
  raise_peak(peak_device_bytes_held, device_bytes_held.fetch_add(bytes) + bytes);
}

torch::Tensor Entry::in_stored_layout(const torch::Tensor& restored) const {
  if (strides.empty() || !restored.defined()) return restored;
  return torch::empty_strided(sizes, strides, restored.options()).copy_(restored);
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
  raise_peak(peak_host_bytes_in_flight, host_bytes_in_flight.fetch_add(bytes) + bytes);
}

void Piece::settle() const noexcept {
  io.settle();
  try {
    if (copy) copy->synchronize();
  } catch (...) {
    // A device error: reported by whatever uses the device next; a destructor cannot throw.
  }
}

Entry::Entry(const torch::Tensor& t, std::shared_ptr<StashCounters> c)
    : input(t.detach().contiguous()),
      // The caller's counter (detach() shares it; contiguous() of a strided input would not).
      version_counter(t.unsafeGetTensorImpl()->version_counter()),
      version(version_counter.current_version()),
      sizes(t.sizes().vec()),
      strides(!t.is_contiguous() && t.is_non_overlapping_and_dense() ? t.strides().vec()
                                                                     : std::vector<int64_t>()),
      options(t.options()),
      bytes(static_cast<std::uint64_t>(t.nbytes())),
      accelerator(CopyEngine::is_accelerator_input(t)),
      engine(accelerator ? CopyEngine::for_inputs() : nullptr),
      counters(std::move(c)) {
  counters->inputs_stored.fetch_add(1);
  if (accelerator) counters->add_device_bytes(bytes);
}

// Device bytes still referenced here go with the entry (a graph freed without backward).
Entry::~Entry() {
  read.settle();  // a direct read may still land in `host`, destroyed before `region`
  write.settle();
  piece.settle();
  if (accelerator && input.defined()) counters->sub_device_bytes(bytes);
  if (result.defined()) counters->sub_device_bytes(bytes);
}

std::string Entry::describe() const {
  std::ostringstream text;
  text << "layer input of shape " << c10::IntArrayRef(sizes) << ", dtype " << options.dtype()
       << ", " << bytes << " bytes";
  return text.str();
}

}  // namespace spill::detail
