// ArenaCore's sizing: allocation with overflow counting, and the grow at a safe moment.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "core/arena/arena_core.h"
#include "core/os/platform.h"
#include "core/text/quote.h"
#include "spill/error.h"
#include "spill/sizing.h"
#include "spill/units.h"

namespace spill::detail {

// Note [Growing the arena]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A capacity fixed before the first step was a trap: the batch that needs more arrives hours in
// (a longer sequence, an evaluation shape, a larger micro-batch) and ended the run. Now an
// allocation that finds no room is an overflow, counted with its bytes; the stash keeps that
// input in memory for the step (WhenFull::keep_in_memory) or raises (WhenFull::error). Between
// two moments with no region live the arena tracks the most that was live at once: bytes in
// regions plus the bytes of overflowed inputs still held (capacity_needed_bytes).
//
// An overflow is held by the empty Region that try_allocate or spill_from returned for it (the
// stash keeps it with the input it kept in memory): while it lives its rounded bytes count, and
// when it dies — the input restored or freed — they leave the sum. Counting every overflow since
// the last empty moment instead, as the arena once did, made the figure climb step after step
// whenever the arena never emptied (a graph kept alive by a traceback, two interleaved models on
// one arena, accumulation that never drains) and the first empty moment grew the file to that
// total: 418 times what was ever live in one reproduction. A graph that is never backwarded
// therefore holds its bytes — its regions stay live, its overflowed inputs stay counted — but
// does not multiply them: each step's demand is what was live at once, that graph included, and
// a grow never makes the file larger than growth_margin times that peak (in whole pages; a
// capacity given larger at the start stays). An empty moment starts the next window
// from the overflow still held, not from zero, for the same reason.
//
// With ArenaOptions::grow, the next allocation that finds no region live — the first store of the
// next step, after backward freed everything — grows the storage to that figure times
// growth_margin before it allocates: the file is re-preallocated (free space checked first, Note
// [Preallocate, never sparse] in spill_file.cc) and mapped anew, and the allocator's range
// extended. Only then: with no region live nothing refers to the mapping (regions never move, a
// restored RAM view keeps its region live, the I/O engine touches the mapping only for live
// regions), so replacing it is safe. The allocation that finds the arena empty pays for the
// grow: normally the first store of a step, but a step whose regions are all freed part-way
// pays for it in its middle — an arena so small that every input so far overflowed (no region
// is live at the next store: it grows there, to what is held), two models on one arena with one
// backwarded before the other's forward goes on, a checkpoint called outside a training loop.
// Gradient accumulation keeps regions live across micro-batches (the next forward may begin before
// the last backward freed all), so the grow waits for the first empty moment. A grow the disk
// refuses changes nothing: the overflow goes on being kept in memory, grow_failures counts it and
// one warning names the directory and its free space; the next empty moment tries again.
//
// The arena never shrinks. Its peak is the largest step seen, and that step comes back (the
// longest sequence, the next evaluation); shrinking would give the disk back only to pay for the
// fallocate and a cold file again. Whoever wants the space back makes a new arena.
//
// What is fixed when the arena is made stays fixed: the I/O mode IoMode::automatic chose and the
// host pool. The staging pool grows with the arena (Note [The staging pool follows the arena] in
// src/core/io/io_engine.cc).

namespace {

[[noreturn]] void throw_too_large(std::uint64_t bytes) {
  throw InvalidArgumentError(
      "spill: a region of " + bytes_with_units(bytes) + " (" + std::to_string(bytes) +
      " bytes) is larger than any arena can be (the limit is 1 PiB, "
      "kMaxCapacityBytes); this is likely a size computed in the wrong unit");
}

}  // namespace

// What a grow asks for when `needed` bytes were wanted at once: times growth_margin, whole pages,
// at most the largest arena.
std::uint64_t ArenaCore::grow_target(std::uint64_t needed) const {
  return capacity_with_margin(needed, options_.growth_margin);
}

std::optional<Block> ArenaCore::allocate(std::uint64_t bytes,
                                         std::shared_ptr<void>* overflow_hold) {
  owner_.check("SpillArena::allocate");
  if (bytes > kMaxCapacityBytes) throw_too_large(bytes);
  MutexLock lock(sizing_mutex_);
  grow_if_due();
  std::optional<Block> block = allocator_.allocate(bytes);
  if (!block) {
    *overflow_hold = record_overflow(bytes);
    return block;
  }
  record_demand(allocator_.stats().bytes_in_use);
  return block;
}

// Saturated at the largest arena: more demand than that changes no decision, and the sums (in
// use + overflow, times the margin) stay far from overflowing.
void ArenaCore::record_demand(std::uint64_t bytes_in_use) {
  const std::uint64_t held = std::min(overflow_held_->load(), kMaxCapacityBytes);
  needed_since_empty_ = std::max(needed_since_empty_, bytes_in_use + held);
  needed_peak_ = std::max(needed_peak_, needed_since_empty_);
}

// The overflow's bytes count while the returned hold lives (Note [Growing the arena]).
std::shared_ptr<void> ArenaCore::record_overflow(std::uint64_t bytes) {
  const std::uint64_t rounded =
      SlabAllocator::rounded_size(std::max<std::uint64_t>(bytes, 1), allocator_.alignment_bytes());
  overflow_held_->fetch_add(rounded);
  std::shared_ptr<void> hold(nullptr,
                             [held = overflow_held_, rounded](void*) { held->fetch_sub(rounded); });
  ++overflows_;
  const std::uint64_t most = std::numeric_limits<std::uint64_t>::max();
  overflow_bytes_ = bytes > most - overflow_bytes_ ? most : overflow_bytes_ + bytes;
  record_demand(allocator_.stats().bytes_in_use);
  if (warned_overflow_ || options_.when_full != WhenFull::keep_in_memory) return hold;
  warned_overflow_ = true;
  notices_.push_back(overflow_notice(bytes));
  return hold;
}

// The first overflow's warning: what happened, what the arena does about it, and what the user
// can do. The capacity named is what the step needed so far (a lower bound mid-step).
std::string ArenaCore::overflow_notice(std::uint64_t bytes) const {
  const std::uint64_t capacity = allocator_.capacity_bytes();
  const std::uint64_t fits = grow_target(needed_since_empty_);
  const bool disk = options_.backing == Backing::disk;
  const std::string where = disk ? " in " + quote(options_.directory) : " in RAM";
  std::string text = "spillarena: the arena" + where + " (" + human_bytes(capacity) +
                     ") has no room for an input of " + human_bytes(bytes) +
                     "; it stays in memory for this step, as in-RAM checkpointing would hold it, "
                     "and so will other inputs that do not fit (counted in stats(): overflows, "
                     "overflow_bytes). ";
  if (!options_.grow) {
    return text + "Growing is off (grow = false): give a capacity of at least " +
           human_bytes(fits) + " (" + std::to_string(fits) +
           " bytes), more if stats()['capacity_needed_bytes'] ends higher.";
  }
  text += std::string("Before the next step ") + (disk ? "the spill file" : "the arena") +
          " grows to what this step needed, at least " + human_bytes(fits) + " (" +
          std::to_string(fits) + " bytes; stats(): capacity_needed_bytes, grows)";
  std::uint64_t free_bytes = 0;  // Note [Room is found from the descriptor] (spill_file.cc)
  if (disk && platform::file_free_bytes(storage_->fd(), &free_bytes) == 0) {
    text += ", which needs that much free space in " + quote(options_.directory) + " (" +
            human_bytes(free_bytes) + " free now)";
  }
  return text + ". To preallocate it instead, make the arena with that capacity.";
}

void ArenaCore::grow_if_due() {
  if (allocator_.stats().live_blocks != 0) return;
  // The next window starts from what is still held in memory, not from zero.
  const std::uint64_t needed =
      std::exchange(needed_since_empty_, std::min(overflow_held_->load(), kMaxCapacityBytes));
  const std::uint64_t capacity = allocator_.capacity_bytes();
  if (!options_.grow || needed <= capacity) return;
  const std::uint64_t target = grow_target(needed);
  if (target <= capacity) return;
  // With the margin the disk may refuse what it would give without: the exact need is worth it.
  std::uint64_t tried = target;
  std::string why = storage_->grow(tried);
  if (!why.empty() && round_to_pages(needed) < target) {
    tried = round_to_pages(needed);
    why = storage_->grow(tried);
  }
  if (why.empty()) {
    allocator_.grow(storage_->info().capacity_bytes);
    if (engine_) {
      std::string staging = engine_->fit_staging(storage_->info().capacity_bytes);
      if (!staging.empty()) notices_.push_back("spillarena: after growing the arena, " + staging);
    }
    ++grows_;
    return;
  }
  ++grow_failures_;
  grow_note_ = why;
  if (std::exchange(warned_grow_, true)) return;
  notices_.push_back("spillarena: the arena could not grow from " + human_bytes(capacity) + " to " +
                     human_bytes(tried) + " (a step needed " + human_bytes(needed) + "): " + why +
                     ". Inputs that find no room go on staying in memory (stats(): overflows, "
                     "grow_failures); free space there or choose another directory (SPILL_DIR, "
                     "directory=), and the next step boundary tries again.");
}

std::vector<std::string> ArenaCore::take_notices() {
  MutexLock lock(sizing_mutex_);
  return std::exchange(notices_, {});
}

void ArenaCore::add_sizing_stats(ArenaStats* s) const {
  MutexLock lock(sizing_mutex_);
  s->overflows = overflows_;
  s->overflow_bytes = overflow_bytes_;
  s->capacity_needed_bytes = needed_peak_;
  s->initial_capacity_bytes = options_.capacity_bytes;
  s->grows = grows_;
  s->grow_failures = grow_failures_;
  s->grow_note = grow_note_;
}

}  // namespace spill::detail
