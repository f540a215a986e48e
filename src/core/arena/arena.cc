#include "spill/arena.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/arena/arena_core.h"
#include "core/file/spill_file.h"
#include "core/file/storage.h"
#include "core/io/gds.h"
#include "core/os/platform.h"
#include "core/os/usable_memory.h"
#include "core/text/enum_names.h"
#include "spill/process_memory.h"
#include "spill/sizing.h"
#include "spill/units.h"

namespace spill {

const char* to_string(Backing backing) { return name_in({"disk", "ram"}, backing); }
const char* to_string(PoolFull policy) { return name_in({"wait", "keep_on_device"}, policy); }
const char* to_string(WhenFull policy) { return name_in({"keep_in_memory", "error"}, policy); }
namespace {

void check_capacity(std::uint64_t capacity) {
  if (capacity == 0) {
    throw InvalidArgumentError(
        "spill: ArenaOptions::capacity_bytes is 0; set it to the bytes your layer inputs need, "
        "e.g. spill::bytes_for_layer_inputs(layers, {batch, seq, hidden}, element_size)");
  }
  if (capacity > kMaxCapacityBytes) {
    throw InvalidArgumentError(
        "spill: ArenaOptions::capacity_bytes = " + bytes_with_units(capacity) +
        " is over the 1 PiB limit; this is likely a unit mistake (bytes, "
        "not KiB or bits)");
  }
}

// NaN fails both comparisons, so it is refused too.
void check_growth_margin(double margin) {
  if (margin >= kMinGrowthMargin && margin <= kMaxGrowthMargin) return;
  throw InvalidArgumentError("spill: ArenaOptions::growth_margin = " + format_real(margin) +
                             " is out of range; use 1 (grow to exactly what a step needed) to 16 "
                             "(default 1.25)");
}

void check_staging(std::uint64_t staging) {
  if (staging < kMinStagingBytes || staging > kMaxStagingBytes) {
    throw InvalidArgumentError("spill: ArenaOptions::staging_bytes = " + bytes_with_units(staging) +
                               " is out of range; use " + human_bytes(kMinStagingBytes) + " to " +
                               human_bytes(kMaxStagingBytes) + " (default 64 MiB)");
  }
}

// Memory the arena or its stash will touch: more than this process may still use would not fail
// there but summon the OOM killer, for this process or a neighbour. `what`: the
// InsufficientSpaceError's path; `option`: the ArenaOptions field asking for `bytes`.
void check_fits_in_memory(const char* what, const char* option, std::uint64_t bytes,
                          const char* advice) {
  std::uint64_t usable = 0;
  if (detail::fits_in_usable_memory(bytes, &usable)) return;
  throw InsufficientSpaceError(what, bytes, usable,
                               std::string("spill: ArenaOptions::") + option + " = " +
                                   bytes_with_units(bytes) + " exceeds the " +
                                   bytes_with_units(usable) +
                                   " of memory this process may still use (MemAvailable, memory "
                                   "cgroup); " +
                                   advice);
}

// The staging pool is touched when the arena is made (and again when a grow enlarges it, with
// the same check: IoEngine::fit_staging).
void check_staging_fits(std::uint64_t staging) {
  check_fits_in_memory("<staging>", "staging_bytes", staging, "lower it (default 64 MiB)");
}

// An explicit host pool: at least a page, and no more than the memory this process may still use
// (allocated at the first accelerator input, it would summon the OOM killer there instead).
// RLIMIT_MEMLOCK is checked where the pool is pinned (src/core/stash/host_pool.cc).
void check_host_pool(std::uint64_t pool) {
  if (pool == kAutomaticHostPool) return;
  const std::uint64_t page = platform::capabilities().page_size_bytes;
  if (pool < page) {
    throw InvalidArgumentError("spill: ArenaOptions::host_pool_bytes = " + std::to_string(pool) +
                               " is below one page (" + std::to_string(page) +
                               " bytes); give at least one input's bytes, or leave it unset "
                               "(spill::kAutomaticHostPool) to size it from the first input");
  }
  check_fits_in_memory("<host pool>", "host_pool_bytes", pool, "lower it or leave it unset");
}

// Note [Choosing the I/O mode]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// IoMode::automatic asks how much memory this process may still use (the memory cgroup's limit
// less its usage, and MemAvailable) and spills with direct I/O when the arena — with the stash's
// host pool, when its size is set — is larger: the page cache could not hold it anyway, and
// would compete with the model for the limit. Where
// the file system refuses O_DIRECT, buffered I/O runs and the stats say why. io = gds (never
// chosen here) runs as direct for the engine; see Note [GPUDirect Storage] in src/core/io/gds.cc.
IoMode resolve_io_mode(const ArenaOptions& o, std::string* note) {
  if (o.backing == Backing::ram) {
    *note = "RAM backing: no disk I/O";
    return IoMode::buffered;
  }
  if (o.io == IoMode::gds) {
    *note = "io = gds as asked: device memory through cuFile (" + detail::cufile_library_name() +
            "); host-side I/O as direct";
    return IoMode::direct;
  }
  if (o.io != IoMode::automatic) {
    *note = std::string("io = ") + to_string(o.io) + " as asked";
    return o.io;
  }
  const std::uint64_t usable = memory_limits().usable_bytes();
  // A buffered spill fills the page cache with up to the arena's bytes, beside the stash's
  // host pool when one is set (an automatic pool takes at most half of what is left).
  const std::uint64_t pool = o.host_pool_bytes == kAutomaticHostPool ? 0 : o.host_pool_bytes;
  const std::uint64_t needed = o.capacity_bytes + pool;
  const std::string sizes =
      "the arena (" + bytes_with_units(o.capacity_bytes) + ")" +
      (pool > 0 ? " plus the host pool (" + bytes_with_units(pool) + ")" : std::string()) +
      (needed > usable ? " exceeds" : " fits in") + " the memory this process may use (" +
      bytes_with_units(usable) + ")";
  if (needed <= usable) {
    *note = "automatic: buffered, because " + sizes;
    return IoMode::buffered;
  }
  std::string why;
  if (!detail::direct_io_supported(o.directory, &why)) {
    *note = "automatic: buffered although " + sizes + ", because " + why;
    return IoMode::buffered;
  }
  *note = "automatic: direct, because " + sizes;
  return IoMode::direct;
}

std::unique_ptr<detail::Storage> make_storage(const ArenaOptions& o) {
  if (o.backing == Backing::ram) return detail::make_host_memory(o.capacity_bytes);
  detail::SpillFileOptions f;
  f.directory = o.directory;
  f.capacity_bytes = o.capacity_bytes;
  f.allow_memory_backed_directory = o.allow_memory_backed_directory;
  f.direct = o.io == IoMode::direct;
  return detail::make_spill_file(f);
}

// What happens next, said for this arena's options: a grow comes only when what was live at once
// exceeded the capacity (not for a refusal of fragmentation), and only to that times the margin.
std::string what_growth_does(const ArenaOptions& o, const ArenaStats& s, std::uint64_t reserving) {
  if (!o.grow) return "growing is off (ArenaOptions::grow = false)";
  const std::uint64_t live = s.bytes_in_use + reserving;
  if (live <= s.capacity_bytes) {
    return "the arena does not grow for this: its free space is enough but no free block is "
           "large enough (fragmentation); free regions first";
  }
  return "once no region is live the arena grows to what was live when this allocation failed "
         "times growth_margin " +
         format_real(o.growth_margin) + ", " +
         human_bytes(capacity_with_margin(live, o.growth_margin)) +
         "; a step that needs more fails again at its first refusal, so a step may fail several "
         "times before it fits";
}

[[noreturn]] void throw_exhausted(const ArenaOptions& o, const ArenaStats& s, std::uint64_t bytes) {
  const std::uint64_t page = platform::capabilities().page_size_bytes;
  const std::uint64_t reserving = SlabAllocator::rounded_size(bytes, page);
  throw ArenaExhaustedError(
      bytes, s.free_bytes, s.largest_free_block,
      "spill: arena exhausted: asked for " + bytes_with_units(bytes) + " (reserving " +
          bytes_with_units(reserving) + "), " + bytes_with_units(s.free_bytes) + " free of " +
          bytes_with_units(s.capacity_bytes) + ", largest free block " +
          bytes_with_units(s.largest_free_block) + "; " + what_growth_does(o, s, reserving) +
          ". Make the arena with the capacity a whole step needs, or use "
          "WhenFull::keep_in_memory, which never fails a step (Note [Growing the arena])");
}

}  // namespace

// Note [Default spill directory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// /tmp (or $TMPDIR) is often tmpfs, where spilling saves nothing. When it is memory-backed and
// /var/tmp — on disk by convention — is usable, the arena goes there; the file has no name,
// so /var/tmp's persistence does not matter. An explicit $SPILL_DIR is always taken as given.
std::string default_spill_directory() {
  const char* dir = std::getenv("SPILL_DIR");
  if (dir != nullptr && *dir != '\0') return dir;
  const std::string temp = platform::temp_directory();
  platform::FileSystemInfo fs;
  if (platform::file_system_info(temp, &fs) != 0 || !fs.memory_backed) return temp;
  platform::FileSystemInfo var_tmp;
  if (platform::check_writable_directory("/var/tmp") == 0 &&
      platform::file_system_info("/var/tmp", &var_tmp) == 0 && !var_tmp.memory_backed) {
    return "/var/tmp";
  }
  return temp;
}

SpillArena::SpillArena(const ArenaOptions& options) {
  check_capacity(options.capacity_bytes);
  check_growth_margin(options.growth_margin);
  check_staging(options.staging_bytes);
  check_host_pool(options.host_pool_bytes);
  ArenaOptions o = options;
  o.capacity_bytes = detail::round_to_pages(options.capacity_bytes);
  // The pool is at most the capacity, and grows with it: Note [The staging pool follows the
  // arena] in src/core/io/io_engine.cc.
  o.staging_bytes = detail::round_to_pages(options.staging_bytes);
  if (o.backing == Backing::disk && o.directory.empty()) o.directory = default_spill_directory();
  // Captured once, for messages: Note [Room is found from the descriptor] (spill_file.cc).
  if (o.backing == Backing::disk) o.directory = platform::absolute_path(o.directory);
  if (o.backing == Backing::ram) o.directory.clear();
  std::string io_note;
  if (o.backing == Backing::disk) detail::check_directory(o.directory);
  // io = gds without libcufile is a typed error now, not at the first device input.
  const bool gds = o.io == IoMode::gds && o.backing == Backing::disk;
  if (gds) detail::cufile_library();
  o.io = resolve_io_mode(o, &io_note);
  if (o.io == IoMode::direct) check_staging_fits(std::min(o.staging_bytes, o.capacity_bytes));
  core_ = std::make_shared<detail::ArenaCore>(o, make_storage(o), std::move(io_note), gds);
}

SpillArena::~SpillArena() = default;
SpillArena::SpillArena(SpillArena&&) noexcept = default;
SpillArena& SpillArena::operator=(SpillArena&&) noexcept = default;

detail::ArenaCore& SpillArena::live_core() const {
  if (!core_) throw Error("spill: use of a moved-from SpillArena");
  core_->check_process("a use of a SpillArena");  // Note [Arenas across fork] (fork_guard.cc)
  return *core_;
}

Region SpillArena::allocate(std::uint64_t bytes) {
  Region region = try_allocate(bytes);
  if (!region) throw_exhausted(core_->options(), core_->stats(), bytes);
  return region;
}

Region SpillArena::try_allocate(std::uint64_t bytes) {
  std::shared_ptr<void> overflow_hold;
  std::optional<Block> block = live_core().allocate(bytes, &overflow_hold);
  if (!block) return Region(std::move(overflow_hold));
  return Region(core_, block->offset, block->size, bytes);
}

// The stash's one call going forward (Note [One call each way] in src/core/arena/region.cc).
Region SpillArena::spill_from(const void* src, std::uint64_t bytes) {
  Region region =
      live_core().options().when_full == WhenFull::error ? allocate(bytes) : try_allocate(bytes);
  if (region) region.write_async(src, bytes);
  return region;
}

const ArenaOptions& SpillArena::options() const { return live_core().options(); }
IoMode SpillArena::io_mode() const { return live_core().io_mode(); }

std::uint64_t SpillArena::io_alignment() const { return live_core().io_alignment(); }

SpillArena SpillArena::shared_handle() const {
  live_core();
  return SpillArena(core_);
}

ArenaStats SpillArena::stats() const { return live_core().stats(); }
Backing SpillArena::backing() const { return live_core().options().backing; }
const std::string& SpillArena::directory() const { return live_core().options().directory; }
const std::string& SpillArena::file_system_type() const {
  return live_core().storage().info().file_system_type;
}
bool SpillArena::opened_without_name() const {
  return live_core().storage().info().opened_without_name;
}

}  // namespace spill
