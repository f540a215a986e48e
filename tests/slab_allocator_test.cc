#include "core/alloc/slab_allocator.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

#include "spill/error.h"
#include "spill/sizing.h"

using spill::Block;
using spill::SlabAllocator;

namespace {
// The alignment the arena gives its allocator: the OS page.
const std::uint64_t kPage = spill::page_size_bytes();
constexpr std::uint64_t kMiB = 1ull << 20;
}  // namespace

TEST_CASE("slab allocator: blocks are page aligned and never overlap") {
  SlabAllocator slabs(64 * kMiB, kPage);
  std::vector<Block> blocks;
  for (std::uint64_t bytes : {std::uint64_t{1}, kPage - 1, kPage + 1, std::uint64_t{12345},
                              std::uint64_t{1000000}, 3 * kMiB}) {
    auto b = slabs.allocate(bytes);
    REQUIRE(b);
    CHECK(b->offset % kPage == 0);
    CHECK(b->size % kPage == 0);
    CHECK(b->size >= bytes);
    for (const Block& other : blocks) {
      CHECK((b->offset + b->size <= other.offset || other.offset + other.size <= b->offset));
    }
    blocks.push_back(*b);
  }
  CHECK(slabs.check_invariants());
}

TEST_CASE("slab allocator: size classes waste at most 20 percent beyond page rounding") {
  for (std::uint64_t bytes = 1; bytes < 256 * kMiB; bytes = bytes * 9 / 8 + 1) {
    const std::uint64_t pages_bytes = (bytes + kPage - 1) / kPage * kPage;
    const std::uint64_t rounded = SlabAllocator::rounded_size(bytes, kPage);
    CHECK(rounded >= pages_bytes);
    CHECK(static_cast<double>(rounded - pages_bytes) <= 0.2 * static_cast<double>(rounded));
  }
}

TEST_CASE("slab allocator: there are four size classes per doubling") {
  std::vector<std::uint64_t> classes;
  for (std::uint64_t bytes = 16 * kPage + 1; bytes <= 32 * kPage; bytes += kPage / 2) {
    classes.push_back(SlabAllocator::rounded_size(bytes, kPage));
  }
  classes.erase(std::unique(classes.begin(), classes.end()), classes.end());
  CHECK(classes == std::vector<std::uint64_t>{20 * kPage, 24 * kPage, 28 * kPage, 32 * kPage});
}

TEST_CASE("slab allocator: requests above the exact-carve threshold are only page rounded") {
  const std::uint64_t bytes = SlabAllocator::kExactCarveAboveBytes + 5 * kPage + 7;
  CHECK(SlabAllocator::rounded_size(bytes, kPage) ==
        SlabAllocator::kExactCarveAboveBytes + 6 * kPage);
}

TEST_CASE("slab allocator: reuses the most recently freed block of a size") {
  SlabAllocator slabs(64 * kPage, kPage);
  std::vector<Block> b;
  for (int i = 0; i < 6; ++i) b.push_back(*slabs.allocate(kPage));
  slabs.free(b[1]);
  slabs.free(b[3]);  // isolated holes of equal size; b[3] is the most recent
  CHECK(slabs.allocate(kPage)->offset == b[3].offset);
  CHECK(slabs.allocate(kPage)->offset == b[1].offset);
}

TEST_CASE("slab allocator: a training step reuses the same offsets the next step") {
  SlabAllocator slabs(64 * kMiB, kPage);
  std::vector<std::uint64_t> first;
  for (int step = 0; step < 3; ++step) {
    std::vector<Block> stash;
    for (int layer = 0; layer < 8; ++layer) stash.push_back(*slabs.allocate(3 * kMiB + 100));
    std::vector<std::uint64_t> offsets;
    for (const Block& b : stash) offsets.push_back(b.offset);
    if (step == 0) first = offsets;
    CHECK(offsets == first);
    while (!stash.empty()) {
      slabs.free(stash.back());
      stash.pop_back();
    }
  }
  CHECK(slabs.stats().reuse_hits == 16);
  CHECK(slabs.stats().high_water_bytes == 8 * SlabAllocator::rounded_size(3 * kMiB + 100, kPage));
}

