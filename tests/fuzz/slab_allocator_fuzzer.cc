// libFuzzer target for SlabAllocator. Each input is decoded into an alignment, a capacity and a
// sequence of allocate / free / invalid-free operations; after every operation the allocator's
// stats and blocks are checked against AllocatorModel, and at the end everything is freed and
// the capacity must be one free block again. See docs/fuzzing.md.
//
//   tests/fuzz_check.sh build/fuzz 60      # build with clang, fuzz for 60 s
//   build/fuzz/slab_allocator_fuzzer -max_total_time=3600 build/fuzz/corpus   # an hour
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <vector>

#include "allocator_model.h"
#include "core/alloc/slab_allocator.h"
#include "fuzz_check.h"
#include "spill/error.h"

using spill::Block;
using spill::SlabAllocator;
using spill_fuzz::AllocatorModel;
using spill_fuzz::u;

namespace {

// ---------------------------------------------------------------------------------------------
// Operation counts, printed at exit
// ---------------------------------------------------------------------------------------------

struct Counts {
  std::uint64_t inputs = 0;
  std::uint64_t allocates = 0;
  std::uint64_t allocates_refused = 0;   // nullopt: no free block holds the rounded size
  std::uint64_t allocates_rejected = 0;  // InvalidArgumentError (0 bytes)
  std::uint64_t frees = 0;
  std::uint64_t frees_rejected = 0;  // InvalidArgumentError (not a live block)
};
Counts counts;

void print_counts() {
  std::fprintf(stderr,
               "slab_allocator_fuzzer: %llu allocator operations over %llu inputs: allocate %llu "
               "(%llu refused for space, %llu rejected), free %llu (%llu rejected)\n",
               u(counts.allocates + counts.frees), u(counts.inputs), u(counts.allocates),
               u(counts.allocates_refused), u(counts.allocates_rejected), u(counts.frees),
               u(counts.frees_rejected));
}

// ---------------------------------------------------------------------------------------------
// One input's state: the allocator, its model, the live blocks in an order the input picks from
// ---------------------------------------------------------------------------------------------

struct Session {
  SlabAllocator& slabs;
  AllocatorModel model;
  std::uint64_t alignment;
  std::vector<Block> live;
  std::optional<Block> last_freed;
};

template <typename Call>
void expect_invalid_argument(Call call, const char* what) {
  try {
    call();
  } catch (const spill::InvalidArgumentError&) {
    return;
  }
  FUZZ_CHECK(false, "%s did not throw spill::InvalidArgumentError", what);
}

#define EXPECT_STAT(field)                                                               \
  FUZZ_CHECK(got.field == want.field, "stats()." #field " is %llu, the model says %llu", \
             u(got.field), u(want.field))

// After every operation: the stats agree with the model and the allocator's own check holds.
void check_agrees(const Session& s) {
  const spill::AllocatorStats got = s.slabs.stats();
  const spill::AllocatorStats want = s.model.stats();
  EXPECT_STAT(capacity_bytes);
  EXPECT_STAT(bytes_in_use);
  EXPECT_STAT(peak_bytes_in_use);
  EXPECT_STAT(bytes_requested);
  EXPECT_STAT(live_blocks);
  EXPECT_STAT(allocations);
  EXPECT_STAT(frees);
  EXPECT_STAT(reuse_hits);
  EXPECT_STAT(largest_free_block);
  EXPECT_STAT(free_bytes);
  EXPECT_STAT(high_water_bytes);
  FUZZ_CHECK(got.free_bytes + got.bytes_in_use == got.capacity_bytes, "free %llu + used %llu",
             u(got.free_bytes), u(got.bytes_in_use));
  FUZZ_CHECK(s.slabs.check_invariants(), "%s", "SlabAllocator::check_invariants");
}

// ---------------------------------------------------------------------------------------------
// Decoding sizes from the input
// ---------------------------------------------------------------------------------------------

// Any 64-bit capacity: rounded_size once returned requests above 2^62 unrounded, which
// misaligned every later block under such capacities (docs/fuzzing.md, "Findings").
constexpr std::uint64_t kMaxCapacityBytes = ~std::uint64_t{0};

// Any capacity, or a few hundred pages (often not a page multiple) so that allocation fails.
std::uint64_t decode_capacity(FuzzedDataProvider& in, std::uint64_t alignment) {
  if (in.ConsumeBool()) return in.ConsumeIntegralInRange<std::uint64_t>(0, kMaxCapacityBytes);
  return alignment * in.ConsumeIntegralInRange<std::uint64_t>(0, 512) +
         in.ConsumeIntegralInRange<std::uint64_t>(0, alignment - 1);
}

// A signed step of up to two pages, to land on either side of a boundary.
std::uint64_t nudge(FuzzedDataProvider& in, std::uint64_t value, std::uint64_t alignment) {
  const auto pages = in.ConsumeIntegralInRange<std::int64_t>(-2, 2);
  const auto bytes = in.ConsumeIntegralInRange<std::int64_t>(-1, 1);
  return value + static_cast<std::uint64_t>(pages) * alignment + static_cast<std::uint64_t>(bytes);
}

std::uint64_t decode_request(FuzzedDataProvider& in, const Session& s) {
  const std::uint64_t a = s.alignment;
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0:
      return in.ConsumeIntegralInRange<std::uint64_t>(1, 8 * a);  // a few pages, exact classes
    case 1:
      return a * in.ConsumeIntegralInRange<std::uint64_t>(1, 300);  // the rounded classes
    case 2:
      return nudge(in, s.model.stats().largest_free_block, a);  // just fits, just does not
    case 3:
      return nudge(in, SlabAllocator::kExactCarveAboveBytes, a);
    case 4:
      return nudge(in, s.slabs.capacity_bytes() >> in.ConsumeIntegralInRange<int>(0, 63), a);
    default:
      return in.ConsumeIntegral<std::uint64_t>();  // anything: 0, beyond any capacity
  }
}

