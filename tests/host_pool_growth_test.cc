// The automatic host pool sized from what the disk does (Note [A pool sized from what the disk
// does] in src/core/stash/host_pool.cc): the size of a grown pool, the owner replacing an idle
// pool that waited, and — on the CPU through the copy seam's emulation, where RLIMIT_MEMLOCK
// leaves room above the 64 MiB first pool — a step whose store()s waited for room making the
// next step's pool larger by what the disk wrote meanwhile; a pool the user sized never grows.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>

#include "core/stash/arena_shared.h"
#include "core/stash/host_pool.h"
#include "emulated_device.h"
#include "io_test_support.h"
#include "spill/checkpoint.h"
#include "spill/tensor_stash.h"
#include "spill/units.h"
#include "stash_test_support.h"
#include "test_support.h"

#undef CHECK
#define CHECK(...) DOCTEST_CHECK(__VA_ARGS__)

using spill_test::Emulation;
using spill_test::HookScope;
using spill_test::options_in;
using spill_test::ScratchDir;
using spill_test::stash_arena;
using spill_test::stash_settings;

namespace {

constexpr std::int64_t kElements = 2 << 20;  // 8 MiB of floats: the first pool (64 MiB) holds 8
constexpr std::uint64_t kInputBytes = kElements * sizeof(float);
constexpr int kLayers = 16;  // 15 spilled per step (keep_last 1): 120 MiB

// Writes one at a time, each 20 ms first: a disk far slower than the forward, whatever the
// number of the I/O queue's threads.
std::function<int(spill::IoOp)> slow_writes() {
  return [](spill::IoOp op) {
    static std::mutex disk;
    if (op != spill::IoOp::write) return 0;
    const std::lock_guard<std::mutex> one_at_a_time(disk);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return 0;
  };
}

// RLIMIT_MEMLOCK set to `bytes` for the scope (the pool's ceiling: half the usable memory and
// this); false where this process may not raise it.
class MemlockLimit {
 public:
  explicit MemlockLimit(std::uint64_t bytes) {
    ok_ = getrlimit(RLIMIT_MEMLOCK, &saved_) == 0;
    rlimit wanted{bytes, bytes};
    ok_ = ok_ && setrlimit(RLIMIT_MEMLOCK, &wanted) == 0;
  }
  ~MemlockLimit() { setrlimit(RLIMIT_MEMLOCK, &saved_); }
  MemlockLimit(const MemlockLimit&) = delete;
  MemlockLimit& operator=(const MemlockLimit&) = delete;
  bool ok() const { return ok_; }

 private:
  rlimit saved_{};
  bool ok_ = false;
};

// One training step of kLayers layers through `stash`; the gradient checked.
void one_step(spill::TensorStash& stash, std::int64_t elements = kElements) {
  torch::Tensor x = torch::randn({elements}).requires_grad_(true);
  torch::Tensor y = x;
  auto layer = [](const torch::Tensor& t) { return t * 2; };
  for (int i = 0; i < kLayers; ++i) y = spill::checkpoint(stash, layer, y);
  y.sum().backward();
  CHECK(torch::equal(x.grad(), torch::full({elements}, double(1 << kLayers))));
}

spill::ArenaOptions options(const ScratchDir& dir) {
  return options_in(dir.path(), 160 * spill::MiB, spill::IoMode::direct,
                    spill::IoBackend::thread_pool, spill::MiB);
}

}  // namespace

using spill::detail::grown_host_pool_bytes;
using spill::detail::HostPool;
using spill::detail::HostPoolOwner;

// The automatic budget's ceiling on this machine: half the usable memory and RLIMIT_MEMLOCK.
std::uint64_t ceiling() {
  return spill::detail::automatic_host_pool_bytes(std::numeric_limits<std::uint64_t>::max(), 1);
}

TEST_CASE("host pool growth: the grown size holds what drained, within the ceiling") {
  const std::uint64_t top = ceiling();
  REQUIRE(top >= 4 * spill::MiB);  // RLIMIT_MEMLOCK is 8 MiB on the smallest machines seen
  // pageable: exactly the bytes more; pinned: the next power of two, as the device reserves it
  CHECK(grown_host_pool_bytes(2 * spill::MiB, spill::MiB, false) == 3 * spill::MiB);
  CHECK(grown_host_pool_bytes(2 * spill::MiB, spill::MiB, true) == 4 * spill::MiB);
  CHECK(grown_host_pool_bytes(2 * spill::MiB, 0, true) == 2 * spill::MiB);
  // never beyond the ceiling, whatever drained (overflow included), never smaller than it was
  const std::uint64_t most = std::numeric_limits<std::uint64_t>::max();
  CHECK(grown_host_pool_bytes(2 * spill::MiB, most, false) == top);
  CHECK(grown_host_pool_bytes(2 * spill::MiB, most, true) <= top);
  CHECK(grown_host_pool_bytes(2 * spill::MiB, most, true) > top / 2);
  CHECK(grown_host_pool_bytes(2 * top, spill::MiB, false) == 2 * top);
}

