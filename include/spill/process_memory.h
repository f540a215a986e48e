// What this process holds in anonymous memory (RssAnon of /proc/self/status): the number a
// memory cgroup OOM-kills on, and the one spilling to disk keeps flat.
//
//   const std::uint64_t before = spill::resident_anonymous_bytes();
//   auto loss = model->forward(batch);
//   std::cout << "forward kept " << spill::human_bytes(spill::resident_anonymous_bytes() - before);
#pragma once

#include <cstdint>

namespace spill {

// RssAnon in bytes; 0 where /proc/self/status cannot be read.
std::uint64_t resident_anonymous_bytes();

// Makes glibc return freed large blocks to the system at once (a fixed mmap threshold of
// `threshold_bytes`), so RssAnon follows live memory instead of malloc's high-water mark.
// For tools and benchmarks that report memory; no effect on other C libraries.
void return_freed_memory_promptly(std::uint64_t threshold_bytes = 128 * 1024);

}  // namespace spill
