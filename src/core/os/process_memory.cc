#include "spill/process_memory.h"

#include <algorithm>

#include "core/os/platform.h"

namespace spill {

std::uint64_t resident_anonymous_bytes() { return platform::resident_anonymous_bytes(); }

// Note [Returning freed memory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// glibc keeps freed blocks below its dynamic mmap threshold inside the process for reuse, and
// the threshold rises as larger blocks are freed, so RssAnon (what a memory cgroup OOM-kills on)
// follows malloc's high-water mark instead of live memory: freed tensors stay charged. A fixed
// mmap and trim threshold sends large blocks back to the system when they are freed, and
// malloc_trim returns what the heap already holds free. The thresholds are process-wide and
// belong to the application (a Python process, a server embedding LibTorch), so the library
// never sets them on its own: `spillarena train` calls this at start (unless
// --keep-freed-memory), and so do the tests, benchmarks and tools that report memory. With
// jemalloc or mimalloc the call has no effect; they return freed memory by their own decay.
void return_freed_memory_promptly(std::uint64_t threshold_bytes) {
  platform::set_malloc_thresholds(threshold_bytes);
}

std::uint64_t MemoryLimits::usable_bytes() const {
  std::uint64_t usable = mem_available_bytes;
  if (cgroup_limit_bytes > 0) {
    const std::uint64_t room =
        cgroup_limit_bytes > cgroup_usage_bytes ? cgroup_limit_bytes - cgroup_usage_bytes : 0;
    usable = usable == 0 ? room : std::min(usable, room);
  }
  return usable;
}

double MemoryLimits::pressure() const {
  const auto share = [](std::uint64_t used, std::uint64_t ceiling) {
    if (ceiling == 0) return 0.0;
    return std::min(1.0, static_cast<double>(used) / static_cast<double>(ceiling));
  };
  const std::uint64_t system_used =
      mem_available_bytes < mem_total_bytes ? mem_total_bytes - mem_available_bytes : 0;
  const double system = mem_available_bytes == 0 ? 0.0 : share(system_used, mem_total_bytes);
  return std::max(share(cgroup_anon_bytes, cgroup_limit_bytes), system);
}

MemoryLimits memory_limits() {
  MemoryLimits m;
  platform::memory_cgroup(&m);
  m.mem_available_bytes = platform::mem_available_bytes();
  m.mem_total_bytes = platform::physical_memory_bytes();
  return m;
}

}  // namespace spill
