#include "train_summary.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <iomanip>
#include <sstream>
#include <type_traits>

#include "memory_budget.h"
#include "spill/tensor_stash.h"
#include "spill/units.h"

namespace spill::cli {
namespace {

// ArenaStats or StashStats, keyed by field name.
template <class Stats>
nlohmann::json stats_json(const Stats& a) {
  nlohmann::json j;
  visit_fields(a, [&](const char* name, const auto& value) {
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
  j["cgroup_beyond_rss_anon_bytes"] =
      s.memory.cgroup_version ? nlohmann::json(cgroup_beyond_anonymous(s)) : nlohmann::json(nullptr);
  j["returns_freed_memory"] = s.returns_freed_memory;
  return j;
}

void print_json(const TrainRequest& r, const Summary& s, const SpillArena* arena,
                std::ostream& out) {
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
  j["diverged_at_step"] = s.diverged_at_step ? nlohmann::json(s.diverged_at_step) : nlohmann::json(nullptr);
  j["arena"] = arena ? stats_json(arena->stats()) : nlohmann::json(nullptr);
  j["stash"] = arena ? stats_json(stash_stats(*arena)) : nlohmann::json(nullptr);
  out << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
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
    << s.loss << std::setprecision(0) << "  "
    << static_cast<double>(r.batch * r.seq) / s.seconds << " tok/s";
  if (arena) {
    const ArenaStats a = arena->stats();
    t << "  arena " << human_bytes(a.bytes_in_use) << " / peak " << human_bytes(a.peak_bytes_in_use);
  }
  t << std::setprecision(2) << "  spill " << static_cast<double>(s.io_bytes) / s.seconds / 1e9
    << " GB/s  ETA " << std::setprecision(0) << mean_s * static_cast<double>(r.steps - step)
    << " s";
  return t.str();
}

void print_summary(const TrainRequest& r, const Summary& s, const SpillArena* arena,
                   std::ostream& out) {
  if (r.json) return print_json(r, s, arena, out);
  out << std::fixed << std::setprecision(3) << "\nsummary (" << r.mode << ", "
      << torch::get_num_threads() << " LibTorch threads)\n"
      << "  loss            " << s.losses.front() << " -> " << s.losses.back() << "\n"
      << std::setprecision(1) << "  time per step   " << s.step_ms_mean << " ms ("
      << std::setprecision(0) << s.tokens_per_s << " tokens/s)\n";
  print_memory(s, out);
  out << "  spilled / step  " << human_bytes(s.spilled_per_step) << "\n";
  if (arena) {
    const ArenaStats a = arena->stats();
    const StashStats st = stash_stats(*arena);
    out << "  arena           capacity " << human_bytes(a.capacity_bytes) << ", peak in use "
        << human_bytes(a.peak_bytes_in_use) << ", " << a.allocations << " allocations, "
        << a.reuse_hits << " reuse hits, written " << human_bytes(a.bytes_written) << ", read "
        << human_bytes(a.bytes_read) << "\n"
        << "  I/O engine      " << to_string(a.io_mode) << " I/O on " << to_string(a.io_backend)
        << (a.staging_bytes ? ", staging " + human_bytes(a.staging_bytes) : std::string()) << "; "
        << a.io_note << "\n"
        << "  waits           " << a.staging_waits << " for staging ("
        << std::setprecision(1) << static_cast<double>(a.staging_wait_ns) / 1e6 << " ms), "
        << st.restore_waits << " of " << st.restores << " restores ("
        << static_cast<double>(st.restore_wait_ns) / 1e6 << " ms); prefetch hits "
        << st.prefetch_hits << " of " << st.prefetches << "\n"
        << "  integrity       XXH3 of " << human_bytes(a.bytes_hashed) << " written, "
        << human_bytes(a.bytes_verified) << " verified on read back, " << a.integrity_failures
        << " failures\n";
  }
  if (!s.sample.empty()) out << "  sample          " << s.sample << "\n";
}

}  // namespace spill::cli