TEST_CASE("host pool growth: the owner replaces an idle pool that waited, and only that") {
  REQUIRE(ceiling() >= 4 * spill::MiB);
  HostPoolOwner owner;
  const auto budget = [] { return 2 * spill::MiB; };
  std::shared_ptr<HostPool> first = owner.get_or_make(budget, nullptr, true);
  REQUIRE(first->bytes() == 2 * spill::MiB);
  CHECK(owner.get_or_make(budget, nullptr, true) == first);  // it never waited
  {
    HostPool::Lease whole = first->take(2 * spill::MiB, [] { return false; });
    std::thread writer([&] {  // the disk: the write completes, the block comes back
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      whole.reset();
    });
    HostPool::Lease next = first->take(spill::MiB, [] { return false; });  // store() waits
    writer.join();
    CHECK(first->drained_while_waiting() == 2 * spill::MiB);
    CHECK(owner.get_or_make(budget, nullptr, true) == first);  // not idle: a lease is out
  }
  CHECK(owner.get_or_make(budget, nullptr, false) == first);  // a pool the user sized
  std::shared_ptr<HostPool> grown = owner.get_or_make(budget, nullptr, true);
  CHECK(grown != first);
  CHECK(grown->bytes() == 4 * spill::MiB);  // 2 MiB more: what the disk wrote meanwhile
  CHECK(owner.get_or_make(budget, nullptr, true) == grown);  // once
  const HostPoolOwner::Retired retired = owner.retired();
  CHECK(retired.grows == 1);
  CHECK(retired.waits == 1);  // the stats keep the first pool's wait
  CHECK(retired.peak_bytes_in_use == 2 * spill::MiB);
}

TEST_CASE("host pool growth: a step that waited for room makes the next step's pool larger") {
  spill_test::Deadline deadline("the pool's growth", 240);
  const MemlockLimit memlock(1024 * spill::MiB);
  if (!memlock.ok() || ceiling() < 128 * spill::MiB) {
    MESSAGE(
        "skipped: RLIMIT_MEMLOCK cannot be raised to 1 GiB here, so the 64 MiB first pool "
        "has no room to grow (the owner's cases above hold the mechanism)");
    return;
  }
  ScratchDir dir;
  Emulation emulation(0);
  HookScope slow(slow_writes());
  spill::SpillArena arena = stash_arena(options(dir), stash_settings(true, 1));
  auto stash = spill::make_arena_stash(arena);
  one_step(*stash);
  const spill::StashStats first = stash->stats();
  CHECK(first.pool_waits > 0);  // the first pool (8 inputs) filled: the disk fell behind
  one_step(*stash);
  const spill::StashStats second = stash->stats();
  one_step(*stash);
  const spill::StashStats third = stash->stats();
  // Grown at the first spill that found the pool idle after a wait, by what the disk wrote while
  // store() waited, rounded up to a power of two as the device pins: a step's 15 inputs fit now,
  // so the third step neither waited nor grew it again.
  CHECK(third.host_pool_grows >= 1);
  CHECK(third.host_pool_bytes >= 16 * kInputBytes);
  CHECK(third.pool_waits == second.pool_waits);
  CHECK(third.host_pool_grows == second.host_pool_grows);
  CHECK(third.peak_host_pool_bytes_in_use > 8 * kInputBytes);
  CHECK(arena.stats().bytes_in_use == 0);
}

TEST_CASE("host pool growth: never beyond the ceiling, never a pool the user sized") {
  spill_test::Deadline deadline("the pool at its ceiling", 240);
  ScratchDir dir;
  Emulation emulation(0);
  HookScope slow(slow_writes());
  constexpr std::int64_t kSmall = 256 << 10;  // 1 MiB inputs: 15 MiB spilled per step
  // The automatic pool is min(64 MiB, the ceiling): where the ceiling is below 15 MiB (8 MiB of
  // RLIMIT_MEMLOCK on the smallest machines seen), the first pool is at it and store() waits.
  const bool automatic_at_ceiling = ceiling() < 15 * spill::MiB;
  if (!automatic_at_ceiling) {
    MESSAGE(
        "the automatic pool's first size is below the ceiling here (RLIMIT_MEMLOCK above "
        "15 MiB): only the pool the user sized is checked");
  }
  for (bool sized_by_user : {false, true}) {
    if (!sized_by_user && !automatic_at_ceiling) continue;  // the first pool holds a step
    CAPTURE(sized_by_user);
    spill::ArenaOptions o = options(dir);
    if (sized_by_user) o.host_pool_bytes = 4 * spill::MiB;
    spill::SpillArena arena = stash_arena(o, stash_settings(true, 1));
    auto stash = spill::make_arena_stash(arena);
    one_step(*stash, kSmall);
    one_step(*stash, kSmall);
    const spill::StashStats s = stash->stats();
    CHECK(s.pool_waits > 0);        // it kept waiting for the disk ...
    CHECK(s.host_pool_grows == 0);  // ... and stayed as it was
    CHECK(s.host_pool_bytes <= (sized_by_user ? 4 * spill::MiB : ceiling()));
    CHECK(arena.stats().bytes_in_use == 0);
  }
}
