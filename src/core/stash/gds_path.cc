// The arena stash's io = gds path: device memory to the file through cuFile, by way of the
// arena's registered staging buffer. Keyed on the entry, not its device: accelerator inputs (CPU
// tensors too under the copy seam's emulation) take it, CPU inputs the CPU path. See Note
// [GPUDirect Storage] in src/core/io/gds.cc.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "core/arena/arena_internals.h"
#include "spill/error.h"
#include "stash_path.h"

namespace spill::detail {
namespace {
constexpr std::uint64_t kGdsAlignmentBytes = 4096;  // cuFile's unit (GdsFile::kAlignmentBytes)

// `bytes` of `allocation` (at least one page longer) starting at a multiple of 4 KiB.
Buffer aligned_part(const Buffer& allocation, std::uint64_t bytes) {
  const auto address = reinterpret_cast<std::uintptr_t>(allocation.data());
  const std::uint64_t skip =
      (kGdsAlignmentBytes - address % kGdsAlignmentBytes) % kGdsAlignmentBytes;
  return allocation.slice(skip, bytes);
}

// Note [One registered staging buffer]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// cuFile moves registered device memory directly (cuFileBufRegister pins its BAR1 mapping once,
// at a cost of milliseconds); other memory goes through bounce buffers of cuFile's own (Note
// [cuFile's bounce buffers] in src/core/io/gds.cc). Layer inputs are blocks of the caching
// allocator, which hands a block to the next tensor, or cudaFrees it, once the stash lets go:
// registering inputs would pin memory the stash does not own, once per input. So each arena has
// one staging buffer in device memory (StashOptions::gds_buffer_bytes, 4 KiB aligned), made on
// the first input's device at the first io = gds spill, registered then, reused by every step
// of every stash of the arena, and deregistered before it is freed with the arena (GdsStaging;
// its registration is its last member). A registration cuFile refuses leaves it unregistered:
// transfers still work, through cuFile's bounce buffers (gds_buffer_registered says which).
//
// Every transfer goes through it, one at a time (its mutex, held from the first copy to the last
// cuFile call): a spill copies a piece of the input into it (device to device, through the copy
// seam: to_host with the buffer as the destination) and writes it with cuFileWrite; a restore
// reads a piece into it with cuFileRead and copies it into the new tensor (to_device). Inputs
// larger than the buffer go piece by piece. The host waits for each copy before cuFile touches
// the buffer, so cuFile, which ignores streams, never races a copy. The input is released as
// soon as the copy of its last piece completed, before that piece is written, as the host pool's
// path releases it when its device -> host copy completed: device memory beyond the inputs is
// the buffer, bounded and reported (gds_buffer_bytes). A write that fails after that keeps its
// failure in the entry (the entry's `failure`, in State::failed): restore() throws it rather than
// read the region. The tail of fewer than 4 KiB goes through host memory (tails and cuFile's unit:
// Note [GPUDirect Storage]).
//
// The buffer is made with the stash's host budget known, so cuFile's bounce buffers are capped
// to it then (GdsDriver::limit_bounce_bytes): in io = gds the host pool is never made (no input
// goes through it), so they and the sub-page tails are what the host budget holds.

// What the io = gds path keeps of an entry (Note [A path and its state] in stash_path.h): the
// marker its write waits for.
struct GdsState final : PathState {
  CopyPtr marker;
  void settle(const Entry&) noexcept override { settle_copy(marker); }
};

class GdsPath final : public SpillPath {
 public:
  GdsPath(StashContext& context, Progress& progress)
      : SpillPath(context, progress), gds_(uses_gds(context.arena)) {}

  // Accelerator inputs, where the arena asks for io = gds.
  bool takes(const Entry& e) const override { return gds_ && e.accelerator; }

  // spill: through the staging buffer and cuFile; prefetch and begin_restore: nothing (restores
  // read synchronously, never ready ahead); finish_restore: cuFile into the staging buffer,
  // copied piece by piece.
  void spill(const EntryPtr& e) override REQUIRES(e->mutex);
  void prefetch(Entry&) override {}
  bool begin_restore(Entry&) override { return false; }
  Buffer finish_restore(Entry& e) override REQUIRES(e.mutex);

 private:
  GdsStaging& staging_for(const Entry& e);
  void write(const EntryPtr& e) REQUIRES(e->mutex);
  void write_through_staging(Entry& e) REQUIRES(e.mutex);
  void release_input(Entry& e) REQUIRES(e.mutex);

