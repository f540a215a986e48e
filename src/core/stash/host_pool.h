// HostPool: the one bounded block of host memory the arena stash moves accelerator inputs through
// — allocated once, pinned once where the device allows, carved by spill's SlabAllocator, reused
// every step. See Note [The host pool] in src/core/stash/host_pool.cc.
//
//   auto pool = spill::detail::HostPool::make(256ull << 20, engine.get());
//   spill::detail::HostPool::Lease lease = pool->take(bytes, [] { return false; });
//   lease.host();   // a host Buffer of `bytes`: device -> host copies land in it
//   ... write it to the region, wait ...
//   lease = {};     // back to the pool (every operation on it must have completed)
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "copy_engine.h"
#include "core/alloc/slab_allocator.h"
#include "core/os/mutex.h"

namespace spill::detail {

class HostPool : public std::enable_shared_from_this<HostPool> {
 public:
  // `budget_bytes` (>= one page): the pool holds at most that much host memory. Pinned through
  // `engine` (the device's host allocator; the size rounded down to a power of two there, which
  // that allocator would otherwise round up); pageable, the whole budget, where pinning is
  // refused or there is no engine (nullptr: nothing to pin for) — pinned() says which, and the
  // stash warns once per process (pageable_notice). Under emulation the device's pinning is
  // emulated (emulated_host_memory() in copy_engine.h). Throws spill::InsufficientSpaceError
  // when the memory cannot be had, InvalidArgumentError above RLIMIT_MEMLOCK.
  static std::shared_ptr<HostPool> make(std::uint64_t budget_bytes, CopyEngine* engine);

  // Bytes of the pool, handed back when it dies. Move-only; empty when default-constructed.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept { *this = std::move(other); }
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { reset(); }
    void reset();
    explicit operator bool() const { return pool_ != nullptr; }
    const Buffer& host() const { return host_; }  // exactly the bytes asked for
    std::uint64_t bytes() const { return host_.bytes(); }

   private:
    friend class HostPool;
    std::shared_ptr<HostPool> pool_;
    Block block_;
    Buffer host_;
  };

  // `bytes` (<= bytes()) of the pool, or nothing when no free block is that large. `reserve`:
  // a request of that many bytes must still fit afterwards (prefetches keep room for the
  // restore that needs it).
  std::optional<Lease> try_take(std::uint64_t bytes, std::uint64_t reserve = 0);
  // Waits until `bytes` are free; counted in waits() and wait_ns(). A block given back wakes the
  // wait at once; `give_up` is asked after each failed try and every `poll` while waiting: true
  // stops the wait with an empty Lease (a failure elsewhere).
  static constexpr std::chrono::milliseconds kPoll{5};
  Lease take(std::uint64_t bytes, const std::function<bool()>& give_up,
             std::chrono::milliseconds poll = kPoll);

  std::uint64_t bytes() const { return bytes_; }
  // The largest request that can ever be granted (the allocator rounds requests to size
  // classes): larger inputs go through the pool in pieces of this size.
  std::uint64_t largest_piece() const { return largest_piece_; }
  bool pinned() const { return pinned_; }
  std::uint64_t peak_bytes_in_use() const { return slabs_.stats().peak_bytes_in_use; }
  std::uint64_t waits() const { return waits_.load(); }
  std::uint64_t wait_ns() const { return wait_ns_.load(); }
  std::uint64_t bytes_in_use() const { return slabs_.stats().bytes_in_use; }
  // Bytes of blocks given back while a take() waited for room: what the disk wrote out of the
  // pool while store() could not go on (Note [A pool sized from what the disk does]).
  std::uint64_t drained_while_waiting() const { return drained_while_waiting_.load(); }
  void forget_drained() { drained_while_waiting_.store(0); }

 private:
  HostPool(Buffer memory, bool pinned);
  void give_back(const Block& block);

  const Buffer memory_;  // the whole pool
  const std::uint64_t bytes_;
  const bool pinned_;
  SlabAllocator slabs_;
  const std::uint64_t largest_piece_;
  Mutex mutex_;  // with freed_, wakes take() when a block comes back
  std::condition_variable freed_;
  // Blocks given back so far: take() reads it before a try and waits for it to change, so a
  // block given back between a failed try and the wait is never missed.
  std::uint64_t given_back_ GUARDED_BY(mutex_) = 0;
  std::uint64_t waiting_ GUARDED_BY(mutex_) = 0;  // take()s waiting for room now
  std::atomic<std::uint64_t> drained_while_waiting_{0};
  // take()s that waited for room, and their time (core/os/counted_wait.h).
  std::atomic<std::uint64_t> waits_{0};
  std::atomic<std::uint64_t> wait_ns_{0};
};

// The pool's size when ArenaOptions::host_pool_bytes is kAutomaticHostPool: room for
// `inputs` inputs of `input_bytes`, at least 64 MiB, at most half the memory this process may
// still use and RLIMIT_MEMLOCK.
std::uint64_t automatic_host_pool_bytes(std::uint64_t input_bytes, std::uint64_t inputs);

// The size of an automatic pool's successor, after `drained` bytes were written out of a pool
// of `bytes` while store() waited for room in it: room for those bytes too, a power of two when
// `pinned` (the size the device's host allocator reserves), within the ceiling
// automatic_host_pool_bytes keeps to. `bytes` when that is no larger (Note [A pool sized from
// what the disk does]).
std::uint64_t grown_host_pool_bytes(std::uint64_t bytes, std::uint64_t drained, bool pinned);

// Once per process (per emulated device): the warning for a pool that could not be pinned;
// empty after the first.
std::string pageable_notice();

}  // namespace spill::detail
