// The arena stash's io = gds path on the CPU: the copy seam's accelerator emulation makes CPU
// tensors device inputs, and a fake cuFile (set_cufile_api_for_testing, src/core/io/gds.h) moves
// the bytes with pread/pwrite on the O_DIRECT descriptor the arena registered with it. So CI checks
// what a GPU machine with GPUDirect Storage would: bitwise gradients, the staging buffer
// registered once and deregistered at the end, pieces, the sub-4 KiB tails through the host,
// device memory released before the write, cuFile's bounce buffers capped to the host budget,
// and a cuFile failure reported as a typed error with the arena left consistent.
#include <doctest/doctest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "accelerator_emulation.h"
#include "core/io/gds.h"
#include "gpt_test_support.h"
#include "test_support.h"
#include "torch_layer/shared_arena_stash.h"

// LibTorch's logging header defines its own CHECK, which aborts the process at the first failure
// instead of reporting it; the checks below are doctest's.
#undef CHECK
#define CHECK(...) DOCTEST_CHECK(__VA_ARGS__)

using spill::detail::CuFileApi;
using spill::detail::CuFileDescriptor;
using spill::detail::CuFileDriverProperties;
using spill::detail::CuFileStatus;
using spill_test::ScratchDir;
using namespace spill_test::gpt;

