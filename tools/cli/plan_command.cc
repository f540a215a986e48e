#include "plan_command.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <map>
#include <ostream>
#include <sstream>
#include <vector>

#include "clock.h"
#include "spill/core.h"

namespace spill::cli {
namespace {

struct Probe {
  std::uint64_t bytes = 0;
  double write_gbps = 0;
  double read_gbps = 0;
};

// Writes `bytes` through a real arena in 16 MiB regions, waits until they are on disk and out of
// the page cache, then reads them back: the disk's rates as the spill path sees them.
Probe probe_bandwidth(const std::string& dir, std::uint64_t bytes) {
  constexpr std::uint64_t kChunk = 16ull << 20;
  ArenaOptions o;
  o.directory = dir;
  o.capacity_bytes = bytes;
  SpillArena arena(o);
  std::vector<char> buffer(kChunk, 'x');
  std::vector<Region> regions;
  auto t0 = Clock::now();
  for (std::uint64_t done = 0; done < bytes; done += kChunk) {
    regions.push_back(arena.allocate(std::min(kChunk, bytes - done)));
    regions.back().write(buffer.data(), regions.back().requested_bytes());
  }
  for (auto& r : regions) r.drop_cached_pages();  // waits for writeback: the disk's write rate
  Probe p;
  p.bytes = bytes;
  p.write_gbps = static_cast<double>(bytes) / seconds_since(t0) / 1e9;
  t0 = Clock::now();
  for (auto& r : regions) {
    r.prefetch();
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
  std::vector<std::string> problems;
  bool probed = false;
  Probe probe;
  double io_ms_per_layer = 0;
  bool keeps_up = false;
  std::uint64_t spillable_layers = 0;
};

void assess(Plan& p) {
  const DirectoryInfo& d = p.dir;
  if (!d.usable) p.problems.push_back(d.problem + "; create it or pass another --dir");
  if (d.usable && d.ram_backed) {
    p.problems.push_back("'" + d.path + "' is on " + d.file_system_type +
                         ", which lives in RAM: spilling there saves no memory; pass a --dir on "
                         "a disk");
  }
  p.fits = d.usable && !d.ram_backed && d.free_bytes >= p.capacity;
  if (d.usable && d.free_bytes < p.capacity) {
    p.problems.push_back("the arena needs " + bytes_with_units(p.capacity) + " but '" + d.path +
                         "' has " + bytes_with_units(d.free_bytes) +
                         " free; free space there or pass another --dir");
  }
}

void estimate_speed(Plan& p) {
  const double slowest = std::min(p.probe.write_gbps, p.probe.read_gbps);
  p.io_ms_per_layer = static_cast<double>(p.bytes_per_layer) / (slowest * 1e9) * 1e3;
  p.keeps_up = p.io_ms_per_layer <= p.request.layer_ms;
  const double budget_ms = p.request.layer_ms * static_cast<double>(p.request.layers);
  p.spillable_layers = std::min<std::uint64_t>(
      p.request.layers, static_cast<std::uint64_t>(std::floor(budget_ms / p.io_ms_per_layer)));
}

nlohmann::json to_json(const Plan& p) {
  const PlanRequest& r = p.request;
  nlohmann::json j = {
      {"layers", r.layers}, {"batch", r.batch}, {"seq", r.seq}, {"hidden", r.hidden},
      {"dtype", r.dtype}, {"element_size_bytes", p.element_size},
      {"bytes_per_layer", p.bytes_per_layer}, {"capacity_bytes", p.capacity},
      {"capacity_human", human_bytes(p.capacity)}, {"directory", p.dir.path},
      {"file_system", p.dir.file_system_type}, {"ram_backed", p.dir.ram_backed},
      {"free_bytes", p.dir.free_bytes}, {"fits", p.fits}, {"problems", p.problems}};
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
    out << " (" << p.dir.file_system_type << (p.dir.ram_backed ? ", in RAM" : "") << "), "
        << human_bytes(p.dir.free_bytes) << " free";
  }
  out << "\nfits         " << (p.fits ? "yes" : "no") << "\n";
  if (p.probed) {
    out << "bandwidth    write " << p.probe.write_gbps << " GB/s, read " << p.probe.read_gbps
        << " GB/s (" << human_bytes(p.probe.bytes) << " through an arena, read back from disk)\n";
    if (r.layer_ms > 0) {
      out << "keeps up     " << (p.keeps_up ? "yes" : "no") << ": " << p.io_ms_per_layer
          << " ms of I/O per layer vs " << r.layer_ms << " ms of compute; " << p.spillable_layers
          << " of " << r.layers << " layers can spill without slowing the step\n";
    }
  }
  for (const auto& problem : p.problems) out << "problem      " << problem << "\n";
}

}  // namespace

std::uint64_t element_size_of(const std::string& dtype) {
  static const std::map<std::string, std::uint64_t> sizes = {
      {"fp32", 4}, {"float32", 4}, {"f32", 4}, {"float", 4},   {"fp16", 2},
      {"float16", 2}, {"f16", 2}, {"half", 2}, {"bf16", 2},    {"bfloat16", 2},
      {"fp64", 8}, {"float64", 8}, {"f64", 8}, {"double", 8}, {"fp8", 1}, {"int8", 1}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

int run_plan(const PlanRequest& request, std::ostream& out) {
  Plan p;
  p.request = request;
  if (p.request.directory.empty()) p.request.directory = default_spill_directory();
  p.element_size = element_size_of(request.dtype);
  const ActivationShape shape{request.batch, request.seq, request.hidden};
  p.bytes_per_layer = bytes_for_layer_input(shape, p.element_size);
  p.capacity = bytes_for_layer_inputs(request.layers, shape, p.element_size);
  p.dir = inspect_directory(p.request.directory);
  assess(p);
  const std::uint64_t probe_bytes =
      std::min(request.probe_bytes, p.dir.free_bytes / 2) / (1 << 20) * (1 << 20);
  if (p.dir.usable && !p.dir.ram_backed && probe_bytes > 0) {
    p.probe = probe_bandwidth(p.request.directory, probe_bytes);
    p.probed = true;
    if (request.layer_ms > 0) estimate_speed(p);
  }
  if (request.json) {
    out << to_json(p).dump(2) << "\n";
  } else {
    print_text(p, out);
  }
  return p.problems.empty() ? 0 : 1;
}

}  // namespace spill::cli
