// The arena stash's accelerator path: device -> host pool -> region, and back. See Note [The
// host pool] in host_pool.cc, Note [Overlapped spilling] in arena_stash.cc and Note [Lifecycle
// of a stashed tensor] in stash_entry.cc.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <exception>
#include <utility>

#include "spill/error.h"
#include "stash_chain.h"

namespace spill::detail {
namespace {
constexpr std::uint64_t kGdsAlignmentBytes = 4096;  // cuFile's unit (GdsFile::kAlignmentBytes)

// `bytes` of `allocation` (at least one page longer) starting at a multiple of 4 KiB.
torch::Tensor aligned_part(const torch::Tensor& allocation, std::uint64_t bytes) {
  const auto address = reinterpret_cast<std::uintptr_t>(allocation.data_ptr());
  const std::uint64_t skip =
      (kGdsAlignmentBytes - address % kGdsAlignmentBytes) % kGdsAlignmentBytes;
  return allocation.narrow(0, static_cast<std::int64_t>(skip), static_cast<std::int64_t>(bytes));
}
}  // namespace

// take() gave up: a failure of the progress thread, rethrown here (or, if another thread took
// it first, named).
void Chain::throw_abandoned_wait() {
  rethrow_failure();
  throw IoError(EIO,
                "spill::checkpoint: the wait for room in the host pool ended on a failure "
                "already reported by another call; free the step's graph and run again");
}

// The arena's host_pool_bytes, or room for prefetch_depth + 2 inputs like `e`.
std::uint64_t Chain::host_budget(const Entry& e) const {
  return arena_options_.host_pool_bytes != kAutomaticHostPool
             ? arena_options_.host_pool_bytes
             : automatic_host_pool_bytes(e.bytes, options_.prefetch_depth + 2ull);
}

HostPool& Chain::pool_for(const Entry& e) {
  MutexLock lock(shared_->mutex);
  std::shared_ptr<HostPool>& pool = shared_->pool;
  if (!pool) pool = HostPool::make(host_budget(e), e.options.device().type());
  return *pool;
}

// PoolFull::wait: waits for the oldest write to return its block (the progress thread always
// does). PoolFull::keep_on_device: nothing when there is no room now.
std::optional<HostPool::Lease> Chain::lease_for_store(Entry& e, HostPool& pool) {
  if (arena_options_.when_pool_full == PoolFull::keep_on_device) return pool.try_take(e.bytes);
  HostPool::Lease lease = pool.take(e.bytes, [this] { return failed(); });
  if (!lease) throw_abandoned_wait();
  return lease;
}

void Chain::spill_device(const EntryPtr& e) {
  if (through_gds(*e)) return spill_gds(e);
  HostPool& pool = pool_for(*e);
  if (e->bytes > pool.largest_piece()) return spill_in_pieces(*e, pool);
  std::optional<HostPool::Lease> lease = lease_for_store(*e, pool);
  if (!lease) {
    e->kept = true;
    e->region.free();
    counters_->inputs_kept_on_device.fetch_add(1);
    counters_->bytes_kept_on_device.fetch_add(e->bytes);
    return;
  }
  e->piece.bytes = e->bytes;
  e->piece.lease = std::move(*lease);
  e->piece.copy = e->engine->to_host(e->input, 0, e->bytes, e->piece.lease.host());
  advance(*e, State::copying);
  if (options_.asynchronous) {
    return progress_.post([this, e] { after_copy(e, &Chain::finish_copy_locked); });
  }
  e->piece.copy->synchronize();
  finish_copy_locked(e);
}

// An input larger than the pool goes through it piece by piece, synchronously: each piece is
// copied, written and waited for before the next takes the block.
void Chain::spill_in_pieces(Entry& e, HostPool& pool) {
  counters_->pieces.fetch_add(1);
  const std::uint64_t step = pool.largest_piece();
  for (std::uint64_t offset = 0; offset < e.bytes; offset += step) {
    const std::uint64_t n = std::min(step, e.bytes - offset);
    HostPool::Lease lease = pool.take(n, [this] { return failed(); });
    if (!lease) throw_abandoned_wait();
    e.engine->to_host(e.input, offset, n, lease.host())->synchronize();
    e.region.write_async(lease.host().data_ptr(), n, offset).wait();
  }
  e.input = torch::Tensor();
  counters_->sub_device_bytes(e.bytes);
  advance(e, State::writing);
  advance(e, State::spilled);
  counters_->inputs_spilled.fetch_add(1);
}

// On the progress thread: waits for e's copy (or stream marker) without holding its mutex, then
// runs `next` under it; a failure is kept for the training thread.
void Chain::after_copy(const EntryPtr& e, void (Chain::*next)(const EntryPtr&)) {
  CopyPtr copy;
  {
    MutexLock lock(e->mutex);
    copy = e->piece.copy;
  }
  try {
    if (copy) copy->synchronize();
    MutexLock lock(e->mutex);
    (this->*next)(e);
  } catch (...) {
    record_failure(std::current_exception());
  }
}

void Chain::finish_copy_locked(const EntryPtr& e) {
  if (e->state != State::copying) {  // restored meanwhile: the input went back as it was
    e->piece = Piece();
    return;
  }
  e->piece.io = e->region.write_async(e->piece.lease.host().data_ptr(), e->bytes);
  e->input = torch::Tensor();
  counters_->sub_device_bytes(e->bytes);
  e->piece.copy.reset();
  advance(*e, State::writing);
  if (options_.asynchronous) return progress_.post([this, e] { finish_device_write(e); });
  e->piece.io.wait();
  finish_device_write_locked(*e);
}

// On the progress thread: the write is done (or failed: the region's next read reports it), so
// the pool block goes back.
void Chain::finish_device_write(const EntryPtr& e) {
  Pending write;
  {
    MutexLock lock(e->mutex);
    write = e->piece.io;
  }
  write.settle();
  MutexLock lock(e->mutex);
  finish_device_write_locked(*e);
}

void Chain::finish_device_write_locked(Entry& e) {
  if (e.state != State::writing) return;
  e.piece = Piece();
  advance(e, State::spilled);
  counters_->inputs_spilled.fetch_add(1);
}

// A read into the pool. Prefetches (wait_for_room false) take a block only when room for the
// largest input remains, so the restore that needs one next always finds it.
void Chain::queue_device_read(Entry& e, bool wait_for_room) {
  if (e.state != State::spilled || !e.region.valid()) return;
  HostPool& pool = pool_for(e);
  if (e.bytes > pool.largest_piece()) return;  // in pieces, at restore
  HostPool::Lease lease;
  if (wait_for_room) {
    lease = pool.take(e.bytes, [this] { return failed(); });
    if (!lease) throw_abandoned_wait();
  } else {
    std::uint64_t reserve = 0;
    {
      MutexLock lock(mutex_);
      reserve = largest_input_;
    }
    std::optional<HostPool::Lease> room = pool.try_take(e.bytes, reserve);
    if (!room) return;
    lease = std::move(*room);
  }
  e.piece = Piece();
  e.piece.bytes = e.bytes;
  e.piece.lease = std::move(lease);
  e.piece.io = e.region.read_async(e.piece.lease.host().data_ptr(), e.bytes);
  advance(e, State::reading);
}

// The read is done: host -> device into a new tensor. The block goes back (on the progress
// thread) as soon as that copy completed; a failed read is left for restore() to report.
void Chain::start_upload(Entry& e) {
  try {
    e.piece.io.wait();
  } catch (const std::exception&) {
    return;
  }
  torch::Tensor result = device_tensor(e);
  CopyPtr upload = e.engine->to_device(e.piece.lease.host(), result, 0);
  e.result = std::move(result);
  e.upload = std::move(upload);
  counters_->add_device_bytes(e.bytes);
  auto piece = std::make_shared<Piece>(std::move(e.piece));
  piece->copy = e.upload;
  e.piece = Piece();
  advance(e, State::uploading);
  post([piece]() mutable { piece.reset(); });  // waits for the copy, then returns the block
}

// Ahead of backward, an upload that cannot start (the device is out of memory) is left for
// restore(), which then reports it.
void Chain::upload_if_read(Entry& e) {
  if (e.state != State::reading || !e.piece.io.ready()) return;
  try {
    start_upload(e);
  } catch (const c10::Error&) {
  }
}

// Out of device memory, LibTorch's own error type (trainers catch it to lower the batch size),
// saying what the stash was doing and what to change. The entry keeps its bytes: when the
// failed backward's graph dies, so do its region and pool block.
torch::Tensor Chain::device_tensor(const Entry& e) const {
  try {
    return e.engine->empty(e.sizes, e.options);
  } catch (const c10::OutOfMemoryError& x) {
    TORCH_CHECK_WITH(
        OutOfMemoryError, false, "spill::checkpoint: no device memory to restore the stashed ",
        e.describe(), " with prefetch_depth ", options_.prefetch_depth, " (",
        x.what_without_backtrace(),
        "); lower StashOptions::prefetch_depth, the batch size or the sequence length");
  }
}

torch::Tensor Chain::finish_device_restore(Entry& e) {
  if (!e.region.valid()) {
    advance(e, State::restored);
    return device_tensor(e);
  }
  if (e.state == State::reading) {
    e.piece.io.wait();  // IoError, IntegrityError
    start_upload(e);
  }
  e.upload->order_current_stream();
  e.upload.reset();
  e.region.free();
  counters_->sub_device_bytes(e.bytes);
  advance(e, State::restored);
  return std::exchange(e.result, torch::Tensor());
}

torch::Tensor Chain::restore_in_pieces(Entry& e, HostPool& pool) {
  counters_->pieces.fetch_add(1);
  torch::Tensor result = device_tensor(e);
  const std::uint64_t step = pool.largest_piece();
  for (std::uint64_t offset = 0; offset < e.bytes; offset += step) {
    const std::uint64_t n = std::min(step, e.bytes - offset);
    HostPool::Lease lease = pool.take(n, [this] { return failed(); });
    if (!lease) throw_abandoned_wait();
    e.region.read_async(lease.host().data_ptr(), n, offset).wait();
    e.engine->to_device(lease.host(), result, offset)->synchronize();
  }
  e.region.free();
  advance(e, State::restored);
  return result;
}

// ---------------------------------------------------------------------------------------------
// io = gds: see Note [GPUDirect Storage] in src/core/gds.cc
// ---------------------------------------------------------------------------------------------

// Note [One registered staging buffer]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// cuFile moves registered device memory directly (cuFileBufRegister pins its BAR1 mapping once,
// at a cost of milliseconds); other memory goes through bounce buffers of cuFile's own (Note
// [cuFile's bounce buffers] in src/core/gds.cc). Layer inputs are blocks of the caching
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
// failure in the entry (gds_write_failure): restore() throws it rather than read the region.
// The tail of fewer than 4 KiB goes through host memory (tails and cuFile's unit: Note
// [GPUDirect Storage]).
//
// The buffer is made with the stash's host budget known, so cuFile's bounce buffers are capped
// to it then (GdsDriver::limit_bounce_bytes): in io = gds the host pool is never made (no input
// goes through it), so they and the sub-page tails are what the host budget holds.

GdsStaging::GdsStaging(CopyEngine& engine, const torch::Device& device, std::uint64_t bytes,
                       std::shared_ptr<GdsDriver> driver)
    : allocation_(engine.empty({static_cast<std::int64_t>(bytes + kGdsAlignmentBytes)},
                               torch::TensorOptions().dtype(torch::kUInt8).device(device))),
      memory_(aligned_part(allocation_, bytes)) {
  try {
    registration_ = std::make_unique<GdsRegistration>(std::move(driver), data(), bytes);
  } catch (const IoError&) {
    // Unregistered: cuFile bounces the transfers (see the Note above).
  }
}

torch::Tensor GdsStaging::first(std::uint64_t bytes) const {
  return memory_.narrow(0, 0, static_cast<std::int64_t>(bytes));
}

// Made once per arena, on the training thread at its first io = gds spill, on that input's
// device; cuFile's bounce buffers are capped to the host budget then.
GdsStaging& Chain::staging_for(const Entry& e) {
  MutexLock lock(shared_->mutex);
  if (!shared_->gds_staging) {
    std::shared_ptr<GdsDriver> driver = GdsDriver::shared();  // the arena's session
    const std::uint64_t asked = options_.gds_buffer_bytes;    // rounded up, without overflow
    const std::uint64_t pages = std::max<std::uint64_t>(
        asked / kGdsAlignmentBytes + (asked % kGdsAlignmentBytes != 0 ? 1 : 0), 1);
    shared_->gds_staging = std::make_shared<GdsStaging>(*e.engine, e.options.device(),
                                                        pages * kGdsAlignmentBytes, driver);
    driver->limit_bounce_bytes(host_budget(e));
    shared_->cufile = std::move(driver);
  }
  return *shared_->gds_staging;
}

// cuFile reads device memory outside any stream, and the copy into the staging buffer is queued
// on the progress thread, whose current stream is not the training thread's: so the progress
// thread first waits for the work queued so far on this thread's current stream (then the input
// is complete).
void Chain::spill_gds(const EntryPtr& e) {
  staging_for(*e);  // made, and cuFile's bounce buffers capped, at the arena's first gds spill
  e->piece.copy = e->engine->marker(e->input.device());
  advance(*e, State::copying);
  if (options_.asynchronous) {
    return progress_.post([this, e] { after_copy(e, &Chain::finish_gds_write_locked); });
  }
  e->piece.copy->synchronize();
  finish_gds_write_locked(e);
}

void Chain::finish_gds_write_locked(const EntryPtr& e) {
  if (e->state != State::copying) {  // restored meanwhile
    e->piece = Piece();
    return;
  }
  e->piece = Piece();
  advance(*e, State::writing);
  try {
    write_through_staging(*e);
  } catch (...) {
    if (!e->input.defined()) e->gds_write_failure = std::current_exception();
    throw;  // asynchronous: kept for the training thread's next store() or restore()
  }
  advance(*e, State::spilled);
  counters_->inputs_spilled.fetch_add(1);
}

// The tail first (a small pageable buffer: this thread never waits for the pool), then the body
// piece by piece; the input goes once its last piece is in the staging buffer.
void Chain::write_through_staging(Entry& e) {
  const std::uint64_t body = e.bytes / kGdsAlignmentBytes * kGdsAlignmentBytes;
  if (body < e.bytes) {
    torch::Tensor tail = torch::empty({static_cast<std::int64_t>(e.bytes - body)},
                                      torch::TensorOptions().dtype(torch::kUInt8));
    e.engine->to_host(e.input, body, e.bytes - body, tail)->synchronize();
    e.region.write_async(tail.data_ptr(), e.bytes - body, body).wait();
  }
  if (body == 0) return release_input(e);
  GdsStaging& staging = staging_for(e);
  MutexLock lock(staging.mutex);
  for (std::uint64_t offset = 0; offset < body; offset += staging.bytes()) {
    const std::uint64_t n = std::min(staging.bytes(), body - offset);
    e.engine->to_host(e.input, offset, n, staging.first(n))->synchronize();
    if (offset + n == body) release_input(e);
    e.region.write_from_device(staging.data(), n, offset);
    counters_->cufile_bytes_written.fetch_add(n);
  }
}

void Chain::release_input(Entry& e) {
  e.input = torch::Tensor();
  counters_->sub_device_bytes(e.bytes);
}

// cuFile reads into the staging buffer, which only copies the host waited for touch; each piece
// is then copied into the new tensor, ordered after the current stream (where the tensor was
// allocated), and waited for before the buffer takes the next.
torch::Tensor Chain::restore_gds(Entry& e) {
  if (e.gds_write_failure) std::rethrow_exception(e.gds_write_failure);
  torch::Tensor result = device_tensor(e);
  const std::uint64_t body = e.bytes / kGdsAlignmentBytes * kGdsAlignmentBytes;
  if (body > 0) {
    GdsStaging& staging = staging_for(e);
    MutexLock lock(staging.mutex);
    for (std::uint64_t offset = 0; offset < body; offset += staging.bytes()) {
      const std::uint64_t n = std::min(staging.bytes(), body - offset);
      e.region.read_to_device(staging.data(), n, offset);
      counters_->cufile_bytes_read.fetch_add(n);
      e.engine->to_device(staging.first(n), result, offset)->synchronize();
    }
  }
  if (body < e.bytes) {
    torch::Tensor tail = torch::empty({static_cast<std::int64_t>(e.bytes - body)},
                                      torch::TensorOptions().dtype(torch::kUInt8));
    e.region.read_async(tail.data_ptr(), e.bytes - body, body).wait();
    e.engine->to_device(tail, result, body)->synchronize();
  }
  e.region.free();
  advance(e, State::restored);
  return result;
}

}  // namespace spill::detail
