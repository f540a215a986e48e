#include "arena_core.h"

#include "platform.h"

namespace spill::detail {

ArenaCore::ArenaCore(const ArenaOptions& options, std::unique_ptr<Storage> storage,
                     std::string io_note)
    : options_(options),
      io_note_(std::move(io_note)),
      storage_(std::move(storage)),
      allocator_(options.capacity_bytes, platform::page_size_bytes()) {
  if (options_.backing == Backing::disk) {
    engine_ = std::make_unique<IoEngine>(*storage_, options_, options_.io);
  }
}

ArenaCore::~ArenaCore() {
  if (engine_) engine_->drain();
}

void ArenaCore::free(const Block& block) noexcept {
  try {
    allocator_.free(block);
  } catch (...) {
    // Region handles free each block exactly once; nothing to report from a destructor.
  }
}

// Synchronous buffered writes stay on the calling thread: a queue hop buys nothing when the
// caller waits anyway (Note [Why pwrite, not memcpy, for the forward copy]).
void ArenaCore::write(std::uint64_t offset, const void* src, std::uint64_t bytes) {
  if (!engine_ || options_.io == IoMode::buffered) {
    storage_->write(offset, src, bytes);
    bytes_written_.fetch_add(bytes, std::memory_order_relaxed);
    if (engine_) engine_->written(offset, bytes);
    return;
  }
  write_async(offset, src, bytes).wait();
}

void ArenaCore::read(std::uint64_t offset, void* dst, std::uint64_t bytes) {
  if (!engine_ || (options_.io == IoMode::buffered && storage_->resident(offset, bytes))) {
    storage_->read(offset, dst, bytes);
    bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
    return;
  }
  read_async(offset, dst, bytes).wait();
}

Pending ArenaCore::write_async(std::uint64_t offset, const void* src, std::uint64_t bytes) {
  if (!engine_) {
    write(offset, src, bytes);
    return Pending();
  }
  Pending p = engine_->write(offset, src, bytes);
  bytes_written_.fetch_add(bytes, std::memory_order_relaxed);
  return p;
}

Pending ArenaCore::read_async(std::uint64_t offset, void* dst, std::uint64_t bytes) {
  if (!engine_) {
    read(offset, dst, bytes);
    return Pending();
  }
  Pending p = engine_->read(offset, dst, bytes);
  bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
  return p;
}

const void* ArenaCore::read_in_place(std::uint64_t offset, std::uint64_t bytes) const {
  storage_->prefetch(offset, bytes);
  bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
  return storage_->base() + offset;
}

void ArenaCore::prefetch(std::uint64_t offset, std::uint64_t bytes) const {
  storage_->prefetch(offset, bytes);
}

void ArenaCore::start_writeback(std::uint64_t offset, std::uint64_t bytes) const {
  storage_->start_writeback(offset, bytes);
}

void ArenaCore::drop_cached_pages(std::uint64_t offset, std::uint64_t bytes) const {
  storage_->drop_cached_pages(offset, bytes);
}

void ArenaCore::record_restore(bool prefetched, bool was_ready, std::uint64_t waited_ns) {
  restores_.fetch_add(1, std::memory_order_relaxed);
  if (prefetched && was_ready) prefetch_hits_.fetch_add(1, std::memory_order_relaxed);
  if (!was_ready) {
    restore_waits_.fetch_add(1, std::memory_order_relaxed);
    restore_wait_ns_.fetch_add(waited_ns, std::memory_order_relaxed);
  }
}

std::uint64_t ArenaCore::io_alignment() const {
  return engine_ ? engine_->alignment() : platform::page_size_bytes();
}

ArenaStats ArenaCore::stats() const {
  const AllocatorStats a = allocator_.stats();
  ArenaStats s;
  s.capacity_bytes = a.capacity_bytes;
  s.bytes_in_use = a.bytes_in_use;
  s.peak_bytes_in_use = a.peak_bytes_in_use;
  s.bytes_requested = a.bytes_requested;
  s.live_regions = a.live_blocks;
  s.allocations = a.allocations;
  s.frees = a.frees;
  s.reuse_hits = a.reuse_hits;
  s.largest_free_block = a.largest_free_block;
  s.free_bytes = a.free_bytes;
  s.high_water_bytes = a.high_water_bytes;
  s.bytes_written = bytes_written_.load(std::memory_order_relaxed);
  s.bytes_read = bytes_read_.load(std::memory_order_relaxed);
  s.io_mode = options_.io;
  s.io_note = io_note_;
  if (engine_) {
    s.io_backend = engine_->backend();
    if (!engine_->backend_note().empty()) {
      s.io_note += (s.io_note.empty() ? "" : "; ") + engine_->backend_note();
    }
    s.staging_bytes = engine_->staging_bytes();
    s.staging_waits = engine_->staging_waits();
    s.staging_wait_ns = engine_->staging_wait_ns();
  }
  s.restores = restores_.load(std::memory_order_relaxed);
  s.restore_waits = restore_waits_.load(std::memory_order_relaxed);
  s.restore_wait_ns = restore_wait_ns_.load(std::memory_order_relaxed);
  s.prefetches = prefetches_.load(std::memory_order_relaxed);
  s.prefetch_hits = prefetch_hits_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace spill::detail