// ---------------------------------------------------------------------------------------------
// Checks of the rounded size (see Note [Size classes] in src/core/alloc/slab_allocator.cc)
// ---------------------------------------------------------------------------------------------

int floor_log2(std::uint64_t v) { return 63 - __builtin_clzll(v); }

// Whole pages; up to 4 pages or above kExactCarveAboveBytes exactly those, else the smallest of
// the four classes per doubling that holds them, which wastes at most a fifth of the block.
void check_rounded(std::uint64_t bytes, std::uint64_t alignment, std::uint64_t rounded) {
  const std::uint64_t pages = bytes / alignment + (bytes % alignment != 0);
  FUZZ_CHECK(rounded % alignment == 0, "rounded_size(%llu) = %llu, alignment %llu", u(bytes),
             u(rounded), u(alignment));
  const std::uint64_t class_pages = rounded / alignment;
  FUZZ_CHECK(class_pages >= pages, "rounded_size(%llu) = %llu < %llu pages", u(bytes), u(rounded),
             u(pages));
  if (pages <= 4 || bytes > SlabAllocator::kExactCarveAboveBytes) {
    FUZZ_CHECK(class_pages == pages, "rounded_size(%llu) = %llu, not page rounded", u(bytes),
               u(rounded));
    return;
  }
  const std::uint64_t step = std::uint64_t{1} << (floor_log2(class_pages - 1) - 2);
  FUZZ_CHECK(class_pages % step == 0, "%llu pages is no size class", u(class_pages));
  FUZZ_CHECK(class_pages - step < pages, "%llu pages: the class below, %llu, holds %llu pages",
             u(class_pages), u(class_pages - step), u(pages));
  FUZZ_CHECK((class_pages - pages) * 5 <= class_pages, "%llu pages wastes more than 20 %% of %llu",
             u(pages), u(class_pages));
}

// ---------------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------------

void allocate(FuzzedDataProvider& in, Session& s) {
  const std::uint64_t bytes = decode_request(in, s);
  ++counts.allocates;
  if (bytes == 0) {
    ++counts.allocates_rejected;
    expect_invalid_argument([&] { s.slabs.allocate(0); }, "allocate(0)");
    return;
  }
  const std::uint64_t size = SlabAllocator::rounded_size(bytes, s.alignment);
  const std::optional<std::uint64_t> expected = s.model.best_fit(size);
  const std::optional<Block> block = s.slabs.allocate(bytes);
  if (!block) {
    ++counts.allocates_refused;
    FUZZ_CHECK(!expected, "allocate(%llu) refused; %llu bytes fit at offset %llu", u(bytes),
               u(size), u(*expected));
    return;
  }
  check_rounded(bytes, s.alignment, size);
  FUZZ_CHECK(block->size == size, "allocate(%llu) reserved %llu, rounded_size says %llu", u(bytes),
             u(block->size), u(size));
  FUZZ_CHECK(block->offset % s.alignment == 0, "offset %llu, alignment %llu", u(block->offset),
             u(s.alignment));
  FUZZ_CHECK(s.model.allocate(*block, bytes),
             "block {%llu, %llu} overlaps a live block or passes capacity %llu", u(block->offset),
             u(block->size), u(s.slabs.capacity_bytes()));
  FUZZ_CHECK(expected && block->offset == *expected,
             "allocate(%llu) gave offset %llu; best fit, most recently freed, is %llu", u(bytes),
             u(block->offset), u(expected.value_or(~0ull)));
  s.live.push_back(*block);
}

