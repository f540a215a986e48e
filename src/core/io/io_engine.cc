#include "core/io/io_engine.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "core/os/platform.h"
#include "core/os/usable_memory.h"
#include "spill/error.h"
#include "spill/units.h"

namespace spill::detail {
namespace {

std::uint64_t round_up(std::uint64_t bytes, std::uint64_t unit) {
  return (bytes + unit - 1) / unit * unit;
}

}  // namespace

// Note [Direct I/O and the staging pool]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Buffered spilling copies every byte into the page cache — host RAM the kernel gives back only
// after writeback, and which a container's memory limit counts. With O_DIRECT the bytes go from
// user memory to the disk. O_DIRECT needs buffers, offsets and lengths aligned to the device's
// logical block (regions are page aligned; the alignment is the larger of the page and the
// file's direct-I/O alignment), and most tensors are not: a write from unaligned memory is
// copied into slots of a staging pool, preallocated (ArenaOptions::staging_bytes, at most the
// capacity; Note [The staging pool follows the arena]), and each
// slot goes back to the pool when its write completed; an aligned source, such as a host pool
// block, is written from where it is (Note [Writing from an aligned source]). Host memory the
// spill uses is then the staging budget, whatever the model's size. Reads land directly in an
// aligned destination (the stash allocates one); an unaligned tail goes through one slot. The
// mapping stays, untouched in direct mode; buffered mode reads resident pages through it.

// Page-cache hints need writeback control (platform::Capabilities); without it they are skipped.
IoEngine::IoEngine(Storage& storage, const IoEngineOptions& options, IoMode mode)
    : storage_(storage),
      mode_(mode),
      hints_(platform::capabilities().writeback_control),
      start_writeback_(hints_ && options.start_writeback_after_write),
      page_cache_limit_(hints_ ? options.page_cache_limit_bytes : 0),
      staging_asked_(options.staging_bytes) {
  queue_ = make_io_queue(options.backend, &backend_note_);
  alignment_ = std::max(platform::capabilities().page_size_bytes, storage.direct_alignment());
  if (mode_ == IoMode::direct) {
    const StagingShape shape = staging_shape(storage.info().capacity_bytes);
    staging_ = std::make_unique<StagingPool>(shape.budget_bytes, shape.slot_bytes);
  }
}

// staging_bytes, at most the capacity, in whole slots of at most kPieceBytes.
IoEngine::StagingShape IoEngine::staging_shape(std::uint64_t capacity_bytes) const {
  const std::uint64_t budget = std::min(staging_asked_, capacity_bytes);
  const std::uint64_t slot = std::min(kPieceBytes, budget);
  return {budget / slot * slot, slot};
}

// Note [The staging pool follows the arena]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A pool larger than the arena could never be filled, so it is made at most the capacity. An
// automatic arena starts tiny (one page when the disk was full, a first guess otherwise), and a
// pool fixed at that size stayed there after the arena grew: 12 KiB of 12 KiB slots under a
// 25 MiB arena, 6,475 staging waits, steps 1.3-1.9x a preallocated arena's. So each grow fits the
// pool again to the new capacity (up to staging_bytes), with slots of up to kPieceBytes, as a
// preallocated arena of that capacity would have it — when the memory this process may still
// use holds the larger pool (the check the arena's constructor makes: direct mode is chosen
// where memory is short, and a pool touched beyond it would summon the OOM killer). A grow
// happens with no region live, and a region is freed only after its transfers completed, so no
// slot is in use then; resize() checks it anyway and leaves the pool alone otherwise.
std::string IoEngine::fit_staging(std::uint64_t capacity_bytes) {
  if (!staging_) return "";
  const StagingShape shape = staging_shape(capacity_bytes);
  const std::uint64_t now = staging_->budget_bytes();
  if (shape.budget_bytes <= now) return "";
  std::uint64_t usable = 0;
  if (!fits_in_usable_memory(shape.budget_bytes - now, &usable)) {
    return "the staging pool stays at " + human_bytes(now) + ": the " +
           human_bytes(shape.budget_bytes) + " this capacity would use exceed the " +
           human_bytes(usable) + " of memory this process may still use";
  }
  if (!staging_->resize(shape.budget_bytes, shape.slot_bytes)) {
    return "the staging pool stays at " + human_bytes(now) + ": " +
           human_bytes(shape.budget_bytes) + " of memory could not be reserved";
  }
  return "";
}

IoEngine::~IoEngine() { queue_->drain(); }

// The pieces of one transfer and its hooks. One count per piece in flight, plus one held while
// pieces are still being submitted, so `after` cannot run between two submissions; the last
// count runs it and finishes the transfer's own completion, which its Pending waits for.
class IoEngine::Transfer {
 public:
  Transfer(const IoStatus& whole, Hooks hooks) : whole_(whole), hooks_(std::move(hooks)) {}

