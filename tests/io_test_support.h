// Test helpers for the I/O engine's test hook: install a hook for a scope, and a hook that
// sleeps a random time before each operation (to shuffle completion orders).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <thread>

#include "io_queue.h"

namespace spill_test {

// Installs a test hook for the queues made while it lives. See spill::detail::set_io_test_hook.
struct HookScope {
  explicit HookScope(std::function<int(spill::IoOp)> hook) {
    spill::detail::set_io_test_hook(std::move(hook));
  }
  ~HookScope() { spill::detail::set_io_test_hook({}); }
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;
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

}  // namespace spill_test