namespace {

constexpr std::uint64_t kPage = 4096;
// GptReference's input {2, 33, 64} of floats: four pages and a 512-byte tail.
const std::vector<std::int64_t> kShape = {2, 33, 64};
constexpr std::uint64_t kInputBytes = 2 * 33 * 64 * sizeof(float);
constexpr std::uint64_t kBodyBytes = kInputBytes / kPage * kPage;
constexpr std::uint64_t kStagingBytes = 2 * kPage;  // two pieces per input
constexpr int kLayers = 4;

// ---------------------------------------------------------------------------------------------
// A fake cuFile over the registered descriptor: compatibility mode (no nvidia-fs), its bounce
// cache 128 MiB in 1 MiB buffers, transfers as pread/pwrite. Calls come from the training and
// the progress thread: counted under a mutex.
// ---------------------------------------------------------------------------------------------

struct Transfer {
  bool write;
  const void* base;
  std::uint64_t bytes;
  std::int64_t file_offset;
  std::int64_t base_offset;
  std::uint64_t device_bytes_held;  // the stash's, as the transfer began
};

struct FakeCuFile {
  std::mutex mutex;
  int fd = -1;
  unsigned int cache_kib = 128 * 1024;
  unsigned int per_buffer_kib = 1024;
  bool honours_cache_limit = true;  // cuFile 1.14+ ignores it once the driver is open
  int buf_register_status = 0;
  std::vector<std::size_t> cache_limits_kib;
  std::vector<std::pair<const void*, std::size_t>> registered;
  std::vector<const void*> deregistered;
  std::vector<Transfer> transfers;
  // Faults: transfers return this CUfileOpError (negated; 0: none): reads when fail_reads,
  // writes after writes_to_pass more have passed.
  std::atomic<int> fail_with{0};
  std::atomic<bool> fail_reads{false};
  std::atomic<int> writes_to_pass{0};
  const spill::SpillArena* arena = nullptr;  // for device_bytes_held
};

FakeCuFile* fake = nullptr;
char fake_handle_object;

CuFileStatus ok() { return CuFileStatus{0, 0}; }

std::int64_t fake_transfer(bool write, const void* base, std::size_t bytes, std::int64_t at,
                           std::int64_t base_offset) {
  const std::uint64_t held =
      fake->arena != nullptr ? spill::stash_stats(*fake->arena).device_bytes_held : 0;
  int fd = -1;
  {
    std::lock_guard<std::mutex> lock(fake->mutex);
    fake->transfers.push_back(Transfer{write, base, bytes, at, base_offset, held});
    fd = fake->fd;
  }
  if (const int status = fake->fail_with.load()) {
    if (write ? fake->writes_to_pass.fetch_sub(1) <= 0 : fake->fail_reads.load()) return -status;
  }
  char* memory = const_cast<char*>(static_cast<const char*>(base)) + base_offset;
  const ssize_t moved =
      write ? pwrite(fd, memory, bytes, at) : pread(fd, memory, bytes, at);  // O_DIRECT
  return moved;
}

CuFileApi fake_api() {
  CuFileApi api{};
  api.driver_open = [] { return ok(); };
  api.driver_close = [] { return ok(); };
  api.driver_get_properties = [](CuFileDriverProperties* p) {
    std::lock_guard<std::mutex> lock(fake->mutex);
    p->nvfs.major_version = 0;  // no nvidia-fs: compatibility mode
    p->max_device_cache_size = fake->cache_kib;
    p->per_buffer_cache_size = fake->per_buffer_kib;
    return ok();
  };
  api.driver_set_max_cache_size = [](std::size_t kib) {
    std::lock_guard<std::mutex> lock(fake->mutex);
    fake->cache_limits_kib.push_back(kib);
    if (fake->honours_cache_limit) fake->cache_kib = static_cast<unsigned int>(kib);
    return ok();
  };
  api.handle_register = [](void** handle, CuFileDescriptor* d) {
    std::lock_guard<std::mutex> lock(fake->mutex);
    fake->fd = d->handle.fd;
    *handle = &fake_handle_object;
    return ok();
  };
  api.handle_deregister = [](void*) {};
  api.buf_register = [](const void* base, std::size_t bytes, int) {
    std::lock_guard<std::mutex> lock(fake->mutex);
    fake->registered.emplace_back(base, bytes);
    return CuFileStatus{fake->buf_register_status, 0};
  };
  api.buf_deregister = [](const void* base) {
    std::lock_guard<std::mutex> lock(fake->mutex);
    fake->deregistered.push_back(base);
    return ok();
  };
  api.read = [](void*, void* base, std::size_t bytes, std::int64_t at, std::int64_t off) {
    return fake_transfer(false, base, bytes, at, off);
  };
  api.write = [](void*, const void* base, std::size_t bytes, std::int64_t at, std::int64_t off) {
    return fake_transfer(true, base, bytes, at, off);
  };
  return api;
}

// The fake as the process's cuFile, and emulated accelerator copies, for the scope.
struct GdsScope {
  FakeCuFile state;
  CuFileApi api = fake_api();
  explicit GdsScope(bool emulate = true) {
    fake = &state;
    spill::detail::set_cufile_api_for_testing(&api);
    if (emulate) spill::testing::set_accelerator_emulation({true, 200, 11});
  }
  ~GdsScope() {
    spill::testing::set_accelerator_emulation({});
    spill::detail::set_cufile_api_for_testing(nullptr);
    fake = nullptr;
  }
  GdsScope(const GdsScope&) = delete;
  GdsScope& operator=(const GdsScope&) = delete;

  std::vector<Transfer> transfers() {
    std::lock_guard<std::mutex> lock(state.mutex);
    return state.transfers;
  }
};

// An io = gds arena spilling every input (keep_last 0) through a two-page staging buffer, with
// a 4 MiB host budget.
spill::SpillArena gds_arena(const std::string& dir, bool asynchronous) {
  spill::ArenaOptions o = spill_test::options_in(dir, 16 * spill::MiB, spill::IoMode::gds);
  o.staging_bytes = spill::MiB;
  o.host_pool_bytes = 4 * spill::MiB;
  spill::SpillArena arena(o);
  spill::StashOptions s;
  s.asynchronous = asynchronous;
  s.keep_last = 0;
  s.gds_buffer_bytes = kStagingBytes - 100;  // rounded up to whole pages
  spill::set_stash_options(arena, s);
  return arena;
}

template <class Condition>
bool eventually(Condition condition, int timeout_ms = 10000) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < end) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return condition();
}

bool drained(const spill::SpillArena& arena) {
  return arena.stats().bytes_in_use == 0 && arena.stats().live_regions == 0 &&
         spill::stash_stats(arena).device_bytes_held == 0;
}