Block take_live(Session& s, std::size_t index) {
  const Block block = s.live[index];
  s.live[index] = s.live.back();
  s.live.pop_back();
  return block;
}

void free_live(Session& s, std::size_t index) {
  const Block block = take_live(s, index);
  ++counts.frees;
  s.slabs.free(block);
  s.model.free(block);
  s.last_freed = block;
}

// A block that may or may not be live: freed before, resized, shifted, or made up.
Block decode_doubtful_block(FuzzedDataProvider& in, const Session& s) {
  const int kind = in.ConsumeIntegralInRange<int>(0, 3);
  if (kind == 0 && s.last_freed) return *s.last_freed;
  if (kind <= 2 && !s.live.empty()) {
    Block b = s.live[in.ConsumeIntegralInRange<std::size_t>(0, s.live.size() - 1)];
    if (kind == 1) {
      b.size = nudge(in, b.size, s.alignment);
    } else {
      b.offset = nudge(in, b.offset, s.alignment);
    }
    return b;
  }
  return Block{in.ConsumeIntegral<std::uint64_t>(), in.ConsumeIntegral<std::uint64_t>()};
}

// A free that must be accepted exactly when the model has the block live, and otherwise leave
// the allocator unchanged (check_agrees compares it with the unchanged model).
void free_doubtful(FuzzedDataProvider& in, Session& s) {
  const Block block = decode_doubtful_block(in, s);
  if (!s.model.is_live(block)) {
    ++counts.frees;
    ++counts.frees_rejected;
    expect_invalid_argument([&] { s.slabs.free(block); }, "free of a block that is not live");
    return;
  }
  for (std::size_t i = 0; i < s.live.size(); ++i) {
    if (s.live[i].offset == block.offset) return free_live(s, i);
  }
}

void step(FuzzedDataProvider& in, Session& s) {
  const int op = in.ConsumeIntegralInRange<int>(0, 9);
  if (op < 5 || s.live.empty()) {
    allocate(in, s);
  } else if (op < 9) {
    free_live(s, in.ConsumeIntegralInRange<std::size_t>(0, s.live.size() - 1));
  } else {
    free_doubtful(in, s);
  }
}

// Frees what is left; then the whole capacity is one free block, carved again from offset 0.
void free_everything(Session& s) {
  while (!s.live.empty()) {
    free_live(s, s.live.size() - 1);
    check_agrees(s);
  }
  const spill::AllocatorStats st = s.slabs.stats();
  FUZZ_CHECK(st.largest_free_block == st.capacity_bytes && st.free_bytes == st.capacity_bytes &&
                 st.bytes_in_use == 0 && st.bytes_requested == 0 && st.live_blocks == 0,
             "after freeing all: largest free %llu, free %llu of %llu", u(st.largest_free_block),
             u(st.free_bytes), u(st.capacity_bytes));
  if (st.capacity_bytes == 0) return;
  ++counts.allocates;
  const std::optional<Block> block = s.slabs.allocate(s.alignment);
  FUZZ_CHECK(block && block->offset == 0 && block->size == s.alignment,
             "one page after freeing all: %s", block ? "not at offset 0" : "refused");
  ++counts.frees;
  s.slabs.free(*block);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  std::atexit(print_counts);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const std::uint64_t alignment = std::uint64_t{1} << in.ConsumeIntegralInRange<int>(0, 40);
  const std::uint64_t capacity = decode_capacity(in, alignment);
  SlabAllocator slabs(capacity, alignment);
  FUZZ_CHECK(slabs.capacity_bytes() == capacity / alignment * alignment,
             "capacity %llu at alignment %llu became %llu", u(capacity), u(alignment),
             u(slabs.capacity_bytes()));
  Session s{slabs, AllocatorModel(slabs.capacity_bytes()), alignment, {}, std::nullopt};
  check_agrees(s);
  while (in.remaining_bytes() > 0) {
    step(in, s);
    check_agrees(s);
  }
  free_everything(s);
  ++counts.inputs;
  return 0;
}
