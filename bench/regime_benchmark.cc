// BM_Regime/<io>: the regime spillarena exists for. One training step spills several times the
// memory the process may use: the step runs in a child process inside a memory cgroup whose
// limit is a fraction of the bytes spilled per step. io = buffered | direct (ArenaOptions::io).
// Counters:
//   step_s            mean wall time of the steps after the first
//   cpu_s             CPU time (all threads, user + system) per step: near step_s, the step is
//                     bound by the CPU (page faults of fresh tensors, copies), not by the disk
//   rss_after_forward the child's largest RssAnon at the end of a forward
//   spill_Bps         bytes written + read by the arena per step / step_s
//   direct_io_Bps     O_DIRECT round trip of one step's bytes, in this run: the disk's limit
//   of_direct_io      spill_Bps / direct_io_Bps
//   spilled_bytes     written per step; limit_bytes the cgroup's limit; spill_over_limit ratio
//   cgroup_peak_bytes the cgroup's peak usage (page cache included); peak_over_limit ratio
//   staging_waits, restore_waits  from ArenaStats and StashStats
// Where no memory cgroup can be made (not root, no writable hierarchy) each case reports
// "skipped: <reason>"; a child that is OOM-killed, fails or runs past its timeout reports
// "did not finish: ..." with what it measured. See Note [The regime's layer].
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.h"
#include "direct_io.h"
#include "memory_cgroup.h"
#include "spill/spill.h"

