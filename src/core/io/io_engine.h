// IoEngine: moves bytes between memory and a spill file through the IoQueue, in buffered or
// direct mode, and keeps the page cache bounded in buffered mode. Owned by ArenaCore (disk
// backing only); every asynchronous write and read of a region goes through it.
// See Note [Direct I/O and the staging pool] and Note [Bounded page cache] in
// src/core/io/io_engine.cc.
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/file/storage.h"
#include "core/io/io_queue.h"
#include "core/io/staging_pool.h"
#include "core/os/mutex.h"
#include "spill/io.h"

namespace spill::detail {

// What the engine takes of an arena's options (spill::ArenaOptions, whose fields of these names
// say what they mean): the I/O layer stands below the arena's and does not include it. The
// arena makes it with io_engine_options (core/arena/arena_core.h).
struct IoEngineOptions {
  IoBackend backend = IoBackend::automatic;
  std::uint64_t staging_bytes = 0;
  bool start_writeback_after_write = true;
  std::uint64_t page_cache_limit_bytes = 0;
};

class IoEngine {
 public:
  // Transfers are cut into pieces of this size so several are in flight at once: the queue depth
  // an SSD wants (the O_DIRECT baseline of BM_RoundTrip uses the same size).
  static constexpr std::uint64_t kPieceBytes = 4ull << 20;

  // `mode` is resolved (buffered or direct); direct needs storage.direct_fd() >= 0.
  IoEngine(Storage& storage, const IoEngineOptions& options, IoMode mode);
  ~IoEngine();  // drains: every queued operation completes first
  // Direct mode: the staging pool made IoEngineOptions::staging_bytes, at most `capacity_bytes`,
  // after the arena grew to that with no region live (Note [The staging pool follows the arena]).
  // Never throws: a pool that cannot grow stays as it is, and the reason is returned ("" when it
  // grew or had no need to).
  std::string fit_staging(std::uint64_t capacity_bytes);
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // Work on a transfer's bytes off the caller's thread (how verify_integrity hashes writes and
  // checks reads). `piece` runs for each piece that succeeded, on the thread that completed it,
  // with the piece's file offset, its bytes in memory (a write's source, a read's destination)
  // and their count; `after` once after the last piece (on that thread, or the caller's if all
  // were done before submission ended), with whether every piece succeeded and their spans. Both
  // run before the transfer's Pending is ready; the first error either returns is what
  // Pending::wait throws.
  //
  // Direct writes only, on the submitting thread, in order: `staged` runs for each slice of at
  // most kStagedSliceBytes of an aligned source before it is queued (work on the bytes while
  // they are in the CPU cache: Note [Hashing while the bytes are in cache] in
  // src/core/integrity/integrity.cc, Note [Writing from an aligned source] in
  // src/core/io/io_engine.cc); `copy_staged`, where set, makes each staging slot's copy itself (a
  // hook that hashes in the pass that copies: Note [Copying and hashing in one pass]). Other
  // transfers ignore both.
  //
  // Buffered writes only: `beside` runs once, on one of the queue's threads, queued with the
  // pieces so that it runs while they are copied into the page cache (a hash of the source:
  // Note [Hashing beside the kernel's copy] in src/core/integrity/integrity.cc); `after` waits
  // for it. What it throws is what Pending::wait throws.
  using Piece = std::pair<std::uint64_t, std::uint64_t>;  // file offset, bytes
  struct Hooks {
    std::function<std::exception_ptr(std::uint64_t offset, const char* memory, std::uint64_t bytes)>
        piece;
    std::function<std::exception_ptr(bool all_succeeded, const std::vector<Piece>& pieces)> after;
    std::function<void(const char* memory, std::uint64_t bytes)> staged;
    std::function<void(char* slot, const char* src, std::uint64_t bytes)> copy_staged;
    std::function<void()> beside;
  };
  static constexpr std::uint64_t kStagedSliceBytes = 512ull << 10;

  // `src`/`dst` stay valid until the returned Pending completes. The caller asks
  // throw_if_failed() first (ArenaCore does, once per operation).
  Pending write(std::uint64_t offset, const void* src, std::uint64_t bytes, Hooks hooks = {});
  Pending read(std::uint64_t offset, void* dst, std::uint64_t bytes, Hooks hooks = {});
  // `work` run once on one of the queue's threads, beside the caller's own (the hash of a
  // synchronous write while the caller's pwrite copies it: Note [Hashing beside the kernel's
  // copy] in src/core/integrity/integrity.cc). The Pending is ready when it has run; wait
  // throws what it threw.
  Pending beside(std::function<void()> work);
  // A transfer made without the queue (a copy of resident pages on the caller's thread), as a
  // Pending that is ready at once: with `error` (thrown by wait), or without.
  static Pending finished(IoOp op, std::uint64_t offset, std::uint64_t bytes,
                          std::exception_ptr error);
  // After a write that did not go through the queue: starts its writeback, bounds the cache.
  void written(std::uint64_t offset, std::uint64_t bytes);
  void drain() { queue_->drain(); }
  // The block [offset, offset + bytes) was freed: failures inside it are no longer reported,
  // since nothing can read the bytes they left wrong (Note [Failures last until freed] in
  // src/core/io/io_engine.cc), and its writes need no writeback (Note [Writeback of what stays]).
  void released(std::uint64_t offset, std::uint64_t bytes);
  // A failed operation, reported by every later one until its block is released: a queued
  // one's completion records it, and so does a write made outside the queue (Note [A small
  // write is made at once] in src/core/arena/arena_core.cc).
  void record(const IoStatus& status) EXCLUDES(mutex_);
  // Bytes written and held (not freed) before writeback starts for the oldest of them.
  static constexpr std::uint64_t kWritebackAfterBytes = 64ull << 20;
  // Throws the first failure still reported (spill::IoError). Every write and read of the
  // arena asks once, before anything is queued: ArenaCore's entry points, the synchronous and
  // device ones too.
  void throw_if_failed() const;

