// The arena stash's accelerator path: device -> host pool -> region, and back. See Note [The
// host pool] in host_pool.cc, Note [Overlapped spilling] in chain.cc and Note [Lifecycle
// of a stashed tensor] in stash_entry.cc.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "copy_window.h"
#include "host_pool.h"
#include "spill/error.h"
#include "stash_path.h"

namespace spill::detail {
namespace {

// One piece of an accelerator input's movement through the pool: normally the whole input.
struct Piece {
  std::uint64_t offset = 0;  // in the input and in its region
  std::uint64_t bytes = 0;
  HostPool::Lease lease;  // declared first: returned to the pool after copy and io finished
  CopyPtr copy;
  Pending io;
  Piece() = default;
  Piece(Piece&&) = default;
  Piece& operator=(Piece&& other) noexcept {  // the old block goes back only once settled
    settle();
    lease = std::move(other.lease);
    copy = std::move(other.copy);
    io = std::move(other.io);
    return *this;
  }
  ~Piece() { settle(); }
  // Waits for the write or read, then the copy; never throws.
  void settle() const noexcept {
    io.settle();
    settle_copy(copy);
  }
};

// What the host pool's path keeps of an entry (Note [A path and its state] in stash_path.h).
struct DeviceState final : PathState {
  Piece piece;  // its pool block, copy and write or read
  // The device buffer being filled (uploading) and the copy filling it (its pool block goes
  // back on its own).
  Buffer result;
  CopyPtr upload;
  // The piece's copy (its I/O completed with the region); a restore never taken gives back its
  // device bytes. The pool block goes back when the state is destroyed.
  void settle(const Entry& e) noexcept override {
    piece.settle();
    if (result.defined()) e.counters->sub_device_bytes(e.bytes);
  }
};

class DevicePath final : public SpillPath {
 public:
  using SpillPath::SpillPath;

  // Every accelerator input io = gds (listed before this path) leaves.
  bool takes(const Entry& e) const override { return e.accelerator; }

  // spill: copied into a pool block, which is written; prefetch: a read into a free pool block,
  // then the upload; begin_restore: the read into the pool (waiting for room); finish_restore:
  // the wait, then the upload; large inputs in pieces, all at finish_restore.
  void spill(const EntryPtr& e) override REQUIRES(e->mutex);
  void prefetch(Entry& e) override REQUIRES(e.mutex);
  bool begin_restore(Entry& e) override REQUIRES(e.mutex);
  Buffer finish_restore(Entry& e) override REQUIRES(e.mutex);
  void wait_for_copies(std::uint64_t most) override;

 private:
  std::shared_ptr<HostPool> pool_for(const Entry& e);
  HostPool::Lease take(HostPool& pool, std::uint64_t bytes);
  void keep(Entry& e) REQUIRES(e.mutex);
  void spill_in_pieces(Entry& e, HostPool& pool) REQUIRES(e.mutex);
  void finish_copy(const EntryPtr& e) REQUIRES(e->mutex);
  void finish_write(const EntryPtr& e) EXCLUDES(e->mutex);
  void finish_write_locked(Entry& e) REQUIRES(e.mutex);
  void queue_read(Entry& e, bool wait_for_room) REQUIRES(e.mutex);
  void start_upload(Entry& e) REQUIRES(e.mutex);
  Buffer restore_in_pieces(Entry& e, HostPool& pool) REQUIRES(e.mutex);

