// BM_AcceleratorStep/<mode>: one forward + backward of a GPT block stack at Llama-7B width in
// bf16 on the first CUDA device: batch 4, seq 4096, hidden 4096, 32 heads, 16 blocks (12 x
// hidden^2 parameters per block, 3.2 B in all; a 128 MiB input per block, 2 GiB per step).
//   modes  none         no checkpointing (every activation stays on the GPU)
//          recompute    checkpointing, inputs kept on the GPU
//          ram          inputs in a RAM arena, through pinned host memory, overlapped
//          disk_async   inputs in a disk arena, buffered I/O, overlapped
//          disk_direct  inputs in a disk arena, direct I/O through the staging pool, overlapped
//          disk_gds     disk_direct's settings with io = gds: device memory to the file through
//                       cuFile; where libcufile does not load, "skipped: " and the library's
//                       GdsUnavailableError (what was searched, how to install it)
//          per_file     one torch::save file per input (the approach spillarena replaces)
// Counters: step_ms; vs_none and vs_recompute (step time / that mode's, both measured earlier in
// this run); gpu_peak_bytes (the caching allocator's peak of allocated bytes during the timed
// steps); host_peak_rss and host_rss_added (measured in a fresh process per mode: see Note [Peak
// host memory of a step]); spilled_bytes per step; the
// arena's restore and staging waits; for the disk modes spill_GBps (bytes written and read back
// per second of step) beside the spill directory's own O_DIRECT write and read speed; from the
// stash (Note [The host pool] in src/core/stash/host_pool.cc): host_pool_bytes and
// host_pool_pinned, peak_pool_in_use, pool_waits and pool_wait_ms (store()s that waited for the
// oldest write), peak_device_held (device bytes the stash referenced at most), kept_on_device,
// and gpu_goal_bytes: recompute's GPU peak less the inputs spilled per step plus prefetch_depth
// + 1 inputs — the goal for gpu_peak_bytes.
// Without a CUDA device each case reports "skipped: no CUDA device". SPILLARENA_BENCH_SMOKE=1
// (CI) runs a tiny stack on the CPU instead, through the accelerator path's emulation
// (spill::testing::set_accelerator_emulation, pinning refused: the CPU cannot pin, so the pool
// is pageable as it says), so the code path is proven to run everywhere;
// SPILLARENA_BENCH_ACCEL_SHAPE=batch,seq,hidden,heads,layers overrides the shape.
#include <ATen/DeviceAccelerator.h>
#include <benchmark/benchmark.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "accelerator_emulation.h"
#include "bench_common.h"
#include "core/io/gds.h"
#include "direct_io.h"
#include "spill/spill.h"
#include "tiny_gpt.h"

