// Wall-clock seconds for the CLI's rates (GB/s, tokens/s, ETA).
#pragma once

#include <chrono>

namespace spill::cli {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace spill::cli