std::uint64_t bytes_of(const std::vector<Transfer>& transfers, bool write) {
  std::uint64_t bytes = 0;
  for (const Transfer& t : transfers) bytes += t.write == write ? t.bytes : 0;
  return bytes;
}

}  // namespace

TEST_CASE("gds stash: gradients are bit-identical with every body through one registered buffer") {
  ScratchDir dir;
  GptReference g(kLayers, 5, kShape);
  for (bool asynchronous : {false, true}) {
    CAPTURE(asynchronous);
    GdsScope gds;
    const void* staging = nullptr;
    {
      spill::SpillArena arena = gds_arena(dir.path(), asynchronous);
      constexpr int kSteps = 3;
      for (int step = 0; step < kSteps; ++step) {
        g.check(gpt_step(g.blocks, spill::detail::shared_arena_stash(arena), g.x0));
      }
      const spill::StashStats s = spill::stash_stats(arena);
      // Asynchronous, backward gives back an input the progress thread has not taken yet.
      const std::uint64_t inputs = s.inputs_spilled;
      CHECK(inputs <= kSteps * kLayers);
      CHECK(inputs >= (asynchronous ? 1 : kSteps * kLayers));
      // The bodies through cuFile, the tails through the host path.
      CHECK(s.cufile_bytes_written == inputs * kBodyBytes);
      CHECK(s.cufile_bytes_read == inputs * kBodyBytes);
      CHECK(arena.stats().bytes_written == inputs * kInputBytes);
      const std::vector<Transfer> transfers = gds.transfers();
      CHECK(bytes_of(transfers, true) == inputs * kBodyBytes);
      CHECK(bytes_of(transfers, false) == inputs * kBodyBytes);
      CHECK(transfers.size() == 2 * inputs * (kBodyBytes / kStagingBytes));  // in pieces
      // One buffer, registered once for every step, and every transfer from it.
      REQUIRE(gds.state.registered.size() == 1);
      staging = gds.state.registered[0].first;
      CHECK(gds.state.registered[0].second == kStagingBytes);
      CHECK(reinterpret_cast<std::uintptr_t>(staging) % kPage == 0);
      std::size_t from_staging = 0;
      for (const Transfer& t : transfers) {
        from_staging += t.base == staging && t.base_offset == 0 && t.bytes <= kStagingBytes &&
                        t.file_offset % static_cast<std::int64_t>(kPage) == 0;
      }
      CHECK(from_staging == transfers.size());
      CHECK(gds.state.deregistered.empty());
      CHECK(s.gds_buffer_bytes == kStagingBytes);
      CHECK(s.gds_buffer_registered);
      CHECK(s.cufile_mode.find("compatibility") != std::string::npos);
      CHECK(arena.stats().io_note.find("cuFile mode: compatibility") != std::string::npos);
      // Memory: device bytes all given back, every region freed.
      CHECK(s.device_bytes_held == 0);
      CHECK(arena.stats().bytes_in_use == 0);
      CHECK(arena.stats().live_regions == 0);
    }
    // Deregistered when the arena went, before its memory was freed.
    CHECK(gds.state.deregistered == std::vector<const void*>{staging});
    CHECK(spill_test::list_dir(dir.path()).empty());
  }
}

TEST_CASE("gds stash: an input's device memory is released before its last piece is written") {
  ScratchDir dir;
  GptReference g(kLayers, 6, kShape);
  GdsScope gds;
  spill::SpillArena arena = gds_arena(dir.path(), /*asynchronous=*/false);
  gds.state.arena = &arena;
  g.check(gpt_step(g.blocks, spill::detail::shared_arena_stash(arena), g.x0));
  gds.state.arena = nullptr;
  // Synchronous, keep_last 0: each input is written when stored, nothing else held. Its first
  // piece leaves while the input is still referenced, its last after it was released.
  std::vector<Transfer> writes;
  for (const Transfer& t : gds.transfers()) {
    if (t.write) writes.push_back(t);
  }
  REQUIRE(writes.size() == kLayers * 2);
  for (std::size_t i = 0; i < writes.size(); i += 2) {
    CHECK(writes[i].device_bytes_held == kInputBytes);
    CHECK(writes[i + 1].device_bytes_held == 0);
  }
  CHECK(spill::stash_stats(arena).peak_device_bytes_held <= kInputBytes * (kLayers + 1));
}