namespace spill_bench {
namespace {

struct AccelShape {
  int64_t batch = 4, seq = 4096, hidden = 4096, heads = 32, layers = 16;
};

AccelShape accel_shape() {
  const char* env = std::getenv("SPILLARENA_BENCH_ACCEL_SHAPE");
  if (env == nullptr) return smoke() ? AccelShape{2, 32, 64, 4, 3} : AccelShape{};
  long long v[5];
  char end = 0;
  const bool parsed =
      std::sscanf(env, "%lld,%lld,%lld,%lld,%lld%c", &v[0], &v[1], &v[2], &v[3], &v[4], &end) == 5;
  const bool sane = parsed &&
                    std::all_of(std::begin(v), std::end(v),
                                [](long long x) { return x >= 1 && x <= (1 << 20); }) &&
                    v[2] % v[3] == 0 &&
                    static_cast<long double>(v[0]) * v[1] * v[2] * v[4] <= 0x1p44L;
  if (!sane) {
    throw std::invalid_argument(std::string("SPILLARENA_BENCH_ACCEL_SHAPE='") + env +
                                "': expected batch,seq,hidden,heads,layers, each 1 to 1048576, "
                                "hidden a multiple of heads, at most 2^44 input elements in all");
  }
  return AccelShape{v[0], v[1], v[2], v[3], v[4]};
}

std::optional<torch::Device> bench_device() {
  if (smoke()) {
    static const bool emulated = [] {
      spill::testing::AcceleratorEmulation e;
      e.enabled = true;
      e.max_delay_us = 200;
      e.pinning_refused = true;
      spill::testing::set_accelerator_emulation(e);
      return true;
    }();
    (void)emulated;
    return torch::Device(torch::kCPU);
  }
  if (torch::cuda::is_available()) return torch::Device(torch::kCUDA, 0);
  return std::nullopt;
}

// Note [Peak host memory of a step]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// VmHWM is the process's peak resident set (anonymous, file-backed and shared pages, pinned host
// memory included); writing "5" to /proc/self/clear_refs resets it to the current RSS. LibTorch
// keeps pinned host memory cached for the process's life, so a mode measured after another
// would reuse its pinned buffers and look free: each mode's host memory is measured in a child
// of its own (--accelerator-child MODE), which builds the model, runs a warm-up step, resets
// VmHWM and runs two more. host_peak_rss is that peak, host_rss_added the part above the RSS the
// child had before it made the mode (CUDA context, LibTorch, the CPU-side model's leftovers).
bool reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  return static_cast<bool>(clear.flush());
}

// A "Vm...:" line of /proc/self/status in bytes; 0 when absent.
double status_bytes(const std::string& wanted) {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == wanted) {
      double kib = 0;
      status >> kib;
      return kib * 1024.0;
    }
  }
  return 0.0;
}

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// The device-generic allocator statistics came with LibTorch 2.9; older ones report -1.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
void reset_peak_device_bytes(const torch::Device& device) {
  if (device.is_cuda()) at::accelerator::resetPeakStats(device.index());
}

double peak_device_bytes(const torch::Device& device) {
  if (!device.is_cuda()) return 0.0;
  const auto stats = at::accelerator::getDeviceStats(device.index());
  const auto aggregate = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return static_cast<double>(stats.allocated_bytes[aggregate].peak);
}
#else
void reset_peak_device_bytes(const torch::Device&) {}
double peak_device_bytes(const torch::Device&) { return -1.0; }
#endif

// The block stack, built once per process and shared by every mode (3.2 B parameters at the
// default shape: building it takes longer than a step).
torch::nn::Sequential& shared_blocks(const AccelShape& s, const torch::Device& device) {
  static std::optional<torch::nn::Sequential> blocks;
  if (!blocks) {
    spill::models::GptConfig cfg;
    cfg.hidden = s.hidden;
    cfg.heads = s.heads;
    cfg.dropout = 0.0;  // as in Llama
    torch::manual_seed(0);
    torch::NoGradGuard no_grad;
    torch::nn::Sequential stack;
    for (int64_t i = 0; i < s.layers; ++i) {
      spill::models::GptBlock block(cfg);
      block->to(device, device.is_cuda() ? torch::kBFloat16 : torch::kFloat);
      stack->push_back(block);
    }
    stack->train();
    blocks = stack;
  }
  return *blocks;
}

std::uint64_t input_bytes(const AccelShape& s, torch::Dtype dtype) {
  return static_cast<std::uint64_t>(s.batch * s.seq * s.hidden) * c10::elementSize(dtype);
}

std::uint64_t capacity_for(const AccelShape& s, torch::Dtype dtype) {
  return static_cast<std::uint64_t>(s.layers) * input_bytes(s, dtype) + 64 * spill::MiB;
}

// A mode of make_step_mode, or disk_gds: disk_direct's arena and stash settings with io = gds.
// Throws GdsUnavailableError where libcufile does not load (checked first: the arena would say
// the same, after its file was made).
spill::harness::ModeSetup make_accelerator_mode(const std::string& mode, std::uint64_t capacity) {
  if (mode != "disk_gds") return make_step_mode(mode, capacity);
  spill::detail::cufile_library();
  spill::ArenaOptions o;
  o.directory = spill_dir();
  o.capacity_bytes = capacity;
  o.io = spill::IoMode::gds;
  spill::StashOptions s;
  s.asynchronous = true;
  s.keep_last = 1;
  s.prefetch_depth = 2;
  spill::harness::ModeSetup m;
  m.mode = mode;
  m.arena = std::make_unique<spill::SpillArena>(o);
  m.stash = spill::make_arena_stash(*m.arena, s);
  return m;
}

