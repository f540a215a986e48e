#include "io_engine.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "platform.h"
#include "spill/error.h"

namespace spill::detail {
namespace {

// Transfers are cut into pieces of this size so several are in flight at once: the queue depth
// an SSD wants (the O_DIRECT baseline of BM_RoundTrip uses the same size).
constexpr std::uint64_t kPieceBytes = 4ull << 20;

std::uint64_t round_up(std::uint64_t bytes, std::uint64_t unit) {
  return (bytes + unit - 1) / unit * unit;
}

}  // namespace

// Note [Direct I/O and the staging pool]
// Buffered spilling copies every byte into the page cache — host RAM the kernel gives back only
// after writeback, and which a container's memory limit counts. With O_DIRECT the bytes go from
// user memory to the disk. O_DIRECT needs buffers, offsets and lengths aligned to the device's
// logical block (regions are page aligned; the alignment is the larger of the page and the
// file's direct-I/O alignment), and tensors are not: a write is copied into slots of a staging
// pool, preallocated once (ArenaOptions::staging_bytes), and each slot goes back to the pool
// when its write completed. Host memory the spill uses is then the staging budget, whatever the
// model's size. Reads land directly in an aligned destination (the stash allocates one); an
// unaligned tail goes through one slot. The mapping stays, untouched in direct mode, so the
// buffered mode keeps its zero-copy restore.

IoEngine::IoEngine(Storage& storage, const ArenaOptions& options, IoMode mode)
    : storage_(storage),
      mode_(mode),
      start_writeback_(options.start_writeback_after_write),
      page_cache_limit_(options.page_cache_limit_bytes) {
  queue_ = make_io_queue(options.io_backend, &backend_note_);
  alignment_ = std::max(platform::page_size_bytes(), storage.direct_alignment());
  if (mode_ == IoMode::direct) {
    const std::uint64_t slot = std::min(kPieceBytes, options.staging_bytes);
    staging_ = std::make_unique<StagingPool>(options.staging_bytes / slot * slot, slot);
  }
}

IoEngine::~IoEngine() { queue_->drain(); }

Ticket IoEngine::submit(IoRequest request) {
  auto user = std::move(request.on_complete);
  request.on_complete = [this, user = std::move(user)](const IoStatus& s) {
    if (user) user(s);
    record(s);
  };
  return queue_->submit(std::move(request));
}

void IoEngine::record(const IoStatus& s) {
  if (s.error_number == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_) failure_ = s;
}

void IoEngine::throw_if_failed() const {
  std::optional<IoStatus> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failed = failure_;
  }
  if (failed) throw_io_error(*failed);
}

// ---------------------------------------------------------------------------------------------
// Writes
// ---------------------------------------------------------------------------------------------

Pending IoEngine::write(std::uint64_t offset, const void* src, std::uint64_t bytes) {
  throw_if_failed();
  const char* from = static_cast<const char*>(src);
  if (mode_ == IoMode::direct) return write_direct(offset, from, bytes);
  IoRequest r{IoOp::write, storage_.fd(), const_cast<char*>(from), bytes, offset, {}};
  r.on_complete = [this](const IoStatus& s) {
    if (s.error_number == 0) written(s.offset, s.bytes);
  };
  return Pending({submit(std::move(r))});
}

// Copies each piece into a staging slot on the calling thread (memcpy is several times faster
// than the disk) and queues its write; the slot returns to the pool when the write completed.
Pending IoEngine::write_direct(std::uint64_t offset, const char* src, std::uint64_t bytes) {
  std::vector<Ticket> parts;
  for (std::uint64_t at = 0; at < bytes; at += staging_->slot_bytes()) {
    const std::uint64_t n = std::min(staging_->slot_bytes(), bytes - at);
    StagingPool::Slot slot = staging_->acquire();
    std::memcpy(slot.data, src + at, n);
    const std::uint64_t padded = round_up(n, alignment_);
    std::memset(slot.data + n, 0, padded - n);
    IoRequest r{IoOp::write, storage_.direct_fd(), slot.data, padded, offset + at, {}};
    r.on_complete = [this, index = slot.index](const IoStatus&) { staging_->release(index); };
    parts.push_back(submit(std::move(r)));
  }
  return Pending(std::move(parts));
}

