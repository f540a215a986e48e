// IoEngine: moves bytes between memory and a spill file through the IoQueue, in buffered or
// direct mode, and keeps the page cache bounded in buffered mode. Owned by ArenaCore (disk
// backing only); every asynchronous write and read of a region goes through it.
// See Note [Direct I/O and the staging pool] and Note [Bounded page cache].
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "io_queue.h"
#include "spill/arena.h"
#include "staging_pool.h"
#include "storage.h"

namespace spill::detail {

class IoEngine {
 public:
  // `mode` is resolved (buffered or direct); direct needs storage.direct_fd() >= 0.
  IoEngine(Storage& storage, const ArenaOptions& options, IoMode mode);
  ~IoEngine();  // drains: every queued operation completes first
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // `src`/`dst` stay valid until the returned Pending completes. A failure of an earlier
  // operation is thrown here (spill::IoError) before anything new is queued.
  Pending write(std::uint64_t offset, const void* src, std::uint64_t bytes);
  Pending read(std::uint64_t offset, void* dst, std::uint64_t bytes);
  void prefetch(std::uint64_t offset, std::uint64_t bytes);  // buffered readahead
  // After a write that did not go through the queue: starts its writeback, bounds the cache.
  void written(std::uint64_t offset, std::uint64_t bytes);
  void drain() { queue_->drain(); }

  IoMode mode() const { return mode_; }
  IoBackend backend() const { return queue_->backend(); }
  const std::string& backend_note() const { return backend_note_; }
  std::uint64_t alignment() const { return alignment_; }
  std::uint64_t staging_bytes() const { return staging_ ? staging_->budget_bytes() : 0; }
  std::uint64_t staging_waits() const { return staging_ ? staging_->waits() : 0; }
  std::uint64_t staging_wait_ns() const { return staging_ ? staging_->wait_ns() : 0; }

 private:
  Pending write_direct(std::uint64_t offset, const char* src, std::uint64_t bytes);
  Pending read_direct(std::uint64_t offset, char* dst, std::uint64_t bytes);
  Ticket read_staged(std::uint64_t offset, char* dst, std::uint64_t bytes);
  Ticket submit(IoRequest request);
  void record(const IoStatus& status);
  void throw_if_failed() const;

  Storage& storage_;
  const IoMode mode_;
  const bool start_writeback_;
  const std::uint64_t page_cache_limit_;
  std::uint64_t alignment_ = 0;
  std::string backend_note_;
  std::unique_ptr<StagingPool> staging_;  // direct mode only
  mutable std::mutex mutex_;              // guards failure_, cached_, cached_bytes_
  std::optional<IoStatus> failure_;       // the first failed write or read
  std::deque<std::pair<std::uint64_t, std::uint64_t>> cached_;  // written ranges, oldest first
  std::uint64_t cached_bytes_ = 0;
  std::unique_ptr<IoQueue> queue_;  // last: destroyed (drained) first
};

}  // namespace spill::detail