// Step times of the modes measured so far in this run, for the ratios.
std::map<std::string, double>& step_ms_by_mode() {
  static std::map<std::string, double> times;
  return times;
}

// recompute's GPU peak in this run, for the spilling modes' goal.
double& recompute_peak_bytes() {
  static double peak = -1.0;
  return peak;
}

void report_stash(benchmark::State& state, const spill::harness::ModeSetup& mode,
                  double spilled_bytes, std::uint64_t input) {
  const spill::StashStats st = mode.stash->stats();
  state.counters["host_pool_bytes"] = static_cast<double>(st.host_pool_bytes);
  state.counters["host_pool_grows"] = static_cast<double>(st.host_pool_grows);
  state.counters["host_pool_pinned"] = st.host_pool_pinned ? 1.0 : 0.0;
  state.counters["peak_pool_in_use"] = static_cast<double>(st.peak_host_pool_bytes_in_use);
  state.counters["pool_waits"] = static_cast<double>(st.pool_waits);
  state.counters["pool_wait_ms"] = static_cast<double>(st.pool_wait_ns) / 1e6;
  state.counters["peak_device_held"] = static_cast<double>(st.peak_device_bytes_held);
  // Note [The device-held bound] in src/core/stash/copy_window.cc
  state.counters["copy_waits"] = static_cast<double>(st.copy_waits);
  state.counters["copy_wait_ms"] = static_cast<double>(st.copy_wait_ns) / 1e6;
  state.counters["back_before_copied"] = static_cast<double>(st.inputs_back_before_copied);
  state.counters["kept_on_device"] = static_cast<double>(st.inputs_kept_on_device);
  if (recompute_peak_bytes() > 0) {
    const double slack =
        (spill::stash_options(*mode.arena).prefetch_depth + 1.0) * static_cast<double>(input);
    state.counters["gpu_goal_bytes"] = recompute_peak_bytes() - spilled_bytes + slack;
  }
}

double step(torch::nn::Sequential& blocks, const spill::harness::ModeSetup& mode,
            const torch::Tensor& x0, const torch::Device& device) {
  Stopwatch watch;
  torch::Tensor x = x0.clone().requires_grad_(true);
  torch::Tensor y = spill::models::run_blocks(blocks, mode.stash, x);
  y.to(torch::kFloat).square().mean().backward();
  synchronize(device);
  const double seconds = watch.seconds();
  blocks->zero_grad();
  return seconds;
}

// The spill directory's own O_DIRECT speed, measured once per run: what the disk modes' spill
// rate is held against.
void report_disk_speed(benchmark::State& state) {
  static const DirectIoSpeed disk =
      measure_direct_io(spill_dir(), smoke() ? 8 * spill::MiB : 1024 * spill::MiB);
  if (!disk.error.empty()) return;
  state.counters["direct_io_write_GBps"] = disk.write_Bps / 1e9;
  state.counters["direct_io_read_GBps"] = disk.read_Bps / 1e9;
}

struct HostMemory {
  double peak = -1.0;        // VmHWM over two steps; -1 when the child failed
  double before_mode = 0.0;  // VmRSS before the mode was made
};

// See Note [Peak host memory of a step].
HostMemory host_memory_in_fresh_process(const std::string& mode) {
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string cmd = "'" + exe + "' --accelerator-child " + mode;
  HostMemory m;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return m;
  if (std::fscanf(pipe, "%lf %lf", &m.peak, &m.before_mode) != 2) m = HostMemory{};
  if (pclose(pipe) != 0) m = HostMemory{};
  return m;
}

void set_ratio(benchmark::State& state, const std::string& name, double step_ms) {
  const auto& times = step_ms_by_mode();
  const auto it = times.find(name);
  if (it != times.end() && it->second > 0) state.counters["vs_" + name] = step_ms / it->second;
}