TEST_CASE("gds stash: real CPU inputs of an io = gds arena take the CPU path") {
  ScratchDir dir;
  GptReference g(kLayers, 7, kShape);
  GdsScope gds(/*emulate=*/false);
  spill::SpillArena arena = gds_arena(dir.path(), /*asynchronous=*/true);
  for (int step = 0; step < 2; ++step) {
    g.check(gpt_step(g.blocks, spill::detail::shared_arena_stash(arena), g.x0));
  }
  CHECK(gds.transfers().empty());
  CHECK(gds.state.registered.empty());
  const spill::StashStats s = spill::stash_stats(arena);
  CHECK(s.inputs_spilled == 2 * kLayers);
  CHECK(s.cufile_bytes_written == 0);
  CHECK(s.gds_buffer_bytes == 0);
  CHECK(arena.stats().bytes_written == 2 * kLayers * kInputBytes);
}

TEST_CASE("gds stash: cuFile's bounce buffers are capped to the host budget and reported") {
  ScratchDir dir;
  GptReference g(2, 8, kShape);
  SUBCASE("a cuFile that takes the limit") {
    GdsScope gds;
    spill::SpillArena arena = gds_arena(dir.path(), true);
    CHECK(spill::stash_stats(arena).cufile_bounce_bytes == 0);  // nothing stored yet
    g.check(gpt_step(g.blocks, spill::detail::shared_arena_stash(arena), g.x0));
    CHECK(gds.state.cache_limits_kib == std::vector<std::size_t>{4 * 1024});  // whole 1 MiB buffers
    const spill::StashStats s = spill::stash_stats(arena);
    CHECK(s.cufile_bounce_bytes == 4 * spill::MiB);
    CHECK(s.host_pool_bytes == 0);  // no input goes through the pool with io = gds
    CHECK(s.host_pool_bytes + s.cufile_bounce_bytes <= arena.options().host_pool_bytes);
  }
  SUBCASE("a cuFile that keeps its own (the limit taken only before the driver opens)") {
    GdsScope gds;
    gds.state.honours_cache_limit = false;
    spill::SpillArena arena = gds_arena(dir.path(), true);
    g.check(gpt_step(g.blocks, spill::detail::shared_arena_stash(arena), g.x0));
    CHECK(gds.state.cache_limits_kib.size() == 1);
    CHECK(spill::stash_stats(arena).cufile_bounce_bytes == 128 * spill::MiB);  // what it keeps
  }
}

// One step whose forward and backward run apart: `between` runs after forward (the writes may
// still be in flight). Throws what the step throws.
template <class Between>
void step_with(GptReference& g, const spill::SpillArena& arena, Between between) {
  for (auto& p : g.blocks->parameters()) p.mutable_grad() = torch::Tensor();
  torch::manual_seed(1234);
  torch::Tensor x = g.x0.clone().requires_grad_(true);
  torch::Tensor y =
      spill::models::run_blocks(g.blocks, spill::detail::shared_arena_stash(arena), x);
  between();
  y.square().mean().backward();
}

