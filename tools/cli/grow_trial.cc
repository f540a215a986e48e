#include "grow_trial.h"

#include <algorithm>
#include <iomanip>
#include <set>
#include <sstream>
#include <type_traits>

#include "clock.h"
#include "core/arena/arena_fields.h"
#include "spill/sizing.h"
#include "spill/units.h"

namespace spill::cli {

// Note [Plan tries a grow]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// An arena a step outgrows is preallocated again, larger, and mapped anew at the next step
// boundary (Note [Growing the arena] in src/core/arena/arena_growth.cc). Whether that works is a
// property of the directory (free space, fallocate, the address space), so plan tries it there,
// within the bytes Note [Plan tries the file system] already allows itself: a one-page arena is
// asked for them (refused: one overflow), then for a page with no region live, which grows the
// file to them (at least two pages, so that they overflow). growth_margin is 1 so the file ends at
// the bytes asked for, not 1.25 times more.
GrowTrial try_growing(const std::string& directory, std::uint64_t bytes) {
  ArenaOptions o;
  o.directory = directory;
  o.capacity_bytes = page_size_bytes();
  o.io = IoMode::buffered;
  o.growth_margin = kMinGrowthMargin;
  SpillArena arena(o);
  arena.try_allocate(std::max(bytes, 2 * o.capacity_bytes));  // empty: no room
  GrowTrial trial;
  const auto t0 = Clock::now();
  const Region grown = arena.try_allocate(page_size_bytes());  // grows first: nothing is live
  trial.grow_ms = seconds_since(t0) * 1e3;
  trial.stats = arena.stats();
  return trial;
}

nlohmann::json to_json(const GrowTrial& trial) {
  static const std::set<std::string> kSizing = {
      "capacity_bytes",         "overflows", "overflow_bytes", "capacity_needed_bytes",
      "initial_capacity_bytes", "grows",     "grow_failures",  "grow_note"};
  nlohmann::json j;
  detail::visit_fields(trial.stats, [&](const char* name, const auto& value) {
    if constexpr (!std::is_enum_v<std::decay_t<decltype(value)>>) {
      if (kSizing.count(name) != 0) j[name] = value;
    }
  });
  j["grow_ms"] = trial.grow_ms;
  return j;
}

std::string describe(const GrowTrial& trial) {
  const ArenaStats& a = trial.stats;
  std::ostringstream t;
  t << std::fixed << std::setprecision(1);
  if (a.grows == 0) {
    t << "no: an arena here could not grow from " << human_bytes(a.initial_capacity_bytes) << " to "
      << human_bytes(a.capacity_needed_bytes) << ": " << a.grow_note;
    return t.str();
  }
  t << "yes: an arena of " << human_bytes(a.initial_capacity_bytes) << " overflowed by "
    << human_bytes(a.overflow_bytes) << " and grew to " << human_bytes(a.capacity_bytes) << " in "
    << trial.grow_ms << " ms (" << a.overflows << " overflow, " << a.grows << " grow, "
    << a.grow_failures << " failures)";
  return t.str();
}

}  // namespace spill::cli
