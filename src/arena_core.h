// ArenaCore: what a SpillArena and its Regions share. Storage + allocator + I/O counters + the
// bounded page-cache queue. Kept alive by every Region, so regions may outlive the arena object.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

#include "spill/arena.h"
#include "spill/slab_allocator.h"
#include "storage.h"
#include "writeback_worker.h"

namespace spill::detail {

class ArenaCore {
 public:
  ArenaCore(const ArenaOptions& options, std::unique_ptr<Storage> storage);

  std::optional<Block> allocate(std::uint64_t bytes) { return allocator_.allocate(bytes); }
  void free(const Block& block) noexcept;

  void write(std::uint64_t offset, const void* src, std::uint64_t bytes);
  void read(std::uint64_t offset, void* dst, std::uint64_t bytes) const;
  const void* read_in_place(std::uint64_t offset, std::uint64_t bytes) const;
  void prefetch(std::uint64_t offset, std::uint64_t bytes) const;
  void start_writeback(std::uint64_t offset, std::uint64_t bytes) const;
  void drop_cached_pages(std::uint64_t offset, std::uint64_t bytes) const;

  // The range most recently written, for prefetching "the region before this one" in backward.
  std::pair<std::uint64_t, std::uint64_t> last_written_range() const;

  ArenaStats stats() const;
  const ArenaOptions& options() const { return options_; }
  const Storage& storage() const { return *storage_; }
  char* base() const { return storage_->base(); }

 private:
  const ArenaOptions options_;
  std::unique_ptr<Storage> storage_;
  SlabAllocator allocator_;
  mutable std::atomic<std::uint64_t> bytes_written_{0};
  mutable std::atomic<std::uint64_t> bytes_read_{0};
  mutable std::mutex last_written_mutex_;
  std::pair<std::uint64_t, std::uint64_t> last_written_{0, 0};
  std::unique_ptr<WritebackWorker> writeback_;  // disk only; last member: joins first
};

}  // namespace spill::detail