TEST_CASE("gds stash: a cuFile failure is an IoError naming its status; the next step is exact") {
  ScratchDir dir;
  GptReference g(kLayers, 9, kShape);
  for (bool asynchronous : {false, true}) {
    for (bool reads : {false, true}) {
      CAPTURE(asynchronous);
      CAPTURE(reads);
      GdsScope gds;
      {
        spill::SpillArena arena = gds_arena(dir.path(), asynchronous);
        g.check(gpt_step(g.blocks, spill::detail::shared_arena_stash(arena), g.x0));
        // CU_FILE_INTERNAL_ERROR: every read, or every write after the first piece (the first
        // input's second piece fails after its device memory was released).
        gds.state.fail_reads = reads;
        gds.state.writes_to_pass = reads ? 1 << 30 : 1;
        gds.state.fail_with = 5030;
        const std::size_t before = gds.transfers().size();
        const std::uint64_t spilled_before = spill::stash_stats(arena).inputs_spilled;
        try {
          step_with(g, arena, [&] {
            // Backward waits for no write: let them all be tried (or done) first. Failing, the
            // first input tries two pieces, the others one each.
            const auto spilled = [&] {
              return reads ? spill::stash_stats(arena).inputs_spilled > spilled_before
                           : gds.transfers().size() >= before + kLayers + 1;
            };
            CHECK(eventually(spilled));
          });
          FAIL("the step succeeded through a failing cuFile");
        } catch (const spill::IoError& e) {
          CHECK(std::string(e.what()).find("CU_FILE_INTERNAL_ERROR (5030)") != std::string::npos);
          CHECK(std::string(e.what()).find(reads ? "cuFileRead" : "cuFileWrite") !=
                std::string::npos);
          CHECK(e.error_number() == EIO);
          CHECK(e.op() == (reads ? spill::IoOp::read : spill::IoOp::write));
        }
        gds.state.fail_with = 0;
        // The failed step's graph is gone, and its regions and device bytes with it.
        CHECK(eventually([&] { return drained(arena); }));
        for (int step = 0; step < 2; ++step) {
          g.check(gpt_step(g.blocks, spill::detail::shared_arena_stash(arena), g.x0));
        }
        CHECK(drained(arena));
      }
      CHECK(gds.state.deregistered.size() == 1);
      CHECK(spill_test::list_dir(dir.path()).empty());
    }
  }
}

TEST_CASE("gds stash: a staging buffer cuFile refuses to register still moves every byte") {
  ScratchDir dir;
  GptReference g(2, 10, kShape);
  GdsScope gds;
  gds.state.buf_register_status = 5036;  // CU_FILE_GPU_MEMORY_PINNING_FAILED
  {
    spill::SpillArena arena = gds_arena(dir.path(), /*asynchronous=*/false);
    g.check(gpt_step(g.blocks, spill::detail::shared_arena_stash(arena), g.x0));
    const spill::StashStats s = spill::stash_stats(arena);
    CHECK_FALSE(s.gds_buffer_registered);
    CHECK(s.gds_buffer_bytes == kStagingBytes);
    CHECK(s.cufile_bytes_written == 2 * kBodyBytes);
    CHECK(s.cufile_bytes_read == 2 * kBodyBytes);
  }
  CHECK(gds.state.registered.size() == 1);
  CHECK(gds.state.deregistered.empty());  // never registered: nothing to deregister
}

TEST_CASE("gds stash: a staging buffer of 0 bytes or above 1 TiB is refused, naming the value") {
  ScratchDir dir;
  GdsScope gds(/*emulate=*/false);
  spill::SpillArena arena = gds_arena(dir.path(), /*asynchronous=*/true);
  const std::uint64_t before = spill::stash_options(arena).gds_buffer_bytes;
  const std::uint64_t too_large = (1ull << 40) + 1;
  for (std::uint64_t bad : {std::uint64_t{0}, too_large, std::uint64_t{~0ull}}) {
    spill::StashOptions o = spill::stash_options(arena);
    o.gds_buffer_bytes = bad;
    try {
      spill::make_arena_stash(arena, o);
      FAIL("gds_buffer_bytes " << bad << " was accepted");
    } catch (const spill::InvalidArgumentError& e) {
      const std::string message = e.what();
      CHECK(message.find("gds_buffer_bytes is " + std::to_string(bad)) != std::string::npos);
      CHECK(message.find("1 TiB") != std::string::npos);
    }
    CHECK_THROWS_AS(spill::set_stash_options(arena, o), spill::InvalidArgumentError);
  }
  CHECK(spill::stash_options(arena).gds_buffer_bytes == before);  // nothing was changed
  spill::StashOptions fine = spill::stash_options(arena);
  fine.gds_buffer_bytes = 1;  // one page, rounded up
  CHECK_NOTHROW(spill::make_arena_stash(arena, fine));
}
