#include "host_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>

#include "core/os/counted_wait.h"
#include "core/os/platform.h"
#include "core/os/recent_reading.h"
#include "spill/error.h"
#include "spill/process_memory.h"
#include "spill/units.h"

namespace spill::detail {

// Note [The host pool]
// ~~~~~~~~~~~~~~~~~~~~
// Every accelerator input crosses host memory twice: device -> host before its write, host ->
// device after its read. Given a fresh pinned buffer each time (LibTorch's caching host
// allocator, which rounds to powers of two and keeps what it pinned), host memory grew with the
// volume spilled — +6.2 GB on an H200 — and pinned memory is the budget containers and WSL cap
// hardest. So each arena has one pool, kept with the arena (spill::detail::attachment) and
// shared by its stashes: allocated once at the first accelerator input, pinned once (a
// power-of-two size, so the host allocator reserves exactly what the pool reports), carved by
// spill's SlabAllocator and reused every step. Device -> host copies land in it, O_DIRECT
// writes read from it (the pinned block is the staging buffer: no second host copy), reads land
// in it before the host -> device copy. A block goes back when every operation on it completed.
// When the pool is full, store() waits for the oldest write (PoolFull::wait, counted) or keeps
// the input on its device (PoolFull::keep_on_device), and an automatic pool is made larger once
// it is idle again (Note [A pool sized from what the disk does]); an input larger than the pool
// goes through it in pieces. Host memory spent on accelerator traffic is therefore the pool,
// whatever the model. Where pinning is refused, the same pool is pageable (one warning per
// process).
//
// For CPU inputs nothing is copied: the input itself is written. There the budget bounds the
// bytes of inputs held while their writes are in flight (Note [Overlapped spilling] in
// src/core/stash/chain.cc).

namespace {

constexpr std::uint64_t kMinAutomaticBytes = 64ull << 20;

std::uint64_t page_bytes() { return platform::capabilities().page_size_bytes; }

std::uint64_t power_of_two_floor(std::uint64_t bytes) {
  std::uint64_t p = 1;
  while (p <= bytes / 2) p *= 2;
  return p;
}

void check_memlock(std::uint64_t bytes) {
  const std::uint64_t limit = platform::locked_memory_limit_bytes();
  if (bytes <= limit) return;
  throw InvalidArgumentError("spill: ArenaOptions::host_pool_bytes = " + bytes_with_units(bytes) +
                             " exceeds RLIMIT_MEMLOCK (" + bytes_with_units(limit) +
                             "), the pinned memory this process may lock; lower it, or raise "
                             "the limit (ulimit -l, or memlock in the container's settings)");
}

// Pinned through the device's engine (or the emulated device's stand-in); undefined where that
// is refused or there is nothing to pin for (no engine).
Buffer pinned_bytes(std::uint64_t bytes, CopyEngine* engine) {
  const EmulatedHostMemory emulated = emulated_host_memory();
  if (emulated == EmulatedHostMemory::pinned) return Buffer::host(bytes, page_bytes());
  if (emulated == EmulatedHostMemory::off && engine != nullptr) return engine->pinned_host(bytes);
  return Buffer();
}

// Page-aligned like pinned memory, so O_DIRECT writes its blocks from where they are.
Buffer pageable_bytes(std::uint64_t bytes) {
  try {
    if (emulated_host_memory() == EmulatedHostMemory::refused) throw std::bad_alloc();
    return Buffer::host(bytes, page_bytes());
  } catch (const std::bad_alloc&) {
    throw InsufficientSpaceError("<host pool>", bytes, memory_limits().usable_bytes(),
                                 "spill: the host pool of " + bytes_with_units(bytes) +
                                     " could not be allocated; lower "
                                     "ArenaOptions::host_pool_bytes");
  }
}

std::uint64_t largest_piece_of(std::uint64_t bytes) {
  const std::uint64_t page = page_bytes();
  std::uint64_t low = 1;
  std::uint64_t high = bytes / page;
  while (low < high) {
    const std::uint64_t mid = low + (high - low + 1) / 2;
    if (SlabAllocator::rounded_size(mid * page, page) <= bytes) {
      low = mid;
    } else {
      high = mid - 1;
    }
  }
  return low * page;
}

}  // namespace

// Where pinning is refused every arena's pool is pageable: one warning per process, not one per
// arena, given by the stash that made the pool through its front end's warnings. Each emulated
// device (set_copy_engine_override) counts as a fresh process, so a test sees its warning
// whatever ran before it.
std::string pageable_notice() {
  static std::atomic<std::uint64_t> warned_epoch{~std::uint64_t{0}};
  const std::uint64_t epoch = emulation_epoch();
  if (warned_epoch.exchange(epoch) == epoch) return std::string();
  return "spillarena: pinned host memory is unavailable; the host pool is pageable "
         "(device copies are then synchronous)";
}

// Note [Reading memory once in a while]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The automatic budget is asked at every spill, and what bounds it — half the memory this
// process may still use (the memory cgroup's files and /proc/meminfo) — took 30-300 us to read:
// most of a 1 MiB input's store on this machine (issue 40). A reading is reused for 50 ms, the
// pause the Python front end also reuses its pressure reading for (Note [Reading the pressure
// once in a while] in python/spillarena/malloc.py): pages are faulted in at about 2.3 GB/s here,
// so a reading misses at most a tenth of a 1 GiB container's memory, and the budget it bounds is
// chosen again at the next reading: for CPU inputs it is when store() waits (no memory is
// allocated for it), for accelerator inputs the pool's size, taken once at the first input.
namespace {

std::uint64_t budget_ceiling() {
  std::uint64_t ceiling = platform::locked_memory_limit_bytes();
  const std::uint64_t usable = memory_limits().usable_bytes();
  if (usable > 0) ceiling = std::min(ceiling, usable / 2);
  return ceiling;
}

}  // namespace

std::uint64_t automatic_host_pool_bytes(std::uint64_t input_bytes, std::uint64_t inputs) {
  static RecentReading ceiling(std::chrono::milliseconds(50), budget_ceiling);
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  const std::uint64_t wanted =
      inputs != 0 && input_bytes > kMax / inputs ? kMax : input_bytes * inputs;
  const std::uint64_t bytes = std::min(std::max(kMinAutomaticBytes, wanted), ceiling.get());
  return std::max(bytes / page_bytes() * page_bytes(), page_bytes());
}

// Note [A pool sized from what the disk does]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The automatic pool starts with room for prefetch_depth + 2 inputs: enough when the disk writes
// as fast as the forward stores, and backward's prefetches need no more. Where the forward stores
// faster than the disk writes, the pool fills and store() waits for the oldest write: on an H200
// (128 MiB inputs, a 512 MiB pool) 14-51 times per four steps, 1.4-2.1 s, the step 1.13x
// recompute's in buffered mode and 1.69x in direct mode. How much more the pool would have had to
// hold is measured, not guessed: the bytes given back to it while a take() waited for room are
// what the disk wrote meanwhile, and a pool larger by that many bytes would have taken those
// inputs without waiting (the forward's rate of stored bytes and the disk's write rate are both
// in that figure: the backlog beyond the pool drains at the disk's rate while the forward stands
// still). A restore's own read that waited for room counts the same way (backward is then
// bounded by the pool too). So after such a wait, the first spill that finds the pool idle (the
// next forward's, normally) makes a new pool that much larger — a power of two when pinned, the
// size the device's allocator reserves — and the old one goes when its last lease does. What it
// costs, in host RAM: the larger pool, pinned where the device pins, never beyond the automatic
// budget's ceiling (half the memory this process may still use, and RLIMIT_MEMLOCK); and, on a
// device whose host allocator caches what it pinned (LibTorch's caching host allocator does),
// the old pool's block too, kept by that cache for a request of its size: as the pools at least
// double, at most the final pool's size again. Two stashes growing the pool at once make two
// successors, of which one is kept; a lease taken from the old pool after the idle check keeps
// it alive a while longer. At the ceiling the pool stays, store() waits as before, and the
// stats say so (pool_waits, host_pool_bytes); the stats keep the replaced pools' waits as they
// were when each was replaced. A pool sized with ArenaOptions::host_pool_bytes is the user's and
// never grows. Under PoolFull::keep_on_device store() never waits (its overflow is
// inputs_kept_on_device), so only restores that waited for room grow the pool there. Grows are
// counted (host_pool_grows). Not yet measured on a GPU.
std::uint64_t grown_host_pool_bytes(std::uint64_t bytes, std::uint64_t drained, bool pinned) {
  static RecentReading ceiling(std::chrono::milliseconds(50), budget_ceiling);
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  const std::uint64_t top = ceiling.get();
  std::uint64_t wanted = drained > kMax - bytes ? kMax : bytes + drained;
  if (pinned) {  // HostPool::make pins a power of two: the next one up, or the ceiling's
    const std::uint64_t floor = power_of_two_floor(wanted);
    wanted = floor < wanted && floor <= top / 2 ? floor * 2 : floor;
    if (wanted > top) wanted = power_of_two_floor(top);
  }
  wanted = std::min(wanted, top) / page_bytes() * page_bytes();
  return std::max(wanted, bytes);
}

std::shared_ptr<HostPool> HostPool::make(std::uint64_t budget_bytes, CopyEngine* engine) {
  std::uint64_t bytes = std::max(budget_bytes / page_bytes() * page_bytes(), page_bytes());
  check_memlock(bytes);
  Buffer memory = pinned_bytes(power_of_two_floor(bytes), engine);
  const bool pinned = memory.defined();
  if (!pinned) memory = pageable_bytes(bytes);
  return std::shared_ptr<HostPool>(new HostPool(std::move(memory), pinned));
}

HostPool::HostPool(Buffer memory, bool pinned)
    : memory_(std::move(memory)),
      bytes_(memory_.bytes()),
      pinned_(pinned),
      slabs_(bytes_, page_bytes()),
      largest_piece_(largest_piece_of(bytes_)) {}

std::optional<HostPool::Lease> HostPool::try_take(std::uint64_t bytes, std::uint64_t reserve) {
  std::optional<Block> block = slabs_.allocate(bytes);
  if (!block) return std::nullopt;
  if (reserve > 0 && slabs_.stats().largest_free_block <
                         SlabAllocator::rounded_size(reserve, slabs_.alignment_bytes())) {
    slabs_.free(*block);  // the request that needs the reserve would no longer fit
    return std::nullopt;
  }
  Lease lease;
  lease.pool_ = shared_from_this();
  lease.block_ = *block;
  lease.host_ = memory_.slice(block->offset, bytes);
  return lease;
}

HostPool::Lease HostPool::take(std::uint64_t bytes, const std::function<bool()>& give_up,
                               std::chrono::milliseconds poll) {
  if (std::optional<Lease> lease = try_take(bytes)) return std::move(*lease);
  const CountedWait counted(waits_, wait_ns_);
  MutexLock lock(mutex_);
  ++waiting_;
  for (;;) {
    const std::uint64_t seen = given_back_;  // read before the try: see given_back_
    lock.unlock();
    std::optional<Lease> lease = try_take(bytes);
    const bool stop = !lease && give_up();
    lock.lock();
    if (lease || stop) {
      --waiting_;
      return lease ? std::move(*lease) : Lease();
    }
    freed_.wait_for(lock, poll, [&]() REQUIRES(mutex_) { return given_back_ != seen; });
  }
}

void HostPool::give_back(const Block& block) {
  slabs_.free(block);
  MutexLock lock(mutex_);
  ++given_back_;
  if (waiting_ > 0) drained_while_waiting_.fetch_add(block.size);
  freed_.notify_all();
}

HostPool::Lease& HostPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = std::move(other.pool_);
    block_ = other.block_;
    host_ = std::move(other.host_);
    other.pool_ = nullptr;
  }
  return *this;
}

void HostPool::Lease::reset() {
  if (!pool_) return;
  host_ = Buffer();
  pool_->give_back(block_);
  pool_ = nullptr;
}

}  // namespace spill::detail