  void add(std::uint64_t offset, std::uint64_t bytes) {
    MutexLock lock(mutex_);
    pieces_.emplace_back(offset, bytes);
    open_.fetch_add(1, std::memory_order_relaxed);
  }
  void piece_done(const IoStatus& s, std::uint64_t offset, const char* memory,
                  std::uint64_t bytes) {
    if (s.error_number != 0) {
      failed_.store(true, std::memory_order_relaxed);
    } else if (hooks_.piece) {
      keep(guarded([&] { return hooks_.piece(offset, memory, bytes); }));
    }
    count_down();
  }
  // Work beside the pieces (Hooks::beside, IoEngine::beside): counted as one more piece.
  void add_work() { open_.fetch_add(1, std::memory_order_relaxed); }
  void run_work(const std::function<void()>& work) {
    keep(guarded([&] {
      work();
      return std::exception_ptr();
    }));
    count_down();
  }
  // acq_rel: whoever runs `after` sees the bytes every other piece moved.
  void count_down() {
    if (open_.fetch_sub(1, std::memory_order_acq_rel) == 1) finish();
  }
  const Ticket& ticket() const { return done_; }

 private:
  template <class Hook>
  static std::exception_ptr guarded(Hook hook) noexcept {
    try {
      return hook();
    } catch (...) {
      return std::current_exception();
    }
  }
  void keep(std::exception_ptr error) {
    if (!error) return;
    MutexLock lock(mutex_);
    if (!first_error_) first_error_ = std::move(error);
  }
  void finish() {
    if (hooks_.after) {
      std::vector<Piece> pieces;
      {
        MutexLock lock(mutex_);
        pieces = pieces_;
      }
      const bool all_succeeded = !failed_.load(std::memory_order_relaxed);
      keep(guarded([&] { return hooks_.after(all_succeeded, pieces); }));
    }
    std::exception_ptr error;
    {
      MutexLock lock(mutex_);
      error = first_error_;
    }
    done_->fail(whole_, std::move(error));
  }

