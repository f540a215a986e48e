#include "spill/sizing.h"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "core/alloc/slab_allocator.h"
#include "core/os/platform.h"
#include "core/os/recent_reading.h"
#include "core/stash/host_pool.h"
#include "spill/core.h"

TEST_CASE("sizing: a layer input is rounded as the arena rounds it") {
  // 1 x 8192 x 4096 x 2 bytes = 64 MiB: already page aligned, carved exactly.
  CHECK(spill::bytes_for_layer_inputs(32, {1, 8192, 4096}, 2) == 32 * 64 * spill::MiB);
  const std::uint64_t odd = spill::bytes_for_layer_input({3, 1000, 777}, 4);
  CHECK(odd == spill::SlabAllocator::rounded_size(3ull * 1000 * 777 * 4));
  CHECK(spill::bytes_for_layer_inputs(5, {3, 1000, 777}, 4) == 5 * odd);
}

TEST_CASE("sizing: an arena of the computed capacity holds exactly that many layer inputs") {
  const spill::ActivationShape shape{2, 333, 1000};
  spill::ArenaOptions o;
  o.capacity_bytes = spill::bytes_for_layer_inputs(6, shape, 2);
  o.backing = spill::Backing::ram;
  spill::SpillArena arena(o);
  std::vector<spill::Region> regions;
  for (int i = 0; i < 6; ++i) regions.push_back(arena.allocate(2ull * 333 * 1000 * 2));
  CHECK_THROWS_AS(arena.allocate(2ull * 333 * 1000 * 2), spill::ArenaExhaustedError);
}

TEST_CASE("sizing: zero dimensions and overflow are refused") {
  CHECK_THROWS_AS(spill::bytes_for_layer_inputs(0, {1, 1, 1}, 2), spill::InvalidArgumentError);
  CHECK_THROWS_AS(spill::bytes_for_layer_inputs(1, {1, 0, 1}, 2), spill::InvalidArgumentError);
  CHECK_THROWS_AS(spill::bytes_for_layer_inputs(1, {1, 1, 1}, 0), spill::InvalidArgumentError);
  CHECK_THROWS_AS(spill::bytes_for_layer_inputs(1ull << 40, {1ull << 20, 1ull << 20, 1}, 2),
                  spill::InvalidArgumentError);
}

// Note [Reading memory once in a while] in src/core/stash/host_pool.cc
TEST_CASE("sizing: a costly reading is taken again only once it is old") {
  static std::uint64_t taken = 0;
  const auto read = []() -> std::uint64_t { return ++taken; };
  spill::detail::RecentReading kept(std::chrono::hours(1), read);
  CHECK(kept.get() == 1);
  CHECK(kept.get() == 1);
  CHECK(kept.reads() == 1);
  spill::detail::RecentReading fresh(std::chrono::nanoseconds(0), read);
  CHECK(fresh.get() == 2);
  CHECK(fresh.get() == 3);
  CHECK(fresh.reads() == 2);
}

TEST_CASE("sizing: the automatic host budget saturates instead of overflowing") {
  using spill::detail::automatic_host_pool_bytes;
  const std::uint64_t ceiling = automatic_host_pool_bytes(UINT64_MAX, 1);  // usable / 2, memlock
  CHECK(ceiling % spill::platform::capabilities().page_size_bytes == 0);
  CHECK(automatic_host_pool_bytes(1, 1) <= 64 * spill::MiB);
  // 2^62 x 4 wraps to 0 in 64 bits: the budget would fall to its 64 MiB floor.
  CHECK(automatic_host_pool_bytes(std::uint64_t{1} << 62, 4) == ceiling);
  CHECK(automatic_host_pool_bytes(UINT64_MAX, 0) == automatic_host_pool_bytes(1, 1));
}
