// Test helpers for the I/O engine's test hooks: install a queue hook or a platform fault hook
// for a scope, a hook that sleeps a random time before each operation (to shuffle completion
// orders), one that holds reads until others were queued (to see the order a restore queues
// them in), and a deadline that turns a hang into a failure.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "core/io/io_queue.h"
#include "core/os/fault_injection.h"
#include "spill/arena.h"

namespace spill_test {

// Installs a test hook for the queues made while it lives. See spill::testing::set_io_test_hook.
struct HookScope {
  explicit HookScope(std::function<int(spill::IoOp)> hook) {
    spill::testing::set_io_test_hook(std::move(hook));
  }
  ~HookScope() { spill::testing::set_io_test_hook({}); }
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;
};

// A queue hook (install it before the arena is made) that, while an arena is watched, holds each
// read until `bytes` in all were queued for reading on that arena since watch() — the arena
// counts a read in bytes_read when it is queued — or `timeout` passed, and keeps the fewest
// bytes any read saw queued when it went on. A restore that queues its predecessors' reads before
// it waits for its own lets its own read see them all (Note [Overlapped spilling] in
// src/core/stash/chain.cc).
//
//   QueuedReads reads(std::chrono::seconds(10));
//   HookScope hook(reads.hook());
//   spill::SpillArena arena(options);
//   reads.watch(&arena, 3 * bytes);  // ... restore ...
//   reads.watch(nullptr, 0);         // before the arena dies
class QueuedReads {
 public:
  explicit QueuedReads(std::chrono::milliseconds timeout) : state_(std::make_shared<State>()) {
    state_->timeout = timeout;
  }

  std::function<int(spill::IoOp)> hook() const {
    return [state = state_](spill::IoOp op) {
      const spill::SpillArena* arena = state->arena.load();
      if (op != spill::IoOp::read || arena == nullptr) return 0;
      const std::uint64_t base = state->base.load();
      const std::uint64_t bytes = state->bytes.load();
      const auto queued = [&] { return arena->stats().bytes_read - base; };
      const auto end = std::chrono::steady_clock::now() + state->timeout;
      while (queued() < bytes && std::chrono::steady_clock::now() < end) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      const std::uint64_t seen = queued();
      std::lock_guard<std::mutex> lock(state->mutex);
      state->fewest_seen = std::min(state->fewest_seen, seen);
      return 0;
    };
  }

  // Reads of `arena` wait for `bytes` queued from now on; nullptr: reads go on at once.
  void watch(const spill::SpillArena* arena, std::uint64_t bytes) {
    state_->arena.store(nullptr);
    if (arena == nullptr) return;
    state_->base.store(arena->stats().bytes_read);
    state_->bytes.store(bytes);
    state_->arena.store(arena);
  }

  // The fewest bytes queued a read of the watched arena saw; UINT64_MAX where none ran.
  std::uint64_t fewest_seen() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->fewest_seen;
  }

 private:
  struct State {
    std::chrono::milliseconds timeout{0};
    std::atomic<const spill::SpillArena*> arena{nullptr};
    std::atomic<std::uint64_t> base{0};
    std::atomic<std::uint64_t> bytes{0};
    std::mutex mutex;
    std::uint64_t fewest_seen = UINT64_MAX;
  };
  std::shared_ptr<State> state_;  // shared with the hook, which the queues keep
};

// A hook that delays each operation by 0 to max_us microseconds, seeded deterministically.
inline std::function<int(spill::IoOp)> random_delays(unsigned seed, unsigned max_us) {
  auto next = std::make_shared<std::atomic<unsigned>>(seed);
  return [next, max_us](spill::IoOp) {
    std::minstd_rand rng(next->fetch_add(1));
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % max_us));
    return 0;
  };
}

// Installs a platform fault hook for its lifetime (see Note [Fault injection at the seam] in
// src/core/os/fault_injection.cc).
struct FaultScope {
  explicit FaultScope(spill::testing::FaultHook hook) {
    spill::testing::set_fault_hook(std::move(hook));
  }
  ~FaultScope() { spill::testing::set_fault_hook({}); }
  FaultScope(const FaultScope&) = delete;
  FaultScope& operator=(const FaultScope&) = delete;
};

inline bool is_write(spill::testing::FaultSite site) {
  using spill::testing::FaultSite;
  return site == FaultSite::pwrite || site == FaultSite::ring_write;
}
inline bool is_read(spill::testing::FaultSite site) {
  using spill::testing::FaultSite;
  return site == FaultSite::pread || site == FaultSite::ring_read;
}

// Every read and write call moves `unit` bytes (or what is left, if less): one byte at a time
// with unit 1; one direct-I/O block at a time with the alignment.
inline spill::testing::FaultHook unit_counts(std::uint64_t unit) {
  return [unit](spill::testing::FaultSite site, std::uint64_t bytes, std::uint64_t) {
    if (!is_write(site) && !is_read(site)) return static_cast<std::int64_t>(bytes);
    return static_cast<std::int64_t>(std::min(unit, bytes));
  };
}

// Every read and write call moves half of what it asks, in whole units (at least one unit).
inline spill::testing::FaultHook half_counts(std::uint64_t unit) {
  return [unit](spill::testing::FaultSite site, std::uint64_t bytes, std::uint64_t) {
    if (!is_write(site) && !is_read(site)) return static_cast<std::int64_t>(bytes);
    return static_cast<std::int64_t>(std::max(bytes / 2 / unit * unit, std::min(unit, bytes)));
  };
}

// Aborts the process with `what` if it still lives after `seconds`: a hang becomes a failure
// with a name instead of a ctest timeout.
class Deadline {
 public:
  Deadline(std::string what, int seconds) : what_(std::move(what)) {
    watchdog_ = std::thread([this, seconds] {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!done_.wait_for(lock, std::chrono::seconds(seconds), [this] { return finished_; })) {
        std::fprintf(stderr, "hang: %s did not finish within %d s\n", what_.c_str(), seconds);
        std::abort();
      }
    });
  }
  ~Deadline() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      finished_ = true;
    }
    done_.notify_all();
    watchdog_.join();
  }
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

 private:
  std::string what_;
  std::mutex mutex_;
  std::condition_variable done_;
  bool finished_ = false;
  std::thread watchdog_;  // last: starts after the state above exists
};

}  // namespace spill_test