  const IoStatus whole_;
  const Hooks hooks_;
  std::atomic<std::uint64_t> open_{1};
  std::atomic<bool> failed_{false};
  Mutex mutex_;
  std::vector<Piece> pieces_ GUARDED_BY(mutex_);
  std::exception_ptr first_error_ GUARDED_BY(mutex_);
  const Ticket done_ = std::make_shared<Completion>();
};

IoEngine::TransferPtr IoEngine::transfer(IoOp op, std::uint64_t offset, std::uint64_t bytes,
                                         Hooks hooks) {
  if (!hooks.piece && !hooks.after) return nullptr;
  return std::make_shared<Transfer>(IoStatus{0, op, offset, bytes}, std::move(hooks));
}

Ticket IoEngine::submit(IoRequest request, const TransferPtr& t, const char* memory,
                        std::uint64_t bytes) {
  return queue_->submit(tracked(std::move(request), t, memory, bytes));
}

IoRequest IoEngine::tracked(IoRequest request, const TransferPtr& t, const char* memory,
                            std::uint64_t bytes) {
  auto user = std::move(request.on_complete);
  if (t) t->add(request.offset, bytes);
  request.on_complete = [this, user = std::move(user), t, offset = request.offset, memory,
                         bytes](const IoStatus& s) {
    if (user) user(s);
    record(s);
    if (t) t->piece_done(s, offset, memory, bytes);
  };
  return request;
}

Pending IoEngine::submitted(std::vector<Ticket> parts, const TransferPtr& t) {
  if (t) {
    parts.push_back(t->ticket());
    t->count_down();
  }
  return Pending(std::move(parts));
}

// Note [Failures last until freed]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A failed write leaves wrong bytes in its region, and nothing may read them as if they were
// right, even where no one waits for the write's Pending. So every later write or read of the
// arena (ArenaCore asks before synchronous ones too) throws the failure, until the region it hit
// is freed: then no one can read those bytes, and the arena is as good as before, which lets a
// training step fail with the IoError and the next step run once the disk is back.
// A failure no one waited for and whose region was freed first is therefore never reported:
// nothing read the bytes it spoiled.
void IoEngine::record(const IoStatus& s) {
  if (s.error_number == 0) return;
  MutexLock lock(mutex_);
  failures_.push_back(s);
}

void IoEngine::released(std::uint64_t offset, std::uint64_t bytes) {
  MutexLock lock(mutex_);
  failures_.erase(std::remove_if(failures_.begin(), failures_.end(),
                                 [&](const IoStatus& s) {
                                   return s.offset >= offset && s.offset - offset < bytes;
                                 }),
                  failures_.end());
  forget_unsynced(offset, bytes);
}

// The writes inside [offset, offset + bytes) leave the writeback budget.
void IoEngine::forget_unsynced(std::uint64_t offset, std::uint64_t bytes) {
  auto it = unsynced_.lower_bound(offset);
  while (it != unsynced_.end() && it->first - offset < bytes) {
    held_bytes_ -= it->second.first;
    held_.erase(it->second.second);
    it = unsynced_.erase(it);
  }
}

void IoEngine::throw_if_failed() const {
  std::optional<IoStatus> failed;
  {
    MutexLock lock(mutex_);
    if (!failures_.empty()) failed = failures_.front();
  }
  if (failed) throw_io_error(*failed);
}

// ---------------------------------------------------------------------------------------------
// Writes
// ---------------------------------------------------------------------------------------------

Pending IoEngine::write(std::uint64_t offset, const void* src, std::uint64_t bytes, Hooks hooks) {
  // The engine never writes through `memory` on a write: the cast only shares queue_pieces.
  char* from = const_cast<char*>(static_cast<const char*>(src));
  return queue_pieces(IoOp::write, offset, from, bytes, std::move(hooks));
}

// Note [Writing from an aligned source]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// O_DIRECT needs the memory, the offset and the length aligned to the device's block. A source
// that is aligned (a host pool block: page-aligned, Note [The host pool]) is written from where
// it is in kPieceBytes pieces — no second host copy — and only a tail shorter than a block goes
// through a staging slot, zero-padded. Other sources (most CPU tensors: malloc aligns to 16 or
// 64 bytes) are copied into staging slots on the calling thread (memcpy is several times faster
// than the disk); a slot returns to the pool when its write completed. Either way the source
// stays valid and unchanged until the Pending completes (the engine's contract), and the hooks
// see every byte once, in order: a `staged` hook each aligned piece in slices of
// kStagedSliceBytes right after it was queued (the disk reads it while the hash does), and a
// `copy_staged` hook each slot's bytes, as it makes the copy into the slot (hashing as it
// copies). The transfer's `after` hook, which keeps the hashes, runs only once submission ended
// (Transfer::count_down), so it never sees a hash still being taken.
void IoEngine::write_direct(std::uint64_t offset, const char* src, std::uint64_t bytes,
                            const TransferPtr& t, const Hooks& hooks, std::vector<Ticket>* parts) {
  const bool aligned = reinterpret_cast<std::uintptr_t>(src) % alignment_ == 0;
  const std::uint64_t direct_bytes = aligned ? bytes / alignment_ * alignment_ : 0;
  for (std::uint64_t at = 0; at < direct_bytes; at += kPieceBytes) {
    const std::uint64_t n = std::min(kPieceBytes, direct_bytes - at);
    // The engine never writes through `memory` on a write: the cast only fills IoRequest.
    char* from = const_cast<char*>(src + at);
    parts->push_back(
        submit(IoRequest{IoOp::write, storage_.direct_fd(), from, n, offset + at, {}}, t, from, n));
    if (!hooks.staged) continue;
    for (std::uint64_t done = 0; done < n; done += kStagedSliceBytes) {
      hooks.staged(from + done, std::min(kStagedSliceBytes, n - done));
    }
  }
  for (std::uint64_t at = direct_bytes; at < bytes; at += staging_->slot_bytes()) {
    write_staged(offset + at, src + at, std::min(staging_->slot_bytes(), bytes - at), t, hooks,
                 parts);
  }
}

// One slot's worth of a write: copied into a staging slot (by a `copy_staged` hook where there is
// one, which hashes as it copies), zero-padded to whole blocks, queued; the slot goes back on
// completion.
void IoEngine::write_staged(std::uint64_t offset, const char* src, std::uint64_t n,
                            const TransferPtr& t, const Hooks& hooks, std::vector<Ticket>* parts) {
  StagingPool::Slot slot = staging_->acquire();
  if (hooks.copy_staged) {
    hooks.copy_staged(slot.data, src, n);
  } else {
    std::memcpy(slot.data, src, n);
  }
  const std::uint64_t padded = round_up(n, alignment_);
  std::memset(slot.data + n, 0, padded - n);
  IoRequest r{IoOp::write, storage_.direct_fd(), slot.data, padded, offset, {}};
  r.on_complete = [this, index = slot.index](const IoStatus&) { staging_->release(index); };
  parts->push_back(submit(std::move(r), t, src, n));
}

// Note [Bounded page cache]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Written regions stay in the page cache, dirty until writeback, and dirty pages count against a
// container's memory limit. Writeback starts for what stays (Note [Writeback of what stays]);
// with a limit set, the oldest written ranges beyond it are waited for and dropped. Oldest first
// is right for checkpointing: backward reads regions back newest first, so the newest ones are
// worth keeping. Both hints are queued operations: sync_file_range blocks once the device queue
// is full, and the training thread must never wait on it.
//
// Note [Writeback of what stays]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Writeback once started right after every write. But a step's small inputs are read back and
// their regions freed within the step, and the next step writes the same offsets again: their
// pages never needed the disk, and writing them back cost 1.3 ms of a 14 ms step at 1 MiB
// inputs (the device's work on two cores, and rewrites of pages still under writeback). Now the
// written ranges that are still held count against kWritebackAfterBytes; beyond it, writeback
// starts for the oldest, and a range freed before that never goes to the disk (released()).
// Dirty pages held by the arena stay under 64 MiB plus one write, and a step that spills more
// starts writeback as before, one budget behind.
void IoEngine::written(std::uint64_t offset, std::uint64_t bytes) {
  if (start_writeback_) start_writeback_beyond_budget(offset, bytes);
  if (page_cache_limit_ == 0) return;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> drop;
  {
    MutexLock lock(mutex_);
    cached_.emplace_back(offset, bytes);
    cached_bytes_ += bytes;
    while (cached_bytes_ > page_cache_limit_ && cached_.size() > 1) {
      drop.push_back(cached_.front());
      cached_bytes_ -= cached_.front().second;
      cached_.pop_front();
    }
  }
  for (const auto& [at, n] : drop) {
    storage_.drop_page_mappings(at, n);  // mapped pages are not dropped by POSIX_FADV_DONTNEED
    queue_->submit(IoRequest{IoOp::drop, storage_.fd(), nullptr, n, at, {}});
  }
}

void IoEngine::start_writeback_beyond_budget(std::uint64_t offset, std::uint64_t bytes) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> start;
  {
    MutexLock lock(mutex_);
    forget_unsynced(offset, bytes);  // written again: one entry, the newest
    unsynced_[offset] = {bytes, writes_};
    held_[writes_++] = offset;
    held_bytes_ += bytes;
    while (held_bytes_ > kWritebackAfterBytes) {
      const std::uint64_t oldest = held_.begin()->second;
      start.emplace_back(oldest, unsynced_.at(oldest).first);
      forget_unsynced(oldest, 1);
    }
  }
  for (const auto& [at, n] : start) {
    queue_->submit(IoRequest{IoOp::writeback, storage_.fd(), nullptr, n, at, {}});
  }
}