  IoMode mode() const { return mode_; }
  IoBackend backend() const { return queue_->backend(); }
  bool has_test_hook() const { return queue_->has_test_hook(); }
  const std::string& backend_note() const { return backend_note_; }
  std::uint64_t alignment() const { return alignment_; }
  std::uint64_t staging_bytes() const { return staging_ ? staging_->budget_bytes() : 0; }
  std::uint64_t staging_waits() const { return staging_ ? staging_->waits() : 0; }
  std::uint64_t staging_wait_ns() const { return staging_ ? staging_->wait_ns() : 0; }

 private:
  class Transfer;
  using TransferPtr = std::shared_ptr<Transfer>;

  Pending queue_pieces(IoOp op, std::uint64_t offset, char* memory, std::uint64_t bytes,
                       Hooks hooks);
  void write_direct(std::uint64_t offset, const char* src, std::uint64_t bytes,
                    const TransferPtr& t, const Hooks& hooks, std::vector<Ticket>* parts);
  void write_staged(std::uint64_t offset, const char* src, std::uint64_t bytes,
                    const TransferPtr& t, const Hooks& hooks, std::vector<Ticket>* parts);
  void read_direct(std::uint64_t offset, char* dst, std::uint64_t bytes, const TransferPtr& t,
                   std::vector<Ticket>* parts);
  Ticket read_staged(std::uint64_t offset, char* dst, std::uint64_t bytes, const TransferPtr& t);
  // The request that runs `work` on a queue thread as part of transfer `t`.
  static IoRequest work_request(std::function<void()> work, const TransferPtr& t);
  // One piece of transfer `t` (may be null): `bytes` of its data are at `memory` for the hooks
  // (the request may move more: alignment padding).
  Ticket submit(IoRequest request, const TransferPtr& t, const char* memory, std::uint64_t bytes);
  // The request's completion also records the piece and reports it to the transfer.
  IoRequest tracked(IoRequest request, const TransferPtr& t, const char* memory,
                    std::uint64_t bytes);
  static TransferPtr transfer(IoOp op, std::uint64_t offset, std::uint64_t bytes, Hooks hooks);
  static Pending submitted(std::vector<Ticket> parts, const TransferPtr& t);

  Storage& storage_;
  const IoMode mode_;
  const bool hints_;  // page-cache hints work here (platform::Capabilities::writeback_control)
  const bool start_writeback_;
  const std::uint64_t page_cache_limit_;
  std::uint64_t alignment_ = 0;
  std::string backend_note_;
  struct StagingShape {
    std::uint64_t budget_bytes, slot_bytes;
  };
  StagingShape staging_shape(std::uint64_t capacity_bytes) const;

  const std::uint64_t staging_asked_;     // IoEngineOptions::staging_bytes
  std::unique_ptr<StagingPool> staging_;  // direct mode only
  mutable Mutex mutex_;
  std::vector<IoStatus> failures_ GUARDED_BY(mutex_);  // of regions not yet freed
  // Written ranges, oldest first.
  std::deque<std::pair<std::uint64_t, std::uint64_t>> cached_ GUARDED_BY(mutex_);
  std::uint64_t cached_bytes_ GUARDED_BY(mutex_) = 0;
  // Written ranges without writeback yet: offset -> (bytes, order written). held_ is the same,
  // keyed by order; held_bytes_ their sum.
  std::map<std::uint64_t, std::pair<std::uint64_t, std::uint64_t>> unsynced_ GUARDED_BY(mutex_);
  std::map<std::uint64_t, std::uint64_t> held_ GUARDED_BY(mutex_);  // order -> offset
  std::uint64_t held_bytes_ GUARDED_BY(mutex_) = 0;
  std::uint64_t writes_ GUARDED_BY(mutex_) = 0;
  void start_writeback_beyond_budget(std::uint64_t offset, std::uint64_t bytes) EXCLUDES(mutex_);
  void forget_unsynced(std::uint64_t offset, std::uint64_t bytes) REQUIRES(mutex_);
  std::unique_ptr<IoQueue> queue_;  // last: destroyed (drained) first
};

}  // namespace spill::detail
