#include "train_summary.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <iomanip>
#include <sstream>
#include <type_traits>

#include "core/arena/arena_fields.h"
#include "core/stash/stash_fields.h"
#include "memory_budget.h"
#include "spill/arena.h"
#include "spill/sizing.h"
#include "spill/tensor_stash.h"
#include "spill/units.h"

namespace spill::cli {
namespace {

// ArenaStats, ArenaOptions or StashStats, keyed by field name.
template <class Stats>
nlohmann::json stats_json(const Stats& a) {
  nlohmann::json j;
  detail::visit_fields(a, [&](const char* name, const auto& value) {
    if constexpr (std::is_enum_v<std::decay_t<decltype(value)>>) {
      j[name] = to_string(value);
    } else {
      j[name] = value;
    }
  });
  return j;
}

// Note [Memory beyond RssAnon]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A memory cgroup charges page cache too: the spill file's pages (dirty until written back) and
// whatever else the process read. usage - RssAnon at the end of the run is that share (plus a
// little kernel memory); with a dedicated cgroup it is mostly the spill file.
std::uint64_t cgroup_beyond_anonymous(const Summary& s) {
  const std::uint64_t usage = s.memory.cgroup_usage_bytes;
  return usage > s.rss_anon_at_end ? usage - s.rss_anon_at_end : 0;
}

nlohmann::json memory_json(const Summary& s) {
  nlohmann::json j = cgroup_json(s.memory);
  j["peak_rss_anon_bytes"] = s.peak_rss_anon;
  j["cgroup_beyond_rss_anon_bytes"] = s.memory.cgroup_version
                                          ? nlohmann::json(cgroup_beyond_anonymous(s))
                                          : nlohmann::json(nullptr);
  j["returns_freed_memory"] = s.returns_freed_memory;
  return j;
}

// Kept in RAM = what in-RAM checkpointing holds less what went to the arena (the newest
// keep_last inputs of a step are never spilled).
std::uint64_t kept_in_ram(const Summary& s) {
  return s.layer_inputs_per_step > s.spilled_per_step ? s.layer_inputs_per_step - s.spilled_per_step
                                                      : 0;
}

nlohmann::json layer_inputs_json(const Summary& s) {
  if (!s.arena) return nullptr;
  return {{"in_ram_checkpointing_bytes_per_step", s.layer_inputs_per_step},
          {"stored_per_step", s.inputs_per_step},
          {"spilled_per_step", s.inputs_spilled_per_step},
          {"spilled_bytes_per_step", s.spilled_per_step},
          {"kept_in_ram_bytes_per_step", kept_in_ram(s)}};
}

nlohmann::json comparison_json(const Summary& s) {
  if (!s.comparison_skipped.empty()) return {{"skipped", s.comparison_skipped}};
  if (s.compared_steps == 0) return nullptr;
  return {{"steps", s.compared_steps},
          {"step_ms", s.compared_ms},
          {"recompute_step_ms", s.compared_recompute_ms},
          {"ratio", s.compared_ms / s.compared_recompute_ms}};
}

void print_json(const TrainRequest& r, const Summary& s, std::ostream& out) {
  nlohmann::json j = {{"mode", r.mode},
                      {"steps", r.steps},
                      {"steps_run", s.losses.size()},
                      {"threads", torch::get_num_threads()},
                      {"losses", s.losses},
                      {"first_loss", s.losses.front()},
                      {"final_loss", s.losses.back()},
                      {"step_ms_mean", s.step_ms_mean},
                      {"tokens_per_s", s.tokens_per_s},
                      {"peak_rss_anon_bytes", s.peak_rss_anon},
                      {"spilled_bytes_per_step", s.spilled_per_step},
                      {"memory", memory_json(s)},
                      {"sample", s.sample}};
  j["diverged_at_step"] =
      s.diverged_at_step ? nlohmann::json(s.diverged_at_step) : nlohmann::json(nullptr);
  j["layer_inputs"] = layer_inputs_json(s);
  j["recompute_comparison"] = comparison_json(s);
  j["arena"] = s.arena ? stats_json(*s.arena) : nlohmann::json(nullptr);
  j["arena_options"] = s.arena_options ? stats_json(*s.arena_options) : nlohmann::json(nullptr);
  j["stash"] = s.arena ? stats_json(s.stash) : nlohmann::json(nullptr);
  out << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

// The layer inputs in-RAM checkpointing would hold against where this run put them, and the
// step time against recompute mode (Note [What spilling costs in time] in train_command.cc).
void print_what_it_bought(const TrainRequest& r, const Summary& s, std::ostream& out) {
  const std::string where = r.mode == "ram" ? "the RAM arena" : "the spill file";
  if (s.arena) {
    out << "  layer inputs    " << s.inputs_per_step << " per step, "
        << human_bytes(s.layer_inputs_per_step) << ": in-RAM checkpointing holds them all; "
        << "this run wrote " << s.inputs_spilled_per_step << " (" << human_bytes(s.spilled_per_step)
        << ") to " << where << " and kept "
        << s.inputs_per_step - std::min(s.inputs_per_step, s.inputs_spilled_per_step) << " ("
        << human_bytes(kept_in_ram(s)) << ") in RAM\n";
  }
  if (s.compared_steps > 0) {
    out << std::setprecision(2) << "  vs in-RAM       " << s.compared_ms / s.compared_recompute_ms
        << "x the step time of in-RAM checkpointing (" << std::setprecision(1) << s.compared_ms
        << " ms vs " << s.compared_recompute_ms << " ms, " << s.compared_steps
        << " alternating steps each after training)\n";
  }
  if (!s.comparison_skipped.empty()) {
    out << "  vs in-RAM       not measured: " << s.comparison_skipped << "\n";
  }
}

std::string counted(std::uint64_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// Note [The capacity to give is the arena's figure]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Two figures, each with one name: the capacity a step needed (capacity_needed_bytes), and the
// capacity to give, that times --growth-margin in whole pages: what a grow aims at and what the
// arena's first-overflow warning tells a --no-grow run to pass (ArenaCore::grow_target in
// src/core/arena/arena_growth.cc). The summary once named the bare need as the --capacity that
// "would have held it" while the warning asked for at least the figure with the margin ("12.00
// KiB" against "8.00 KiB" in one run). It now names the same kind of figure, from the function
// the arena computes it with (spill::capacity_with_margin) applied to the step's whole need; the
// warning, given at the first overflow, applies it to the need so far, a lower bound, so its
// figure can be smaller, never larger.

// What grew, or why nothing did: the arena overflowed at the last step (the grow comes at the
// next one's first store), growing is off, or the disk refused (grow_note says why).
std::string growth_text(const TrainRequest& r, const ArenaStats& a) {
  std::ostringstream t;
  if (a.grows > 0) {
    t << "grew " << counted(a.grows, "time", "times") << ", "
      << human_bytes(a.initial_capacity_bytes) << " -> " << human_bytes(a.capacity_bytes)
      << " (--growth-margin " << format_real(r.growth_margin) << ")";
  } else if (!r.grow) {
    t << "growing is off (--no-grow): give a --capacity of at least "
      << human_bytes(capacity_with_margin(a.capacity_needed_bytes, r.growth_margin))
      << " (the capacity needed times --growth-margin " << format_real(r.growth_margin)
      << ", in whole pages)";
  } else if (a.grow_failures == 0) {
    t << "not grown yet (the arena grows at the first store of the step after an overflow)";
  } else {
    t << "never grew";
  }
  if (a.grow_failures > 0) {
    t << "; " << counted(a.grow_failures, "grow", "grows") << " refused: " << a.grow_note;
  }
  return t.str();
}

// Only for an arena that ran out of room (Note [Growing the arena] in
// src/core/arena/arena_growth.cc): one sized right from the start prints nothing here (the JSON has
// the fields either way).
void print_sizing(const TrainRequest& r, const ArenaStats& a, std::ostream& out) {
  if (a.overflows == 0 && a.grows == 0 && a.grow_failures == 0) return;
  out << "  sizing          " << counted(a.overflows, "input", "inputs") << " found no room ("
      << human_bytes(a.overflow_bytes) << ", kept in RAM for their step), capacity needed "
      << human_bytes(a.capacity_needed_bytes) << "; " << growth_text(r, a) << "\n";
}

void print_memory(const Summary& s, std::ostream& out) {
  out << "  peak RssAnon    " << human_bytes(s.peak_rss_anon)
      << (s.returns_freed_memory ? "" : " (freed memory kept by malloc: --keep-freed-memory)")
      << "\n  cgroup          " << cgroup_text(s.memory);
  if (s.memory.cgroup_version) {
    out << "; beyond RssAnon now " << human_bytes(cgroup_beyond_anonymous(s))
        << " (page cache, mostly the spill file)";
  }
  out << "\n";
}

}  // namespace

std::string progress_text(const TrainRequest& r, std::int64_t step, const StepRecord& s,
                          double mean_s, const SpillArena* arena) {
  std::ostringstream t;
  t << std::fixed << std::setprecision(3) << "step " << step << "/" << r.steps << "  loss "
    << s.loss << std::setprecision(0) << "  " << static_cast<double>(r.batch * r.seq) / s.seconds
    << " tok/s";
  const ArenaStats a = arena ? arena->stats() : ArenaStats{};
  if (arena) {
    t << "  arena " << human_bytes(a.bytes_in_use) << " / peak "
      << human_bytes(a.peak_bytes_in_use);
  }
  t << std::setprecision(2) << "  spill " << static_cast<double>(s.io_bytes) / s.seconds / 1e9
    << " GB/s  ETA " << std::setprecision(0) << mean_s * static_cast<double>(r.steps - step)
    << " s";
  if (s.grows > 0) t << "  arena grew to " << human_bytes(a.capacity_bytes);
  if (s.overflows > 0) t << "  " << s.overflows << " kept in RAM (no room in the arena)";
  return t.str();
}

void print_summary(const TrainRequest& r, const Summary& s, std::ostream& out) {
  if (r.json) return print_json(r, s, out);
  out << std::fixed << std::setprecision(3) << "\nsummary (" << r.mode << ", "
      << torch::get_num_threads() << " LibTorch threads)\n"
      << "  loss            " << s.losses.front() << " -> " << s.losses.back() << "\n"
      << std::setprecision(1) << "  time per step   " << s.step_ms_mean << " ms ("
      << std::setprecision(0) << s.tokens_per_s << " tokens/s)\n";
  print_what_it_bought(r, s, out);
  print_memory(s, out);
  if (s.arena) {
    const ArenaStats& a = *s.arena;
    const StashStats& st = s.stash;
    out << "  arena           capacity " << human_bytes(a.capacity_bytes) << ", peak in use "
        << human_bytes(a.peak_bytes_in_use) << ", " << a.allocations << " allocations, "
        << a.reuse_hits << " reuse hits, written " << human_bytes(a.bytes_written) << ", read "
        << human_bytes(a.bytes_read) << "\n";
    print_sizing(r, a, out);
    out << "  I/O engine      " << to_string(a.io_mode) << " I/O on " << to_string(a.io_backend)
        << (a.staging_bytes ? ", staging " + human_bytes(a.staging_bytes) : std::string()) << "; "
        << a.io_note << "\n"
        << "  waits           " << a.staging_waits << " for staging (" << std::setprecision(1)
        << static_cast<double>(a.staging_wait_ns) / 1e6 << " ms), " << st.restore_waits << " of "
        << st.restores << " restores (" << static_cast<double>(st.restore_wait_ns) / 1e6
        << " ms); prefetch hits " << st.prefetch_hits << " of " << st.prefetches << "\n"
        << "  integrity       XXH3 over " << human_bytes(a.bytes_hashed)
        << " (written and read back), " << human_bytes(a.bytes_verified)
        << " of the reads matched their write, " << a.integrity_failures << " failures\n";
  }
  if (!s.sample.empty()) out << "  sample          " << s.sample << "\n";
}

}  // namespace spill::cli