// ---------------------------------------------------------------------------------------------
// Reads
// ---------------------------------------------------------------------------------------------

// Note [Parallel reads from disk]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// One pread is one request stream: the kernel's readahead keeps only a few requests in flight,
// and an SSD wants more. Reads are cut into kPieceBytes pieces queued together, so the backend
// runs several at once. Buffered writes are cut the same way, and their integrity hash runs on
// a queue thread while the pieces are copied (see Note [Hashing beside the kernel's copy] in
// src/core/integrity/integrity.cc).
Pending IoEngine::read(std::uint64_t offset, void* dst, std::uint64_t bytes, Hooks hooks) {
  return queue_pieces(IoOp::read, offset, static_cast<char*>(dst), bytes, std::move(hooks));
}

// One write or read: through staging slots (direct), or cut into kPieceBytes pieces queued
// together (buffered; see Note [Parallel reads from disk]), each written piece then handed to
// written() for writeback and the page-cache limit. A buffered write's `beside` hook is queued
// with its pieces.
Pending IoEngine::queue_pieces(IoOp op, std::uint64_t offset, char* memory, std::uint64_t bytes,
                               Hooks hooks) {
  Hooks staged;
  staged.staged = std::move(hooks.staged);
  staged.copy_staged = std::move(hooks.copy_staged);
  std::function<void()> beside = std::move(hooks.beside);
  const auto t = transfer(op, offset, bytes, std::move(hooks));
  std::vector<Ticket> parts;
  if (mode_ == IoMode::direct && op == IoOp::write) {
    write_direct(offset, memory, bytes, t, staged, &parts);
  }
  if (mode_ == IoMode::direct && op == IoOp::read) read_direct(offset, memory, bytes, t, &parts);
  if (mode_ == IoMode::direct) return submitted(std::move(parts), t);
  std::vector<IoRequest> pieces;
  // The hash beside the pieces' copies (Note [Hashing beside the kernel's copy] in
  // src/core/integrity/integrity.cc): a pool's workers take requests in order, so it goes first,
  // before the pieces occupy them; io_uring completes the no-op at once, and it goes last, so
  // that the kernel's workers start on the pieces before the reaper wakes to hash.
  const bool work_first = queue_->backend() != IoBackend::io_uring;
  if (!t || op != IoOp::write) beside = nullptr;
  if (beside && work_first) pieces.push_back(work_request(std::move(beside), t));
  for (std::uint64_t at = 0; at < bytes; at += kPieceBytes) {
    const std::uint64_t n = std::min(kPieceBytes, bytes - at);
    IoRequest r{op, storage_.fd(), memory + at, n, offset + at, {}};
    if (op == IoOp::write) {
      r.on_complete = [this](const IoStatus& s) {
        if (s.error_number == 0) written(s.offset, s.bytes);
      };
    }
    pieces.push_back(tracked(std::move(r), t, memory + at, n));
  }
  if (beside && !work_first) pieces.push_back(work_request(std::move(beside), t));
  for (Ticket& ticket : queue_->submit_all(std::move(pieces))) parts.push_back(std::move(ticket));
  return submitted(std::move(parts), t);
}

