// The arena stash when the arena has no room: inputs kept in memory for the step, gradients
// unchanged, the arena grown for the next step. See Note [Growing the arena] in
// src/core/arena/arena_growth.cc.
#include <torch/torch.h>  // before doctest: c10 defines CHECK too, and doctest's must win

#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gpt_test_support.h"
#include "spill/spill.h"
#include "test_support.h"
#include "torch_warnings.h"

using spill_test::ScratchDir;
using spill_test::SpillarenaWarnings;
using namespace spill_test::gpt;

namespace {

// Writes still in flight when a step failed hold their regions until they complete (the
// progress thread's last reference): live regions drain shortly after, never stay.
bool drains(const spill::SpillArena& arena) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (arena.stats().live_regions != 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// The bytes of one GPT block input of GptReference(8, ..., {2, 16, 64}).
constexpr std::uint64_t kInputBytes = 2 * 16 * 64 * 4;

}  // namespace

TEST_CASE("stash overflow: an arena for 2 inputs of 8 keeps 6 in memory, then grows") {
  ScratchDir dir;
  GptReference g(8, 11, {2, 16, 64});
  spill::SpillArena arena = make_arena(dir.path(), 2 * kInputBytes);
  auto stash = spill::make_arena_stash(arena);
  SpillarenaWarnings warnings;
  g.check(gpt_step(g.blocks, stash, g.x0));
  spill::ArenaStats s = arena.stats();
  CHECK(s.overflows == 6);
  CHECK(s.overflow_bytes == 6 * kInputBytes);
  CHECK(s.capacity_needed_bytes == 8 * kInputBytes);
  CHECK(s.live_regions == 0);
  CHECK(stash->stats().inputs_spilled == 2);
  REQUIRE(warnings.messages.size() == 1);
  CHECK(warnings.messages[0].find("stays in memory for this step") != std::string::npos);

  g.check(gpt_step(g.blocks, stash, g.x0));
  s = arena.stats();
  CHECK(s.grows == 1);
  CHECK(s.overflows == 6);  // none in the second step
  CHECK(s.capacity_bytes >= 8 * kInputBytes);
  CHECK(stash->stats().inputs_spilled == 2 + 8);
  CHECK(warnings.messages.size() == 1);  // once per arena
}

TEST_CASE("stash overflow: when_full = error raises, and the next step runs") {
  ScratchDir dir;
  GptReference g(4, 12, {2, 16, 64});
  spill::ArenaOptions o = spill_test::options_in(dir.path(), 2 * kInputBytes);
  o.when_full = spill::WhenFull::error;
  spill::SpillArena arena(o);
  spill::StashOptions every_input;
  every_input.keep_last = 0;
  spill::set_stash_options(arena, every_input);
  auto stash = spill::make_arena_stash(arena);
  CHECK_THROWS_AS(gpt_step(g.blocks, stash, g.x0), spill::ArenaExhaustedError);
  // The graph of the failed forward is gone: so are its regions.
  CHECK(drains(arena));
  CHECK(arena.stats().overflows == 1);
  // With grow (the default) the arena fits the next step: only the refusal was needed.
  auto fresh = spill::make_arena_stash(arena);
  g.check(gpt_step(g.blocks, fresh, g.x0));
}

TEST_CASE("stash overflow: a full disk keeps inputs in memory, warns, and training goes on") {
  spill_test::LoopMount disk(16);
  if (!disk.ok()) {
    MESSAGE("skipped: " << disk.reason());
    return;
  }
  GptReference g(6, 13, {4, 128, 64});  // 128 KiB inputs
  const std::uint64_t input = 4 * 128 * 64 * 4;
  spill::SpillArena arena = make_arena(disk.path(), 2 * input);
  auto stash = spill::make_arena_stash(arena);
  // Fill the file system but 256 KiB, less than any grow needs.
  const std::string ballast = disk.path() + "/ballast";
  const std::uintmax_t available = std::filesystem::space(disk.path()).available;
  const std::string fill = "fallocate -l " + std::to_string(available - 256 * 1024) + " " + ballast;
  REQUIRE(std::system(fill.c_str()) == 0);
  SpillarenaWarnings warnings;
  for (int step = 0; step < 3; ++step) g.check(gpt_step(g.blocks, stash, g.x0));
  const spill::ArenaStats s = arena.stats();
  CHECK(s.grows == 0);
  CHECK(s.grow_failures == 2);
  CHECK(s.overflows == 3 * 4);
  REQUIRE(warnings.messages.size() == 2);
  CHECK(warnings.messages[1].find(disk.path()) != std::string::npos);
  CHECK(warnings.messages[1].find("free") != std::string::npos);
  std::remove(ballast.c_str());
  CHECK(spill_test::list_dir(disk.path()) == std::set<std::string>{"lost+found"});
}