namespace spill_bench {
namespace {

// Note [The regime's layer]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Each layer is y = x + tanh(x * w) with w a [hidden] vector: a few elementwise passes over its
// input, so the step's time is the spill's time, as on an accelerator whose math is far faster
// than the disk. A layer with real FLOPs would hide the I/O behind compute and measure the CPU.
struct RegimeShape {
  int layers;
  std::int64_t rows, hidden;
  int steps;                  // the first is reported apart (file preallocated, cold cache)
  std::uint64_t limit_bytes;  // the cgroup's memory limit
  double timeout_s;
};

// 64 inputs of 32 MiB: 2 GiB spilled per step against a 512 MiB limit.
const RegimeShape kFull = {64, 8192, 1024, 3, 512ull << 20, 300};
const RegimeShape kSmoke = {4, 256, 256, 2, 1ull << 30, 120};

std::uint64_t spilled_per_step(const RegimeShape& s) {
  return static_cast<std::uint64_t>(s.layers) * static_cast<std::uint64_t>(s.rows * s.hidden) *
         sizeof(float);
}

// "key value" lines of the child's stdout.
std::map<std::string, double> parse_report(const std::string& out) {
  std::map<std::string, double> r;
  std::istringstream lines(out);
  std::string key;
  double value = 0;
  while (lines >> key >> value) r[key] = value;
  return r;
}

const DirectIoSpeed& direct_io_limit(std::uint64_t bytes) {
  static std::map<std::uint64_t, DirectIoSpeed> measured;
  auto it = measured.find(bytes);
  if (it == measured.end())
    it = measured.emplace(bytes, measure_direct_io(spill_dir(), bytes)).first;
  return it->second;
}

std::string describe_failure(const spill_test::ChildRun& r, std::uint64_t oom_kills) {
  std::ostringstream s;
  s << "did not finish: ";
  if (r.timed_out)
    s << "killed after the " << r.seconds << " s timeout";
  else if (r.signal != 0)
    s << "signal " << r.signal << (oom_kills ? " (OOM-killed)" : "");
  else
    s << "exit " << r.exit_code;
  const std::string err = r.err.size() > 200 ? r.err.substr(r.err.size() - 200) : r.err;
  if (!err.empty()) s << ": " << err;
  return s.str();
}

void report(benchmark::State& state, const RegimeShape& shape, std::map<std::string, double> c,
            std::uint64_t peak) {
  const double spilled = static_cast<double>(spilled_per_step(shape));
  const double limit = static_cast<double>(shape.limit_bytes);
  const DirectIoSpeed& limit_io = direct_io_limit(spilled_per_step(shape));
  const double spill_Bps = (c["written_per_step"] + c["read_per_step"]) / c["step_s"];
  state.counters["step_s"] = c["step_s"];
  state.counters["first_step_s"] = c["first_step_s"];
  state.counters["spill_Bps"] = spill_Bps;
  state.counters["direct_io_Bps"] = limit_io.round_trip_Bps;
  state.counters["of_direct_io"] = limit_io.error.empty() ? spill_Bps / limit_io.round_trip_Bps : 0;
  state.counters["spilled_bytes"] = c["written_per_step"];
  state.counters["limit_bytes"] = limit;
  state.counters["spill_over_limit"] = spilled / limit;
  state.counters["cgroup_peak_bytes"] = static_cast<double>(peak);
  state.counters["peak_over_limit"] = static_cast<double>(peak) / limit;
  state.counters["cpu_s"] = c["cpu_s"];
  state.counters["rss_after_forward"] = c["rss_after_forward"];
  state.counters["staging_waits"] = c["staging_waits"];
  state.counters["restore_waits"] = c["restore_waits"];
  state.SetLabel(std::string(c["direct"] != 0 ? "direct" : "buffered") + " I/O, cgroup v" +
                 std::to_string(static_cast<int>(c["cgroup_version"])));
}

void regime(benchmark::State& state, const std::string& io, const RegimeShape& shape) {
  spill_test::MemoryCgroup cg("regime-" + io);
  if (!cg.ok()) {
    state.SkipWithError(("skipped: " + cg.reason()).c_str());
    return;
  }
  cg.set_limit(shape.limit_bytes);
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string scratch = spill_dir();
  const std::vector<std::string> argv = {exe,
                                         "--regime-child",
                                         io,
                                         std::to_string(shape.layers),
                                         std::to_string(shape.rows),
                                         std::to_string(shape.hidden),
                                         std::to_string(shape.steps),
                                         scratch};
  for (auto _ : state) {
    const spill_test::ChildRun r = cg.run(argv, scratch, shape.timeout_s);
    std::remove((scratch + "/child.out").c_str());
    std::remove((scratch + "/child.err").c_str());
    if (r.exit_code != 0 || r.timed_out) {
      state.SkipWithError(describe_failure(r, cg.oom_kills()).c_str());
      return;
    }
    auto c = parse_report(r.out);
    c["cgroup_version"] = cg.version();
    state.SetIterationTime(c["step_s"]);
    report(state, shape, c, cg.peak_bytes());
  }
}

// ---------------------------------------------------------------------------------------------
// The child: trains `steps` steps and prints "key value" lines.
// ---------------------------------------------------------------------------------------------

struct ChildArgs {
  std::string io;
  int layers = 0;
  std::int64_t rows = 0, hidden = 0;
  int steps = 0;
  std::string directory;
};

spill::SpillArena make_regime_arena(const ChildArgs& a) {
  spill::ArenaOptions o;
  o.directory = a.directory;
  o.capacity_bytes = spill::bytes_for_layer_inputs(
      static_cast<std::uint64_t>(a.layers),
      {1, static_cast<std::uint64_t>(a.rows), static_cast<std::uint64_t>(a.hidden)}, torch::kFloat);
  o.io = a.io == "direct" ? spill::IoMode::direct : spill::IoMode::buffered;
  return spill::SpillArena(o);
}

double train_step(const spill::SpillArena& arena, const std::vector<torch::Tensor>& weights,
                  const torch::Tensor& x, std::uint64_t* rss_after_forward) {
  Stopwatch w;
  torch::Tensor h = x;
  for (const torch::Tensor& weight : weights) {
    h = spill::checkpoint(
        arena, [weight](const torch::Tensor& in) { return in + torch::tanh(in * weight); }, h);
  }
  torch::Tensor loss = h.square().mean();
  h = torch::Tensor();
  *rss_after_forward = std::max(*rss_after_forward, spill::resident_anonymous_bytes());
  loss.backward();
  return w.seconds();
}

// CPU seconds (user + system, all threads) this process used so far.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

struct StepTimes {
  std::vector<double> wall_s;
  double later_cpu_s = 0;  // CPU seconds of the steps after the first
  std::uint64_t rss_after_forward = 0;
};

void print_report(const spill::SpillArena& arena, const StepTimes& t, int steps) {
  const spill::ArenaStats s = arena.stats();
  const std::vector<double>& step_s = t.wall_s;
  double rest = 0;
  for (std::size_t i = 1; i < step_s.size(); ++i) rest += step_s[i];
  std::printf("first_step_s %.6f\nstep_s %.6f\n", step_s[0], rest / (step_s.size() - 1));
  std::printf("written_per_step %.0f\nread_per_step %.0f\n",
              static_cast<double>(s.bytes_written) / steps,
              static_cast<double>(s.bytes_read) / steps);
  std::printf("cpu_s %.6f\nrss_after_forward %llu\n", t.later_cpu_s / (steps - 1),
              static_cast<unsigned long long>(t.rss_after_forward));
  std::printf("direct %d\nstaging_waits %llu\nrestore_waits %llu\n",
              s.io_mode == spill::IoMode::direct ? 1 : 0,
              static_cast<unsigned long long>(s.staging_waits),
              static_cast<unsigned long long>(spill::stash_stats(arena).restore_waits));
}

}  // namespace

int run_regime_child(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr,
                 "usage: spillarena_bench --regime-child IO LAYERS ROWS HIDDEN STEPS DIR\n");
    return 2;
  }
  spill::return_freed_memory_promptly();
  const ChildArgs a{argv[2],
                    std::stoi(argv[3]),
                    std::stoll(argv[4]),
                    std::stoll(argv[5]),
                    std::max(2, std::stoi(argv[6])),
                    argv[7]};
  torch::manual_seed(0);
  std::vector<torch::Tensor> weights;
  for (int i = 0; i < a.layers; ++i)
    weights.push_back(torch::rand({a.hidden}).requires_grad_(true));
  const torch::Tensor x = torch::randn({a.rows, a.hidden}).requires_grad_(true);
  spill::SpillArena arena = make_regime_arena(a);
  StepTimes t;
  t.wall_s.push_back(train_step(arena, weights, x, &t.rss_after_forward));
  const double cpu_before = cpu_seconds();
  for (int i = 1; i < a.steps; ++i)
    t.wall_s.push_back(train_step(arena, weights, x, &t.rss_after_forward));
  t.later_cpu_s = cpu_seconds() - cpu_before;
  print_report(arena, t, a.steps);
  return 0;
}

void register_regime_benchmarks() {
  const RegimeShape& shape = smoke() ? kSmoke : kFull;
  for (const std::string io : {"buffered", "direct"}) {
    benchmark::RegisterBenchmark(("BM_Regime/" + io).c_str(),
                                 [io, shape](benchmark::State& s) { regime(s, io, shape); })
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace spill_bench
