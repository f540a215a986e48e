// FUZZ_CHECK: the fuzzers' assertion. A failed check prints what failed, with the numbers, and
// aborts, which libFuzzer turns into a crash report and a reproducer file.
//
//   FUZZ_CHECK(block->offset % alignment == 0, "offset %llu, alignment %llu",
//              u(block->offset), u(alignment));
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace spill_fuzz {

// printf's %llu for a std::uint64_t.
inline unsigned long long u(std::uint64_t v) { return v; }

}  // namespace spill_fuzz

#define FUZZ_CHECK(condition, ...)                                                            \
  do {                                                                                        \
    if (!(condition)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__, __LINE__, #condition); \
      std::fprintf(stderr, __VA_ARGS__);                                                      \
      std::fprintf(stderr, "\n");                                                             \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)
