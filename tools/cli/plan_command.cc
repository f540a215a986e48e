#include "plan_command.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>
#include <vector>

#include "clock.h"
#include "core/alloc/slab_allocator.h"
#include "core/arena/arena_internals.h"
#include "core/text/quote.h"
#include "failures.h"
#include "grow_trial.h"
#include "memory_budget.h"
#include "spill/core.h"
#include "spill/units.h"

namespace spill::cli {
namespace {

struct Probe {
  std::uint64_t bytes = 0;
  double write_gbps = 0;
  double read_gbps = 0;
};

constexpr std::uint64_t kProbeChunkBytes = 16ull << 20;

// Note [Sizing the probe arena]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The allocator rounds each request up to its size class (a 9 MiB tail takes 10 MiB), so an
// arena of exactly `bytes` runs out on the last chunk. Its capacity is the sum of the rounded
// chunks, computed with the allocator's own rounding.
std::uint64_t probe_capacity(std::uint64_t bytes) {
  const std::uint64_t full = bytes / kProbeChunkBytes;
  const std::uint64_t tail = bytes % kProbeChunkBytes;
  return full * SlabAllocator::rounded_size(kProbeChunkBytes) +
         (tail ? SlabAllocator::rounded_size(tail) : 0);
}

// Writes `bytes` through a real arena in 16 MiB regions, waits until they are on disk and out of
// the page cache, then reads them back: the disk's rates as the spill path sees them.
Probe probe_bandwidth(const std::string& dir, std::uint64_t bytes) {
  ArenaOptions o;
  o.directory = dir;
  o.capacity_bytes = probe_capacity(bytes);
  o.io = IoMode::buffered;  // the page-cache path drop_cached_pages measures
  SpillArena arena(o);
  std::vector<char> buffer(kProbeChunkBytes, 'x');
  std::vector<Region> regions;
  auto t0 = Clock::now();
  for (std::uint64_t done = 0; done < bytes; done += kProbeChunkBytes) {
    regions.push_back(arena.allocate(std::min(kProbeChunkBytes, bytes - done)));
    regions.back().write(buffer.data(), regions.back().requested_bytes());
  }
  // Waits for writeback: the disk's write rate.
  for (auto& r : regions) spill::detail::drop_cached_pages(r);
  Probe p;
  p.bytes = bytes;
  p.write_gbps = static_cast<double>(bytes) / seconds_since(t0) / 1e9;
  t0 = Clock::now();
  for (auto& r : regions) {
    r.read_ahead();
    r.read(buffer.data(), r.requested_bytes());
  }
  p.read_gbps = static_cast<double>(bytes) / seconds_since(t0) / 1e9;
  return p;
}

struct Plan {
  PlanRequest request;
  std::uint64_t element_size = 0;
  std::uint64_t bytes_per_layer = 0;
  std::uint64_t capacity = 0;
  DirectoryInfo dir;
  bool fits = false;
  std::optional<GrowTrial> grow;  // when the directory fits
  std::vector<std::string> problems;
  bool probed = false;
  std::string probe_skipped;  // why no probe ran, for the --layer-ms warning
  Probe probe;
  double io_ms_per_layer = 0;
  bool keeps_up = false;
  std::uint64_t spillable_layers = 0;
  MemoryVerdict memory;
};

// Note [Plan tries the file system]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Free space is not enough: some file systems cannot preallocate (fallocate fails with
// EOPNOTSUPP) and a file size limit (ulimit -f) stops a large file. Plan makes a real arena of
// up to kTrialBytes there, so "fits" means an arena could be made, not only that statfs agreed.
// It stops short of the full capacity so that planning never takes a disk's free space away
// from other writers, even for a moment.
constexpr std::uint64_t kTrialBytes = 64ull << 20;

void try_preallocation(Plan& p) {
  ArenaOptions o;
  o.directory = p.dir.path;
  o.capacity_bytes = std::min(p.capacity, kTrialBytes);
  o.io = IoMode::buffered;
  try {
    SpillArena trial(o);
  } catch (const spill::Error& e) {
    p.fits = false;
    p.problems.push_back(explain(e));
  }
}

// Note [Plan tries a grow] in tools/cli/grow_trial.cc.
void try_grow(Plan& p) {
  try {
    p.grow = try_growing(p.dir.path, std::min(p.capacity, kTrialBytes));
  } catch (const spill::Error& e) {
    p.problems.push_back("the grow trial failed: " + explain(e));
    return;
  }
  if (p.grow->stats.grows == 0) {
    p.problems.push_back("an arena in " + detail::quote(p.dir.path) + " cannot grow (" +
                         p.grow->stats.grow_note +
                         "); a step that needs more than the capacity would keep its inputs in "
                         "memory: free space there or pass another --dir");
  }
}

void assess(Plan& p) {
  const DirectoryInfo& d = p.dir;
  if (!d.usable) p.problems.push_back(in_cli_words(d.problem));  // its advice fits its errno
  if (d.usable && d.memory_backed) {
    p.problems.push_back(detail::quote(d.path) + " is on " + d.file_system_type +
                         ", which lives in RAM: spilling there saves no memory; pass a --dir on "
                         "a disk");
  }
  p.fits = d.usable && !d.memory_backed && d.free_bytes >= p.capacity;
  if (d.usable && d.free_bytes < p.capacity) {
    p.problems.push_back("the arena needs " + bytes_with_units(p.capacity) + " but " +
                         detail::quote(d.path) + " has " + bytes_with_units(d.free_bytes) +
                         " free; free space there or pass another --dir");
  }
  if (p.fits) try_preallocation(p);
  if (p.fits) try_grow(p);
  if (!p.memory.disk_path_fits) {
    p.problems.push_back("even the disk path holds " + bytes_with_units(p.memory.disk_path_bytes) +
                         " in RAM but only " + bytes_with_units(p.memory.limits.usable_bytes()) +
                         " is usable; use a smaller --batch or --seq");
  }
}

void estimate_speed(Plan& p) {
  const double slowest = std::min(p.probe.write_gbps, p.probe.read_gbps);
  p.io_ms_per_layer = static_cast<double>(p.bytes_per_layer) / (slowest * 1e9) * 1e3;
  p.keeps_up = p.io_ms_per_layer <= p.request.layer_ms;
  const double budget_ms = p.request.layer_ms * static_cast<double>(p.request.layers);
  const double layers = static_cast<double>(p.request.layers);
  const double spillable =
      p.io_ms_per_layer > 0 ? std::floor(budget_ms / p.io_ms_per_layer) : layers;
  p.spillable_layers = static_cast<std::uint64_t>(std::min(layers, spillable));  // bounded first
}

void run_probe(Plan& p) {
  const std::uint64_t probe_bytes =
      std::min(p.request.probe_bytes, p.dir.free_bytes / 2) / (1 << 20) * (1 << 20);
  if (!p.fits) return;
  if (p.request.probe_bytes == 0) {
    p.probe_skipped = "--probe-bytes 0";
  } else if (p.request.probe_bytes < (1 << 20)) {
    p.probe_skipped =
        "--probe-bytes " + std::to_string(p.request.probe_bytes) + " is below the probe's 1 MiB";
  } else if (probe_bytes == 0) {
    p.probe_skipped = "less than 2 MiB free in " + detail::quote(p.dir.path);
  }
  if (probe_bytes == 0) return;
  try {
    p.probe = probe_bandwidth(p.dir.path, probe_bytes);
    p.probed = true;
  } catch (const spill::Error& e) {
    p.problems.push_back("the bandwidth probe failed: " + explain(e));
    return;
  }
  if (p.request.layer_ms > 0) estimate_speed(p);
}

nlohmann::json to_json(const Plan& p) {
  const PlanRequest& r = p.request;
  nlohmann::json j = {{"layers", r.layers},
                      {"batch", r.batch},
                      {"seq", r.seq},
                      {"hidden", r.hidden},
                      {"dtype", r.dtype},
                      {"element_size_bytes", p.element_size},
                      {"bytes_per_layer", p.bytes_per_layer},
                      {"capacity_bytes", p.capacity},
                      {"capacity_human", human_bytes(p.capacity)},
                      {"directory", p.dir.path},
                      {"file_system", p.dir.file_system_type},
                      {"memory_backed", p.dir.memory_backed},
                      {"free_bytes", p.dir.free_bytes},
                      {"fits", p.fits},
                      {"problems", p.problems}};
  j["growth"] = p.grow ? to_json(*p.grow) : nlohmann::json(nullptr);
  j["probe"] = p.probed ? nlohmann::json{{"bytes", p.probe.bytes},
                                         {"write_GBps", p.probe.write_gbps},
                                         {"read_GBps", p.probe.read_gbps}}
                        : nlohmann::json(nullptr);
  if (p.probed && r.layer_ms > 0) {
    j["layer_ms"] = r.layer_ms;
    j["io_ms_per_layer"] = p.io_ms_per_layer;
    j["keeps_up"] = p.keeps_up;
    j["spillable_layers"] = p.spillable_layers;
  }
  j["memory"] = to_json(p.memory);
  return j;
}

void print_text(const Plan& p, std::ostream& out) {
  const PlanRequest& r = p.request;
  out << std::fixed << std::setprecision(2);
  out << "model        " << r.layers << " layers, inputs [" << r.batch << ", " << r.seq << ", "
      << r.hidden << "] " << r.dtype << "\n"
      << "per layer    " << p.bytes_per_layer << " bytes (" << human_bytes(p.bytes_per_layer)
      << ", page-aligned region)\n"
      << "capacity     " << p.capacity << " bytes (" << human_bytes(p.capacity) << ")\n"
      << "directory    " << p.dir.path;
  if (p.dir.usable) {
    out << " (" << p.dir.file_system_type << (p.dir.memory_backed ? ", in RAM" : "") << "), "
        << human_bytes(p.dir.free_bytes) << " free";
  }
  out << "\nfits         " << (p.fits ? "yes" : "no") << "\n";
  if (p.grow) out << "grows        " << describe(*p.grow) << "\n";
  print_text(p.memory, out);
  if (p.probed) {
    out << "bandwidth    write " << p.probe.write_gbps << " GB/s, read " << p.probe.read_gbps
        << " GB/s (" << human_bytes(p.probe.bytes) << " through an arena, read back from disk)\n";
    if (r.layer_ms > 0) {
      out << "keeps up     " << (p.keeps_up ? "yes" : "no") << ": " << p.io_ms_per_layer
          << " ms of I/O per layer vs " << format_real(r.layer_ms) << " ms of compute; "
          << p.spillable_layers << " of " << r.layers
          << " layers can spill without slowing the step\n";
    }
  }
  for (const auto& problem : p.problems) out << "problem      " << problem << "\n";
}

ActivationShape shape_of(const PlanRequest& r) { return {r.batch, r.seq, r.hidden}; }

// Note [Every no of plan is one line on stderr]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The report (text or JSON) goes to stdout and lists every problem; a plan that says no also
// ends with exit 1 and one line on stderr, as every other failure of the CLI does, so a script
// that checks only the exit code and stderr (or pipes stdout to jq) still learns why.
std::string verdict_line(const Plan& p) {
  std::string line = "plan: no: " + p.problems.front();
  if (p.problems.size() > 1) {
    line += " (and " + std::to_string(p.problems.size() - 1) + " more problem" +
            (p.problems.size() > 2 ? "s" : "") + " in the report)";
  }
  return line;
}

}  // namespace

std::uint64_t element_size_of(const std::string& dtype) {
  static const std::map<std::string, std::uint64_t> sizes = {
      {"fp32", 4}, {"float32", 4}, {"f32", 4},  {"float", 4},    {"fp16", 2}, {"float16", 2},
      {"f16", 2},  {"half", 2},    {"bf16", 2}, {"bfloat16", 2}, {"fp64", 8}, {"float64", 8},
      {"f64", 8},  {"double", 8},  {"fp8", 1},  {"int8", 1}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

std::string check_plan_request(const PlanRequest& r) {
  try {
    bytes_for_layer_inputs(r.layers, shape_of(r), element_size_of(r.dtype));
  } catch (const spill::InvalidArgumentError&) {
    return std::to_string(r.layers) + " layers of [" + std::to_string(r.batch) + ", " +
           std::to_string(r.seq) + ", " + std::to_string(r.hidden) + "] " + r.dtype +
           " inputs are more bytes than can be counted; check --layers, --batch, --seq and "
           "--hidden";
  }
  return "";
}

int run_plan(const PlanRequest& request, std::ostream& out) {
  Plan p;
  p.request = request;
  if (p.request.directory.empty()) p.request.directory = default_spill_directory();
  p.element_size = element_size_of(request.dtype);
  p.bytes_per_layer = bytes_for_layer_input(shape_of(request), p.element_size);
  p.capacity = bytes_for_layer_inputs(request.layers, shape_of(request), p.element_size);
  p.memory = judge_memory(p.capacity, p.bytes_per_layer);
  p.dir = inspect_directory(p.request.directory);
  assess(p);
  run_probe(p);
  if (request.json) {
    out << to_json(p).dump(2) << "\n";
  } else {
    print_text(p, out);
  }
  if (!p.problems.empty()) return report_failure(verdict_line(p));
  if (request.layer_ms > 0 && !p.probed) {
    warn("--layer-ms is ignored: no bandwidth probe ran (" + p.probe_skipped +
         "), so nothing says whether the disk keeps up");
  }
  return 0;
}

}  // namespace spill::cli