TEST_CASE("slab allocator: freed neighbours coalesce into one block") {
  SlabAllocator slabs(12 * kPage, kPage);
  Block a = *slabs.allocate(4 * kPage);
  Block b = *slabs.allocate(4 * kPage);
  Block c = *slabs.allocate(4 * kPage);
  CHECK_FALSE(slabs.allocate(kPage));
  slabs.free(a);
  slabs.free(c);
  CHECK(slabs.stats().largest_free_block == 4 * kPage);
  slabs.free(b);  // joins both neighbours
  CHECK(slabs.stats().largest_free_block == 12 * kPage);
  auto whole = slabs.allocate(12 * kPage);
  REQUIRE(whole);
  CHECK(whole->offset == 0);
  CHECK(slabs.check_invariants());
}

TEST_CASE("slab allocator: exhaustion leaves the allocator unchanged and usable") {
  SlabAllocator slabs(8 * kPage, kPage);
  Block a = *slabs.allocate(6 * kPage);
  const spill::AllocatorStats before = slabs.stats();
  CHECK_FALSE(slabs.allocate(4 * kPage));
  const spill::AllocatorStats after = slabs.stats();
  CHECK(after.bytes_in_use == before.bytes_in_use);
  CHECK(after.allocations == before.allocations);
  CHECK(slabs.allocate(2 * kPage));
  slabs.free(a);
  CHECK(slabs.allocate(6 * kPage));
  CHECK(slabs.check_invariants());
}

TEST_CASE("slab allocator: zero bytes and double frees are refused") {
  SlabAllocator slabs(8 * kPage, kPage);
  CHECK_THROWS_AS(slabs.allocate(0), spill::InvalidArgumentError);
  Block a = *slabs.allocate(kPage);
  slabs.free(a);
  CHECK_THROWS_AS(slabs.free(a), spill::InvalidArgumentError);
  CHECK(slabs.check_invariants());
}

TEST_CASE("slab allocator: stats are exact") {
  SlabAllocator slabs(64 * kPage, kPage);
  Block a = *slabs.allocate(100);
  Block b = *slabs.allocate(5 * kPage + 1);  // 6 pages
  spill::AllocatorStats s = slabs.stats();
  CHECK(s.capacity_bytes == 64 * kPage);
  CHECK(s.bytes_in_use == 7 * kPage);
  CHECK(s.bytes_requested == 100 + 5 * kPage + 1);
  CHECK(s.live_blocks == 2);
  CHECK(s.allocations == 2);
  CHECK(s.frees == 0);
  CHECK(s.free_bytes == 57 * kPage);
  CHECK(s.largest_free_block == 57 * kPage);
  slabs.free(a);
  s = slabs.stats();
  CHECK(s.bytes_in_use == 6 * kPage);
  CHECK(s.peak_bytes_in_use == 7 * kPage);
  CHECK(s.bytes_requested == 5 * kPage + 1);
  CHECK(s.frees == 1);
  CHECK(s.largest_free_block == 57 * kPage);
  slabs.free(b);
  CHECK(slabs.stats().largest_free_block == 64 * kPage);
  CHECK(slabs.stats().reuse_hits == 0);
}

TEST_CASE("slab allocator: concurrent allocate and free keep every invariant") {
  SlabAllocator slabs(256 * kMiB, kPage);
  constexpr int kThreads = 4;
  constexpr int kRounds = 4000;
  std::vector<std::thread> threads;
  std::vector<std::vector<Block>> leftovers(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::vector<Block> mine;
      for (int i = 0; i < kRounds; ++i) {
        if (mine.empty() || rng() % 3 != 0) {
          if (auto b = slabs.allocate(1 + rng() % (2 * kMiB))) mine.push_back(*b);
        } else {
          std::swap(mine[rng() % mine.size()], mine.back());
          slabs.free(mine.back());
          mine.pop_back();
        }
      }
      leftovers[t] = mine;
    });
  }
  for (auto& th : threads) th.join();
  CHECK(slabs.check_invariants());
  std::uint64_t live = 0;
  std::vector<Block> all;
  for (auto& v : leftovers) {
    live += v.size();
    all.insert(all.end(), v.begin(), v.end());
  }
  std::sort(all.begin(), all.end(),
            [](const Block& a, const Block& b) { return a.offset < b.offset; });
  for (std::size_t i = 1; i < all.size(); ++i)
    CHECK(all[i - 1].offset + all[i - 1].size <= all[i].offset);
  CHECK(slabs.stats().live_blocks == live);
  // Blocks allocated on one thread may be freed on another.
  for (auto& v : leftovers)
    for (const Block& b : v) slabs.free(b);
  CHECK(slabs.stats().bytes_in_use == 0);
  CHECK(slabs.stats().largest_free_block == 256 * kMiB);
}

