// What this process holds in anonymous memory (RssAnon of /proc/self/status): the number a
// memory cgroup OOM-kills on, and the one spilling to disk keeps flat.
//
//   #include <spill/units.h>                                   // human_bytes
//   const std::uint64_t before = spill::resident_anonymous_bytes();
//   std::vector<char> kept(64 << 20, 1);                       // what a forward would keep
//   std::cout << "kept " << spill::human_bytes(spill::resident_anonymous_bytes() - before);
#pragma once

#include <cstdint>

namespace spill {

// RssAnon in bytes; 0 where /proc/self/status cannot be read.
std::uint64_t resident_anonymous_bytes();

// Makes glibc return freed large blocks to the system at once (a fixed mmap threshold of
// `threshold_bytes`), so RssAnon follows live memory instead of malloc's high-water mark.
// For tools and benchmarks that report memory; no effect on other C libraries.
void return_freed_memory_promptly(std::uint64_t threshold_bytes = 128 * 1024);

// How much memory this process may use: its memory cgroup (v1 or v2) and the system's
// MemAvailable. Fields are 0 where unknown (no cgroup limit, unreadable files).
struct MemoryLimits {
  int cgroup_version = 0;                 // 1, 2, or 0 when no memory cgroup was found
  std::uint64_t cgroup_limit_bytes = 0;   // the lowest memory.limit_in_bytes / memory.max of
                                          // the cgroup and its ancestors; 0: no limit
  std::uint64_t cgroup_usage_bytes = 0;   // memory.usage_in_bytes / memory.current
  std::uint64_t cgroup_peak_bytes = 0;    // memory.max_usage_in_bytes / memory.peak
  std::uint64_t cgroup_anon_bytes = 0;    // memory.stat: total_rss (v1) / anon (v2)
  std::uint64_t mem_available_bytes = 0;  // MemAvailable of /proc/meminfo
  std::uint64_t mem_total_bytes = 0;      // physical memory
  // What the process may still take: MemAvailable, capped by the cgroup's limit less its usage.
  std::uint64_t usable_bytes() const;
  // How close memory is to its ceiling, 0 to 1: the cgroup's anonymous memory over its limit, or
  // the system's memory in use (total less MemAvailable) over its total, whichever is higher;
  // 0 where neither is known. Page cache does not count: the kernel writes it back and reclaims
  // it before it kills (dirty pages slow writers down first).
  double pressure() const;
};
MemoryLimits memory_limits();

}  // namespace spill