// Note [Bounded page cache]
// Written regions stay in the page cache, dirty until writeback, and dirty pages count against a
// container's memory limit. Writeback starts right after each write; with a limit set, the
// oldest written ranges beyond it are waited for and dropped. Oldest first is right for
// checkpointing: backward reads regions back newest first, so the newest ones are worth keeping.
// Both hints are queued operations: sync_file_range blocks once the device queue is full, and
// the training thread must never wait on it.
void IoEngine::written(std::uint64_t offset, std::uint64_t bytes) {
  if (start_writeback_) queue_->submit(IoRequest{IoOp::writeback, storage_.fd(), nullptr, bytes, offset, {}});
  if (page_cache_limit_ == 0) return;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> drop;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cached_.emplace_back(offset, bytes);
    cached_bytes_ += bytes;
    while (cached_bytes_ > page_cache_limit_ && cached_.size() > 1) {
      drop.push_back(cached_.front());
      cached_bytes_ -= cached_.front().second;
      cached_.pop_front();
    }
  }
  for (const auto& [at, n] : drop) {
    storage_.unmap_pages(at, n);  // mapped pages are not dropped by POSIX_FADV_DONTNEED
    queue_->submit(IoRequest{IoOp::drop, storage_.fd(), nullptr, n, at, {}});
  }
}

// ---------------------------------------------------------------------------------------------
// Reads
// ---------------------------------------------------------------------------------------------

// Note [Parallel reads from disk]
// One pread is one request stream: the kernel's readahead keeps only a few requests in flight,
// and an SSD wants more. Reads are cut into kPieceBytes pieces queued together, so the backend
// runs several at once.
Pending IoEngine::read(std::uint64_t offset, void* dst, std::uint64_t bytes) {
  throw_if_failed();
  char* to = static_cast<char*>(dst);
  if (mode_ == IoMode::direct) return read_direct(offset, to, bytes);
  std::vector<Ticket> parts;
  for (std::uint64_t at = 0; at < bytes; at += kPieceBytes) {
    const std::uint64_t n = std::min(kPieceBytes, bytes - at);
    parts.push_back(submit(IoRequest{IoOp::read, storage_.fd(), to + at, n, offset + at, {}}));
  }
  return Pending(std::move(parts));
}

Pending IoEngine::read_direct(std::uint64_t offset, char* dst, std::uint64_t bytes) {
  const bool aligned = reinterpret_cast<std::uintptr_t>(dst) % alignment_ == 0;
  const std::uint64_t direct_bytes = aligned ? bytes / alignment_ * alignment_ : 0;
  std::vector<Ticket> parts;
  for (std::uint64_t at = 0; at < direct_bytes; at += kPieceBytes) {
    const std::uint64_t n = std::min(kPieceBytes, direct_bytes - at);
    parts.push_back(
        submit(IoRequest{IoOp::read, storage_.direct_fd(), dst + at, n, offset + at, {}}));
  }
  for (std::uint64_t at = direct_bytes; at < bytes; at += staging_->slot_bytes()) {
    parts.push_back(
        read_staged(offset + at, dst + at, std::min(staging_->slot_bytes(), bytes - at)));
  }
  return Pending(std::move(parts));
}

// Reads whole blocks into a staging slot; the completion copies the wanted bytes out.
Ticket IoEngine::read_staged(std::uint64_t offset, char* dst, std::uint64_t bytes) {
  StagingPool::Slot slot = staging_->acquire();
  IoRequest r{IoOp::read, storage_.direct_fd(), slot.data, round_up(bytes, alignment_), offset, {}};
  r.on_complete = [this, slot, dst, bytes](const IoStatus& s) {
    if (s.error_number == 0) std::memcpy(dst, slot.data, bytes);
    staging_->release(slot.index);
  };
  return submit(std::move(r));
}

void IoEngine::prefetch(std::uint64_t offset, std::uint64_t bytes) {
  queue_->submit(IoRequest{IoOp::prefetch, storage_.fd(), nullptr, bytes, offset, {}});
}

}  // namespace spill::detail
