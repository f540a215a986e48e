#include "spill/sizing.h"

#include <doctest/doctest.h>

#include <vector>

#include "core/alloc/slab_allocator.h"
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