TEST_CASE("slab allocator: a random workload agrees with a page-map reference model") {
  constexpr std::uint64_t kPages = 2048;
  SlabAllocator slabs(kPages * kPage, kPage);
  std::vector<bool> used(kPages, false);
  std::vector<Block> live;
  std::mt19937_64 rng(42);
  auto longest_free_run = [&] {
    std::uint64_t best = 0, run = 0;
    for (bool u : used) {
      run = u ? 0 : run + 1;
      best = std::max(best, run);
    }
    return best;
  };
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || rng() % 2 == 0) {
      const std::uint64_t bytes = 1 + rng() % (96 * kPage);
      const std::uint64_t want_pages = SlabAllocator::rounded_size(bytes, kPage) / kPage;
      const bool fits = longest_free_run() >= want_pages;
      auto b = slabs.allocate(bytes);
      REQUIRE(b.has_value() == fits);
      if (!b) continue;
      for (std::uint64_t p = b->offset / kPage; p < (b->offset + b->size) / kPage; ++p) {
        REQUIRE_FALSE(used[p]);
        used[p] = true;
      }
      live.push_back(*b);
    } else {
      std::swap(live[rng() % live.size()], live.back());
      const Block b = live.back();
      live.pop_back();
      slabs.free(b);
      for (std::uint64_t p = b.offset / kPage; p < (b.offset + b.size) / kPage; ++p)
        used[p] = false;
    }
    if (i % 997 == 0) {
      REQUIRE(slabs.check_invariants());
      REQUIRE(slabs.stats().largest_free_block == longest_free_run() * kPage);
    }
  }
  CHECK(slabs.check_invariants());
}

// Found by the fuzzer (docs/fuzzing.md): requests above 2^62 bytes were returned unrounded.
TEST_CASE("slab allocator: huge requests under a huge capacity stay aligned, or are refused") {
  SlabAllocator slabs(~0ull, 128);
  auto b = slabs.allocate((1ull << 62) + 1);
  REQUIRE(b);
  CHECK(b->size % 128 == 0);
  auto c = slabs.allocate(1);
  REQUIRE(c);
  CHECK(c->offset % 128 == 0);
  CHECK(SlabAllocator::rounded_size(~0ull, 128) == ~0ull);
  CHECK_FALSE(slabs.allocate(~0ull - 5));
}

// tests/CMakeLists.txt compiles the allocator into this test with SPILLARENA_EXPENSIVE_CHECKS, so
// each allocate and free below also runs the allocator's own validity check, which aborts the
// test on a broken invariant. See Note [Expensive checks] in src/core/alloc/slab_allocator.cc.
#if !SPILLARENA_EXPENSIVE_CHECKS
#error "slab_allocator_test is built with SPILLARENA_EXPENSIVE_CHECKS=1 (tests/CMakeLists.txt)"
#endif

TEST_CASE("slab allocator: every invariant holds after each operation of a random workload") {
  const std::uint64_t capacity = 1ull << 30;  // offsets only: the allocator touches no memory
  SlabAllocator slabs(capacity, kPage);
  std::mt19937_64 rng(11);
  std::vector<Block> live;
  auto random_bytes = [&]() -> std::uint64_t {
    switch (rng() % 8) {
      case 0:
        return SlabAllocator::kExactCarveAboveBytes + 1 + rng() % (8 * kPage);  // exact
      case 1:
      case 2:
        return 1 + rng() % (4 * kPage);  // <= 4 pages
      default:
        return 1 + rng() % (300 * kPage);  // classes
    }
  };
  for (int i = 0; i < 6000; ++i) {
    const std::uint64_t op = rng() % 8;
    if (live.empty() || op < 4) {
      if (auto b = slabs.allocate(random_bytes())) live.push_back(*b);
    } else if (op < 7) {  // a random block: holes that must not coalesce, then ones that must
      std::swap(live[rng() % live.size()], live.back());
      slabs.free(live.back());
      live.pop_back();
    } else {  // newest first, as backward frees a step's regions
      for (std::uint64_t n = 1 + rng() % 8; n > 0 && !live.empty(); --n) {
        slabs.free(live.back());
        live.pop_back();
      }
    }
    REQUIRE(slabs.check_invariants());
  }
  for (const Block& b : live) slabs.free(b);
  CHECK(slabs.check_invariants());
  CHECK(slabs.stats().largest_free_block == capacity);
}
