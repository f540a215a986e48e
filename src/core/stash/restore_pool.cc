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
// checkpointing, its three restores' worth (49,152 pages; docs/benchmarks_archive.md, "What
// spilling costs as the input grows"). So a restored tensor's block comes back here when its last
// owner dies (the tensor and every view of it: nothing can still read it), and the next restore of
// a size it fits (up to a quarter larger) takes it, its pages already mapped. In a backward the
// layers restore one after another and each restored input dies a layer later, so two blocks serve
// them all (tests/overlapped_checkpoint_test.cc checks the reuse). Memory stays bounded: at most
// kMaxIdleBlocks idle blocks (the newest kept: the likeliest to fit the next restore), and when the
// chain restores its oldest input — a heuristic for "the backward is over": an input freed out of
// order makes it early, which costs a fresh block, never correctness — the pool frees its idle
// blocks and, until the next restore, every block given back (the last restored tensors die after
// that restore), so the next forward carries none. Blocks below a page would never fit the quarter
// rule after rounding; they are plain host memory. A block given back after its pool died is freed.

namespace {

std::uint64_t whole_pages(std::uint64_t bytes) {
  const std::uint64_t page = platform::capabilities().page_size_bytes;
  return (bytes + page - 1) / page * page;
}

}  // namespace

RestorePool::~RestorePool() {
  MutexLock lock(mutex_);
  for (const Block& b : idle_) std::free(b.memory);
}

Buffer RestorePool::take(std::uint64_t bytes, std::uint64_t alignment) {
  if (bytes < platform::capabilities().page_size_bytes) return Buffer::host(bytes, alignment);
  {
    MutexLock lock(mutex_);
    released_ = false;
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
  void* freed = block.memory;
  {
    MutexLock lock(mutex_);
    if (!released_) {
      if (idle_.size() == kMaxIdleBlocks) {
        freed = idle_.front().memory;
        idle_.erase(idle_.begin());
      } else {
        freed = nullptr;
      }
      idle_.push_back(block);
    }
  }
  std::free(freed);
}

void RestorePool::release_idle() {
  std::vector<Block> idle;
  {
    MutexLock lock(mutex_);
    idle.swap(idle_);
    released_ = true;
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
