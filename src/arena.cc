#include "spill/arena.h"

#include <algorithm>
#include <cstdlib>

#include "arena_core.h"
#include "host_memory.h"
#include "platform.h"
#include "spill/units.h"
#include "spill_file.h"

namespace spill {
namespace {

void check_capacity(std::uint64_t capacity) {
  if (capacity == 0) {
    throw InvalidArgumentError(
        "spill: ArenaOptions::capacity_bytes is 0; set it to the bytes your layer inputs need, "
        "e.g. spill::bytes_for_layer_inputs(layers, {batch, seq, hidden}, element_size)");
  }
  if (capacity > kMaxCapacityBytes) {
    throw InvalidArgumentError("spill: ArenaOptions::capacity_bytes = " + bytes_with_units(capacity) +
                               " is over the 1 PiB limit; this is likely a unit mistake (bytes, "
                               "not KiB or bits)");
  }
}

std::uint64_t round_to_pages(std::uint64_t bytes) {
  const std::uint64_t page = platform::page_size_bytes();
  return (bytes + page - 1) / page * page;
}

std::unique_ptr<detail::Storage> make_storage(const ArenaOptions& o) {
  if (o.backing == Backing::ram) return detail::make_host_memory(o.capacity_bytes);
  detail::SpillFileOptions f;
  f.directory = o.directory;
  f.capacity_bytes = o.capacity_bytes;
  f.allow_ram_backed_directory = o.allow_ram_backed_directory;
  return detail::make_spill_file(f);
}

[[noreturn]] void throw_exhausted(const ArenaStats& s, std::uint64_t bytes) {
  throw ArenaExhaustedError(
      bytes, s.free_bytes, s.largest_free_block,
      "spill: arena exhausted: asked for " + bytes_with_units(bytes) + " (reserving " +
          bytes_with_units(SlabAllocator::rounded_size(bytes, platform::page_size_bytes())) + "), " +
          bytes_with_units(s.free_bytes) + " free of " + bytes_with_units(s.capacity_bytes) +
          ", largest free block " + bytes_with_units(s.largest_free_block) +
          "; raise ArenaOptions::capacity_bytes or free regions first");
}

}  // namespace

// Note [Default spill directory]
// /tmp (or $TMPDIR) is often tmpfs, where spilling saves nothing. When it is RAM-backed and
// /var/tmp — on disk by convention — is usable, the arena goes there; the file has no name,
// so /var/tmp's persistence does not matter. An explicit $SPILL_DIR is always taken as given.
std::string default_spill_directory() {
  const char* dir = std::getenv("SPILL_DIR");
  if (dir != nullptr && *dir != '\0') return dir;
  const std::string temp = platform::temp_directory();
  platform::FileSystemInfo fs;
  if (platform::file_system_info(temp, &fs) != 0 || !fs.ram_backed) return temp;
  platform::FileSystemInfo var_tmp;
  if (platform::check_writable_directory("/var/tmp") == 0 &&
      platform::file_system_info("/var/tmp", &var_tmp) == 0 && !var_tmp.ram_backed) {
    return "/var/tmp";
  }
  return temp;
}

SpillArena::SpillArena(const ArenaOptions& options) {
  check_capacity(options.capacity_bytes);
  ArenaOptions o = options;
  o.capacity_bytes = round_to_pages(options.capacity_bytes);
  if (o.backing == Backing::disk && o.directory.empty()) o.directory = default_spill_directory();
  if (o.backing == Backing::ram) o.directory.clear();
  core_ = std::make_shared<detail::ArenaCore>(o, make_storage(o));
}

SpillArena::~SpillArena() = default;
SpillArena::SpillArena(SpillArena&&) noexcept = default;
SpillArena& SpillArena::operator=(SpillArena&&) noexcept = default;

detail::ArenaCore& SpillArena::live_core() const {
  if (!core_) throw Error("spill: use of a moved-from SpillArena");
  return *core_;
}

Region SpillArena::allocate(std::uint64_t bytes) {
  std::optional<Block> block = live_core().allocate(bytes);
  if (!block) throw_exhausted(core_->stats(), bytes);
  return Region(core_, block->offset, block->size, bytes);
}

void SpillArena::check_owner(const Region& region) const {
  live_core();
  if (!region.valid()) {
    throw MovedFromRegionError("spill: use of a moved-from or released Region");
  }
  if (region.core_ != core_) {
    throw InvalidArgumentError("spill: the Region at offset " + std::to_string(region.offset()) +
                               " belongs to another SpillArena");
  }
}

void SpillArena::write(Region& region, const void* src, std::uint64_t bytes) {
  check_owner(region);
  region.write(src, bytes);
}

void SpillArena::read(const Region& region, void* dst, std::uint64_t bytes) const {
  check_owner(region);
  region.read(dst, bytes);
}

void SpillArena::prefetch(const Region& region) const {
  check_owner(region);
  region.prefetch();
}

std::pair<std::uint64_t, std::uint64_t> SpillArena::last_written_range() const {
  return live_core().last_written_range();
}

void SpillArena::prefetch_range(std::uint64_t offset, std::uint64_t bytes) const {
  const std::uint64_t capacity = live_core().options().capacity_bytes;
  if (offset >= capacity || bytes == 0) return;
  core_->prefetch(offset, std::min(bytes, capacity - offset));
}

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
bool SpillArena::unnamed_by_o_tmpfile() const {
  return live_core().storage().info().unnamed_by_o_tmpfile;
}

}  // namespace spill