void accelerator_step(benchmark::State& state, const std::string& mode_name) {
  const auto device = bench_device();
  if (!device) {
    state.SkipWithError("skipped: no CUDA device");
    return;
  }
  AccelShape s;
  spill::harness::ModeSetup mode;
  const torch::Dtype dtype = device->is_cuda() ? torch::kBFloat16 : torch::kFloat;
  try {  // a bad shape, or an arena this machine refuses: reported, never a crash
    s = accel_shape();
    mode = make_accelerator_mode(mode_name, capacity_for(s, dtype));
  } catch (const spill::GdsUnavailableError& e) {
    state.SkipWithError((std::string("skipped: ") + e.what()).c_str());
    return;
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  torch::nn::Sequential& blocks = shared_blocks(s, *device);
  torch::manual_seed(1);
  const torch::Tensor x0 = torch::randn({s.batch, s.seq, s.hidden}).to(*device, dtype);
  step(blocks, mode, x0, *device);  // warm-up: kernels chosen, allocator caches filled
  const std::uint64_t written_before = mode.arena ? mode.arena->stats().bytes_written : 0;
  reset_peak_device_bytes(*device);
  double seconds = 0;
  for (auto _ : state) seconds += step(blocks, mode, x0, *device);
  const double steps = static_cast<double>(state.iterations());
  const double step_ms = seconds / steps * 1e3;
  state.counters["step_ms"] = step_ms;
  set_ratio(state, "none", step_ms);
  set_ratio(state, "recompute", step_ms);
  step_ms_by_mode()[mode_name] = step_ms;
  state.counters["gpu_peak_bytes"] = peak_device_bytes(*device);
  if (mode_name == "recompute") recompute_peak_bytes() = state.counters["gpu_peak_bytes"];
  const HostMemory host = host_memory_in_fresh_process(mode_name);
  state.counters["host_peak_rss"] = host.peak;
  state.counters["host_rss_added"] = host.peak - host.before_mode;
  if (mode_name.rfind("disk", 0) == 0) report_disk_speed(state);
  if (mode.arena) {
    const spill::ArenaStats st = mode.arena->stats();
    state.counters["spilled_bytes"] =
        static_cast<double>(st.bytes_written - written_before) / steps;
    const spill::StashStats stash = spill::stash_stats(*mode.arena);
    state.counters["restore_waits"] = static_cast<double>(stash.restore_waits);
    state.counters["restore_wait_ms"] = static_cast<double>(stash.restore_wait_ns) / 1e6;
    state.counters["staging_waits"] = static_cast<double>(st.staging_waits);
    state.counters["spill_GBps"] =
        2.0 * state.counters["spilled_bytes"] / (step_ms / 1e3) / 1e9;  // written + read back
    report_stash(state, mode, state.counters["spilled_bytes"], input_bytes(s, dtype));
    state.SetLabel(std::string(spill::to_string(st.io_mode)) + "/" +
                   spill::to_string(st.io_backend));
  }
}

}  // namespace

int run_accelerator_child(int argc, char** argv) {
  const auto device = bench_device();
  if (argc != 3 || !device) {
    std::fprintf(stderr,
                 "usage: spillarena_bench --accelerator-child MODE (needs a CUDA device)\n");
    return 2;
  }
  AccelShape s;
  try {
    s = accel_shape();
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  const torch::Dtype dtype = device->is_cuda() ? torch::kBFloat16 : torch::kFloat;
  torch::nn::Sequential& blocks = shared_blocks(s, *device);
  const double before_mode = status_bytes("VmRSS:");
  spill::harness::ModeSetup mode = make_accelerator_mode(argv[2], capacity_for(s, dtype));
  torch::manual_seed(1);
  const torch::Tensor x0 = torch::randn({s.batch, s.seq, s.hidden}).to(*device, dtype);
  step(blocks, mode, x0, *device);
  if (!reset_peak_rss()) return 1;
  step(blocks, mode, x0, *device);
  step(blocks, mode, x0, *device);
  std::printf("%.0f %.0f\n", status_bytes("VmHWM:"), before_mode);
  return 0;
}

void register_accelerator_benchmarks() {
  for (const std::string mode :
       {"none", "recompute", "ram", "disk_async", "disk_direct", "disk_gds", "per_file"}) {
    auto* b = benchmark::RegisterBenchmark(
        ("BM_AcceleratorStep/" + mode).c_str(),
        [mode](benchmark::State& state) { accelerator_step(state, mode); });
    b->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(smoke() ? 1 : 3);
  }
}

}  // namespace spill_bench