IoRequest IoEngine::work_request(std::function<void()> work, const TransferPtr& t) {
  t->add_work();
  IoRequest r;
  r.work_only = true;
  r.on_complete = [t, work = std::move(work)](const IoStatus&) { t->run_work(work); };
  return r;
}

Pending IoEngine::beside(std::function<void()> work) {
  const auto t = std::make_shared<Transfer>(IoStatus{0, IoOp::write, 0, 0}, Hooks{});
  std::vector<Ticket> parts;
  parts.push_back(queue_->submit(work_request(std::move(work), t)));
  return submitted(std::move(parts), t);
}

Pending IoEngine::finished(IoOp op, std::uint64_t offset, std::uint64_t bytes,
                           std::exception_ptr error) {
  auto done = std::make_shared<Completion>();
  done->fail(IoStatus{0, op, offset, bytes}, std::move(error));
  return Pending({std::move(done)});
}

void IoEngine::read_direct(std::uint64_t offset, char* dst, std::uint64_t bytes,
                           const TransferPtr& t, std::vector<Ticket>* parts) {
  const bool aligned = reinterpret_cast<std::uintptr_t>(dst) % alignment_ == 0;
  const std::uint64_t direct_bytes = aligned ? bytes / alignment_ * alignment_ : 0;
  std::vector<IoRequest> pieces;
  for (std::uint64_t at = 0; at < direct_bytes; at += kPieceBytes) {
    const std::uint64_t n = std::min(kPieceBytes, direct_bytes - at);
    pieces.push_back(tracked(
        IoRequest{IoOp::read, storage_.direct_fd(), dst + at, n, offset + at, {}}, t, dst + at, n));
  }
  for (Ticket& ticket : queue_->submit_all(std::move(pieces))) parts->push_back(std::move(ticket));
  for (std::uint64_t at = direct_bytes; at < bytes; at += staging_->slot_bytes()) {
    parts->push_back(
        read_staged(offset + at, dst + at, std::min(staging_->slot_bytes(), bytes - at), t));
  }
}

// Reads whole blocks into a staging slot; the completion copies the wanted bytes out (before the
// transfer's hooks run, so an integrity check sees them).
Ticket IoEngine::read_staged(std::uint64_t offset, char* dst, std::uint64_t bytes,
                             const TransferPtr& t) {
  StagingPool::Slot slot = staging_->acquire();
  IoRequest r{IoOp::read, storage_.direct_fd(), slot.data, round_up(bytes, alignment_), offset, {}};
  r.on_complete = [this, slot, dst, bytes](const IoStatus& s) {
    if (s.error_number == 0) std::memcpy(dst, slot.data, bytes);
    staging_->release(slot.index);
  };
  return submit(std::move(r), t, dst, bytes);
}

}  // namespace spill::detail