  CopyWindow copies_;  // copying entries: Note [The device-held bound] in copy_window.cc
};

// The arena's pool, made at its first accelerator input with the stash's host budget for it
// (HostPoolOwner::get_or_make, outside the owner's mutex); an automatic one grows between steps
// whose store()s waited for room (Note [A pool sized from what the disk does] in host_pool.cc).
std::shared_ptr<HostPool> DevicePath::pool_for(const Entry& e) {
  const bool automatic = context_.arena_options.host_pool_bytes == kAutomaticHostPool;
  return context_.shared->host_pool.get_or_make([&] { return context_.host_budget(e.bytes); },
                                                e.engine.get(), automatic);
}

// Waits for the oldest write to return its block (the progress thread always does).
HostPool::Lease DevicePath::take(HostPool& pool, std::uint64_t bytes) {
  HostPool::Lease lease = pool.take(bytes, [this] { return progress_.failed(); });
  if (!lease) progress_.throw_abandoned_wait();
  return lease;
}

// No room in the host pool with PoolFull::keep_on_device: the input stays on its device.
void DevicePath::keep(Entry& e) {
  e.region.free();
  context_.counters->inputs_kept_on_device.fetch_add(1);
  context_.counters->bytes_kept_on_device.fetch_add(e.bytes);
  advance(e, State::kept);
}

void DevicePath::spill(const EntryPtr& e) {
  e->region = context_.region_for(*e);
  if (!e->region) return advance(*e, State::kept);
  const std::shared_ptr<HostPool> held = pool_for(*e);
  HostPool& pool = *held;
  if (e->bytes > pool.largest_piece()) return spill_in_pieces(*e, pool);
  std::optional<HostPool::Lease> lease;
  if (context_.arena_options.when_pool_full == PoolFull::keep_on_device) {
    lease = pool.try_take(e->bytes);
  } else {
    lease = take(pool, e->bytes);
  }
  if (!lease) return keep(*e);
  Piece& piece = state_of<DeviceState>(*e).piece;
  piece.bytes = e->bytes;
  piece.lease = std::move(*lease);
  piece.copy = e->engine->to_host(e->input, 0, e->bytes, piece.lease.host());
  advance(*e, State::copying);
  // Closed when the job is gone, after finish_copy, or when the copy failed
  auto slot = std::make_shared<CopyWindow::Slot>(copies_);
  progress_.when_copied(e, piece.copy, [this, slot](const EntryPtr& x) NO_THREAD_SAFETY_ANALYSIS {
    finish_copy(x);  // under x->mutex (when_copied)
  });
}

// On the training thread, in store(): the oldest copies complete and the progress thread releases
// their inputs (Note [The device-held bound] in copy_window.cc).
void DevicePath::wait_for_copies(std::uint64_t most) {
  StashCounters& c = *context_.counters;
  if (!copies_.wait_until_at_most(
          most, [this] { return progress_.failed(); }, c.copy_waits, c.copy_wait_ns)) {
    progress_.throw_abandoned_wait();
  }
}

// An input larger than the pool goes through it piece by piece, synchronously: each piece is
// copied, written and waited for before the next takes the block.
void DevicePath::spill_in_pieces(Entry& e, HostPool& pool) {
  context_.counters->pieces.fetch_add(1);
  const std::uint64_t step = pool.largest_piece();
  for (std::uint64_t offset = 0; offset < e.bytes; offset += step) {
    const std::uint64_t n = std::min(step, e.bytes - offset);
    HostPool::Lease lease = take(pool, n);
    e.engine->to_host(e.input, offset, n, lease.host())->synchronize();
    e.region.write_async(lease.host().data(), n, offset).wait();
  }
  e.input = Buffer();
  context_.counters->sub_device_bytes(e.bytes);
  advance(e, State::writing);
  advance(e, State::spilled);
  context_.counters->record_spilled(e.layer_input);
}

// The copy is done: the write from the pool block is queued and the device input released.
void DevicePath::finish_copy(const EntryPtr& e) {
  Piece& piece = state_of<DeviceState>(*e).piece;
  if (e->state != State::copying) {  // restored meanwhile: the input went back as it was
    piece = Piece();
    return;
  }
  piece.io = e->region.write_async(piece.lease.host().data(), e->bytes);
  e->input = Buffer();
  context_.counters->sub_device_bytes(e->bytes);
  piece.copy.reset();
  advance(*e, State::writing);
  if (!progress_.asynchronous()) {
    piece.io.wait();
    return finish_write_locked(*e);
  }
  progress_.post([this, e] { finish_write(e); });
}

// On the progress thread: the write is done (or failed: the region's next read reports it), so
// the pool block goes back.
void DevicePath::finish_write(const EntryPtr& e) {
  Pending write;
  {
    MutexLock lock(e->mutex);
    write = state_of<DeviceState>(*e).piece.io;
  }
  write.settle();
  MutexLock lock(e->mutex);
  finish_write_locked(*e);
}

void DevicePath::finish_write_locked(Entry& e) {
  if (e.state != State::writing) return;
  state_of<DeviceState>(e).piece = Piece();
  advance(e, State::spilled);
  context_.counters->record_spilled(e.layer_input);
}

// A read into the pool. Prefetches (wait_for_room false) take a block only when room for the
// largest input remains, so the restore that needs one next always finds it.
void DevicePath::queue_read(Entry& e, bool wait_for_room) {
  if (e.state != State::spilled || !e.region) return;
  const std::shared_ptr<HostPool> held = pool_for(e);
  HostPool& pool = *held;
  if (e.bytes > pool.largest_piece()) return;  // in pieces, at restore
  HostPool::Lease lease;
  if (wait_for_room) {
    lease = take(pool, e.bytes);
  } else {
    std::optional<HostPool::Lease> room = pool.try_take(e.bytes, context_.largest_input.load());
    if (!room) return;
    lease = std::move(*room);
  }
  Piece& piece = state_of<DeviceState>(e).piece;
  piece = Piece();
  piece.bytes = e.bytes;
  piece.lease = std::move(lease);
  piece.io = e.region.read_async(piece.lease.host().data(), e.bytes);
  advance(e, State::reading);
}

// The read is done: host -> device into a new buffer. The block goes back (on the progress
// thread) as soon as that copy completed; a failed read is left for restore() to report.
void DevicePath::start_upload(Entry& e) {
  DeviceState& s = state_of<DeviceState>(e);
  try {
    s.piece.io.wait();
  } catch (const std::exception&) {
    return;
  }
  Buffer result = device_buffer(e, context_.options.prefetch_depth);
  CopyPtr upload = e.engine->to_device(s.piece.lease.host(), result, 0);
  s.result = std::move(result);
  s.upload = std::move(upload);
  context_.counters->add_device_bytes(e.bytes);
  auto piece = std::make_shared<Piece>(std::move(s.piece));
  piece->copy = s.upload;
  s.piece = Piece();
  advance(e, State::uploading);
  progress_.post([piece]() mutable { piece.reset(); });  // waits for the copy, then the block
}

// Ahead of backward, an upload that cannot start (the device is out of memory) is left for
// restore(), which then reports it.
void DevicePath::prefetch(Entry& e) {
  if (e.input.defined() || !e.region) return;
  queue_read(e, false);
  if (e.state != State::reading || !state_of<DeviceState>(e).piece.io.ready()) return;
  try {
    start_upload(e);
  } catch (const std::exception&) {  // the front end's out-of-memory error
  }
}

// Ready: a prefetch's read had completed (or its upload begun). An input larger than the pool
// is read at finish_restore, piece by piece.
bool DevicePath::begin_restore(Entry& e) {
  const Piece& piece = state_of<DeviceState>(e).piece;
  const bool ready = e.state == State::uploading || (e.state == State::reading && piece.io.ready());
  if (e.state == State::writing) {  // its device bytes are gone: wait, then read back
    piece.io.settle();
    finish_write_locked(e);
  }
  queue_read(e, true);  // a no-op where a successor's restore queued it
  return ready;
}

Buffer DevicePath::finish_restore(Entry& e) {
  // queue_read left it spilled: larger than the pool when begin_restore asked. Decided by the
  // state alone: the pool may have grown since (Note [A pool sized from what the disk does] in
  // host_pool.cc), and pieces of any pool's size restore it.
  if (e.state == State::spilled && e.region) return restore_in_pieces(e, *pool_for(e));
  if (!e.region) {
    advance(e, State::restored);
    return device_buffer(e, context_.options.prefetch_depth);
  }
  DeviceState& s = state_of<DeviceState>(e);
  if (e.state == State::reading) {
    s.piece.io.wait();  // IoError, IntegrityError
    start_upload(e);
  }
  s.upload->order_current_stream();
  s.upload.reset();
  e.region.free();
  context_.counters->sub_device_bytes(e.bytes);
  advance(e, State::restored);
  return std::exchange(s.result, Buffer());
}

Buffer DevicePath::restore_in_pieces(Entry& e, HostPool& pool) {
  context_.counters->pieces.fetch_add(1);
  Buffer result = device_buffer(e, context_.options.prefetch_depth);
  const std::uint64_t step = pool.largest_piece();
  for (std::uint64_t offset = 0; offset < e.bytes; offset += step) {
    const std::uint64_t n = std::min(step, e.bytes - offset);
    HostPool::Lease lease = take(pool, n);
    e.region.read_async(lease.host().data(), n, offset).wait();
    e.engine->to_device(lease.host(), result, offset)->synchronize();
  }
  e.region.free();
  advance(e, State::restored);
  return result;
}

}  // namespace

// Out of device memory, the front end's own error type (trainers catch it to lower the batch size),
// saying what the stash was doing and what to change. The entry keeps its bytes: when the
// failed backward's graph dies, so do its region and pool block.
Buffer device_buffer(const Entry& e, std::uint32_t prefetch_depth) {
  return e.engine->empty(e.device, e.bytes, [&](const std::string& cause) {
    return "spill::checkpoint: no device memory to restore the stashed " + e.describe() +
           " with prefetch_depth " + std::to_string(prefetch_depth) + " (" + cause +
           "); lower StashOptions::prefetch_depth, the batch size or the sequence length";
  });
}

std::unique_ptr<SpillPath> make_device_path(StashContext& context, Progress& progress) {
  return std::make_unique<DevicePath>(context, progress);
}

}  // namespace spill::detail