  const bool gds_;  // the arena's io is gds
};

// Made once per arena, on the training thread at its first io = gds spill, on that input's
// device; cuFile's bounce buffers are capped to the host budget then (GdsResources::get_or_make,
// outside its mutex, as the host pool is made).
GdsStaging& GdsPath::staging_for(const Entry& e) {
  const std::uint64_t asked = context_.options.gds_buffer_bytes;  // rounded up, no overflow
  const std::uint64_t pages = std::max<std::uint64_t>(
      asked / kGdsAlignmentBytes + (asked % kGdsAlignmentBytes != 0 ? 1 : 0), 1);
  return context_.shared->gds.get_or_make(*e.engine, e.device, pages * kGdsAlignmentBytes,
                                          [&] { return context_.host_budget(e.bytes); });
}

// cuFile reads device memory outside any stream, and the copy into the staging buffer is queued
// on the progress thread, whose current stream is not the training thread's: so the progress
// thread first waits for the work queued so far on this thread's current stream (then the input
// is complete).
void GdsPath::spill(const EntryPtr& e) {
  e->region = context_.region_for(*e);
  if (!e->region) return advance(*e, State::kept);
  staging_for(*e);  // made, and cuFile's bounce buffers capped, at the arena's first gds spill
  CopyPtr& marker = state_of<GdsState>(*e).marker;
  marker = e->engine->marker(e->device);
  advance(*e, State::copying);
  progress_.when_copied(e, marker, [this](const EntryPtr& x) NO_THREAD_SAFETY_ANALYSIS {
    write(x);  // under x->mutex (when_copied)
  });
}

// A failure with the input still here keeps it (kept: backward gets it back); after the input
// went, the entry is failed and restore() throws it. Either way it is thrown on: asynchronous,
// kept for the training thread's next store() or restore().
void GdsPath::write(const EntryPtr& e) {
  state_of<GdsState>(*e).marker.reset();   // completed (when_copied)
  if (e->state != State::copying) return;  // restored meanwhile
  advance(*e, State::writing);
  try {
    write_through_staging(*e);
  } catch (...) {
    e->failure = std::current_exception();
    advance(*e, e->input.defined() ? State::kept : State::failed);
    throw;
  }
  advance(*e, State::spilled);
  context_.counters->record_spilled(e->layer_input);
}

// The tail first (a small pageable buffer: this thread never waits for the pool), then the body
// piece by piece; the input goes once its last piece is in the staging buffer.
void GdsPath::write_through_staging(Entry& e) {
  const std::uint64_t body = e.bytes / kGdsAlignmentBytes * kGdsAlignmentBytes;
  if (body < e.bytes) {
    Buffer tail = Buffer::host(e.bytes - body, kGdsAlignmentBytes);
    e.engine->to_host(e.input, body, e.bytes - body, tail)->synchronize();
    e.region.write_async(tail.data(), e.bytes - body, body).wait();
  }
  if (body == 0) return release_input(e);
  GdsStaging& staging = staging_for(e);
  MutexLock lock(staging.mutex);
  for (std::uint64_t offset = 0; offset < body; offset += staging.bytes()) {
    const std::uint64_t n = std::min(staging.bytes(), body - offset);
    e.engine->to_host(e.input, offset, n, staging.first(n))->synchronize();
    if (offset + n == body) release_input(e);
    write_from_device(e.region, staging.data(), n, offset);
    context_.counters->cufile_bytes_written.fetch_add(n);
  }
}

void GdsPath::release_input(Entry& e) {
  e.input = Buffer();
  context_.counters->sub_device_bytes(e.bytes);
}

// cuFile reads into the staging buffer, which only copies the host waited for touch; each piece
// is then copied into the new tensor, ordered after the current stream (where the tensor was
// allocated), and waited for before the buffer takes the next.
Buffer GdsPath::finish_restore(Entry& e) {
  Buffer result = device_buffer(e, context_.options.prefetch_depth);
  if (!e.region) {  // 0 bytes
    advance(e, State::restored);
    return result;
  }
  const std::uint64_t body = e.bytes / kGdsAlignmentBytes * kGdsAlignmentBytes;
  if (body > 0) {
    GdsStaging& staging = staging_for(e);
    MutexLock lock(staging.mutex);
    for (std::uint64_t offset = 0; offset < body; offset += staging.bytes()) {
      const std::uint64_t n = std::min(staging.bytes(), body - offset);
      read_to_device(e.region, staging.data(), n, offset);
      context_.counters->cufile_bytes_read.fetch_add(n);
      e.engine->to_device(staging.first(n), result, offset)->synchronize();
    }
  }
  if (body < e.bytes) {
    Buffer tail = Buffer::host(e.bytes - body, kGdsAlignmentBytes);
    e.region.read_async(tail.data(), e.bytes - body, body).wait();
    e.engine->to_device(tail, result, body)->synchronize();
  }
  e.region.free();
  advance(e, State::restored);
  return result;
}

}  // namespace

GdsStaging::GdsStaging(CopyEngine& engine, const Device& device, std::uint64_t bytes,
                       std::shared_ptr<GdsDriver> driver)
    : memory_(aligned_part(engine.empty(device, bytes + kGdsAlignmentBytes,
                                        [bytes](const std::string& cause) {
                                          return "spill: no device memory for the io = gds "
                                                 "staging buffer of " +
                                                 std::to_string(bytes) + " bytes (" + cause +
                                                 "); lower StashOptions::gds_buffer_bytes";
                                        }),
                           bytes)) {
  try {
    registration_ = std::make_unique<GdsRegistration>(std::move(driver), data(), bytes);
  } catch (const IoError&) {
    // Unregistered: cuFile bounces the transfers (see the Note above).
  }
}

std::unique_ptr<SpillPath> make_gds_path(StashContext& context, Progress& progress) {
  return std::make_unique<GdsPath>(context, progress);
}

}  // namespace spill::detail
