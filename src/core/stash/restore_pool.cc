#include "restore_pool.h"

#include <cstdlib>
#include <new>
#include <utility>

#include "core/os/platform.h"

namespace spill::detail {

// Note [Restoring into reused memory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A CPU restore copies the region into host memory of the stash's own (Note [The stash moves
// bytes] in buffer.cc). Allocated fresh, a block above glibc's mmap threshold (32 MiB at most)
// is new pages every time: each one faults and is zeroed by the kernel before the copy writes
// it, and is unmapped again when the restored tensor dies. bench/python/spill_sweep.py counted
// it: with 64 MiB inputs the spilled step faulted about 49,000 pages more than in-RAM
// checkpointing, its three restores' worth (49,152 pages; docs/benchmarks.md, "What spilling
// costs as the input grows"). So a restored tensor's block comes back here when its last owner dies
// (the tensor and every view of it: nothing can still read it), and the next restore of a size it
// fits (up to a quarter larger) takes it, its pages already mapped. In a backward the layers
// restore one after another, each after the one before it was used and freed, so one or two blocks
// serve them all. Memory stays bounded: at most kMaxIdleBlocks idle blocks, and the chain
// releases them when it restores its oldest input (the backward is over), so the next forward
// does not carry them. A block given back after its pool died is freed.

namespace {

std::uint64_t whole_pages(std::uint64_t bytes) {
  const std::uint64_t page = platform::capabilities().page_size_bytes;
  return (bytes + page - 1) / page * page;
}

}  // namespace

RestorePool::~RestorePool() { release_idle(); }

Buffer RestorePool::take(std::uint64_t bytes, std::uint64_t alignment) {
  {
    MutexLock lock(mutex_);
    std::size_t best = idle_.size();
    for (std::size_t i = 0; i < idle_.size(); ++i) {
      const Block& b = idle_[i];
      const bool fits =
          b.capacity >= bytes && b.capacity - bytes <= bytes / 4 && b.alignment >= alignment;
      if (fits && (best == idle_.size() || b.capacity < idle_[best].capacity)) best = i;
    }
    if (best != idle_.size()) {
      const Block block = idle_[best];
      idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(best));
      ++reused_;
      lock.unlock();
      return lend(block, bytes);
    }
  }
  Block block;
  block.alignment = alignment < sizeof(void*) ? sizeof(void*) : alignment;
  block.capacity = whole_pages(bytes > 0 ? bytes : 1);
  if (posix_memalign(&block.memory, static_cast<std::size_t>(block.alignment),
                     static_cast<std::size_t>(block.capacity)) != 0) {
    throw std::bad_alloc();
  }
  return lend(block, bytes);
}

Buffer RestorePool::lend(const Block& block, std::uint64_t bytes) {
  std::weak_ptr<RestorePool> pool = weak_from_this();
  std::shared_ptr<void> owner(block.memory, [pool, block](void*) {
    if (std::shared_ptr<RestorePool> alive = pool.lock()) {
      alive->give_back(block);
    } else {
      std::free(block.memory);
    }
  });
  return Buffer(block.memory, bytes, Device{}, std::move(owner));
}

void RestorePool::give_back(const Block& block) {
  {
    MutexLock lock(mutex_);
    if (idle_.size() < kMaxIdleBlocks) {
      idle_.push_back(block);
      return;
    }
  }
  std::free(block.memory);
}

void RestorePool::release_idle() {
  std::vector<Block> idle;
  {
    MutexLock lock(mutex_);
    idle.swap(idle_);
  }
  for (const Block& b : idle) std::free(b.memory);
}

std::uint64_t RestorePool::reused() const {
  MutexLock lock(mutex_);
  return reused_;
}

std::uint64_t RestorePool::idle_bytes() const {
  MutexLock lock(mutex_);
  std::uint64_t bytes = 0;
  for (const Block& b : idle_) bytes += b.capacity;
  return bytes;
}

}  // namespace spill::detail
