// The host memory CPU inputs are restored into, reused within a backward: a restored tensor's
// block goes back to the pool when the tensor dies, and the next restore that fits takes it
// instead of fresh pages. See Note [Restoring into reused memory] in restore_pool.cc.
//
//   auto pool = std::make_shared<spill::detail::RestorePool>();
//   spill::detail::Buffer b = pool->take(64 << 20, 4096);  // reused or new, aligned
//   b = {};                      // the last owner gone: the block is idle in the pool
//   pool->release_idle();        // the backward ended: idle blocks, and those given back
//                                // until the next take(), go back to the system
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "buffer.h"
#include "core/os/mutex.h"

namespace spill::detail {

class RestorePool : public std::enable_shared_from_this<RestorePool> {
 public:
  // At most this many idle blocks are kept; one more given back replaces the oldest.
  static constexpr std::size_t kMaxIdleBlocks = 2;

  RestorePool() = default;
  RestorePool(const RestorePool&) = delete;
  RestorePool& operator=(const RestorePool&) = delete;
  ~RestorePool();

  // `bytes` of host memory aligned to `alignment` (a power of two): an idle block of at least
  // that size and at most a quarter more, else a new one (whole pages; below a page, plain
  // Buffer::host memory that never comes back). Ends a release. Throws std::bad_alloc.
  Buffer take(std::uint64_t bytes, std::uint64_t alignment) EXCLUDES(mutex_);
  // Frees every idle block, and every block given back until the next take(): the restored
  // tensors still alive when the backward ends die after it, in the next forward.
  void release_idle() EXCLUDES(mutex_);

  std::uint64_t reused() const EXCLUDES(mutex_);  // takes served by an idle block
  std::uint64_t idle_bytes() const EXCLUDES(mutex_);

 private:
  struct Block {
    void* memory = nullptr;
    std::uint64_t capacity = 0;
    std::uint64_t alignment = 0;
  };
  Buffer lend(const Block& block, std::uint64_t bytes);
  void give_back(const Block& block) EXCLUDES(mutex_);

  mutable Mutex mutex_;
  std::vector<Block> idle_ GUARDED_BY(mutex_);  // oldest first
  bool released_ GUARDED_BY(mutex_) = false;
  std::uint64_t reused_ GUARDED_BY(mutex_) = 0;
};

}  // namespace spill::detail
