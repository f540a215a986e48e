#include "spill/process_memory.h"

#include "platform.h"

namespace spill {

std::uint64_t resident_anonymous_bytes() { return platform::resident_anonymous_bytes(); }

void return_freed_memory_promptly(std::uint64_t threshold_bytes) {
  platform::set_malloc_mmap_threshold(threshold_bytes);
}

}  // namespace spill
