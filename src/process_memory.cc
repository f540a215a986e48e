#include "spill/process_memory.h"

#include <algorithm>

#include "platform.h"

namespace spill {

std::uint64_t resident_anonymous_bytes() { return platform::resident_anonymous_bytes(); }

void return_freed_memory_promptly(std::uint64_t threshold_bytes) {
  platform::set_malloc_mmap_threshold(threshold_bytes);
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

MemoryLimits memory_limits() {
  platform::CgroupMemory cg;
  platform::memory_cgroup(&cg);
  MemoryLimits m;
  m.cgroup_version = cg.version;
  m.cgroup_limit_bytes = cg.limit_bytes;
  m.cgroup_usage_bytes = cg.usage_bytes;
  m.cgroup_peak_bytes = cg.peak_bytes;
  m.mem_available_bytes = platform::mem_available_bytes();
  return m;
}

}  // namespace spill
