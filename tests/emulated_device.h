// The accelerator path's test scaffolding on the CPU: the copy seam's emulation for a scope
// (tests/support/accelerator_emulation.h) and writes slowed through the I/O test hook, shared by
// device_path_test, device_held_test and host_pool_growth_test.
//
//   spill_test::Emulation emulation(50);                  // copies delayed up to 50 us, seed 7
//   spill_test::HookScope slow(spill_test::slow_writes(100));  // each queued write waits 100 ms
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

#include "accelerator_emulation.h"
#include "io_test_support.h"

namespace spill_test {

// Emulated accelerator copies for the scope's lifetime.
struct Emulation {
  explicit Emulation(std::uint32_t max_delay_us, std::uint32_t min_delay_us = 0,
                     std::uint64_t seed = 7) {
    spill::testing::set_accelerator_emulation({true, max_delay_us, seed, min_delay_us});
  }
  explicit Emulation(const spill::testing::AcceleratorEmulation& faults) {
    spill::testing::set_accelerator_emulation(faults);
  }
  ~Emulation() { spill::testing::set_accelerator_emulation({}); }
  Emulation(const Emulation&) = delete;
  Emulation& operator=(const Emulation&) = delete;
};

// Every queued write waits `ms` first (reads do not).
inline std::function<int(spill::IoOp)> slow_writes(int ms) {
  return [ms](spill::IoOp op) {
    if (op == spill::IoOp::write) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return 0;
  };
}

}  // namespace spill_test
