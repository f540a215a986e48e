#include "arena_core.h"

#include "platform.h"

namespace spill::detail {

ArenaCore::ArenaCore(const ArenaOptions& options, std::unique_ptr<Storage> storage)
    : options_(options),
      storage_(std::move(storage)),
      allocator_(options.capacity_bytes, platform::page_size_bytes()) {
  const bool hints = options_.start_writeback_after_write || options_.page_cache_limit_bytes > 0;
  if (options_.backing == Backing::disk && hints) {
    writeback_ = std::make_unique<WritebackWorker>(storage_.get(),
                                                   options_.start_writeback_after_write,
                                                   options_.page_cache_limit_bytes);
  }
}

void ArenaCore::free(const Block& block) noexcept {
  try {
    allocator_.free(block);
  } catch (...) {
    // Region handles free each block exactly once; nothing to report from a destructor.
  }
}

void ArenaCore::write(std::uint64_t offset, const void* src, std::uint64_t bytes) {
  storage_->write(offset, src, bytes);
  bytes_written_.fetch_add(bytes, std::memory_order_relaxed);
  if (writeback_) writeback_->written(offset, bytes);
  std::lock_guard<std::mutex> lock(last_written_mutex_);
  last_written_ = {offset, bytes};
}

void ArenaCore::read(std::uint64_t offset, void* dst, std::uint64_t bytes) const {
  storage_->read(offset, dst, bytes);
  bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
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

std::pair<std::uint64_t, std::uint64_t> ArenaCore::last_written_range() const {
  std::lock_guard<std::mutex> lock(last_written_mutex_);
  return last_written_;
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
  return s;
}

}  // namespace spill::detail
