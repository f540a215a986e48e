// SpillArena: one preallocated, memory-mapped spill file carved into tensor-sized regions.
//
//   spill::ArenaOptions options;
//   options.directory = "/mnt/nvme/spill";         // default: $SPILL_DIR, else a disk temp dir
//   options.capacity_bytes = 8ull << 30;            // required
//   spill::SpillArena arena(options);
//   spill::Region r = arena.allocate(64ull << 20);  // move-only; freed when it dies
//   arena.write(r, src, 64ull << 20);               // pwrite into the file
//   arena.prefetch(r);                              // readahead before you need it back
//   arena.read(r, dst, 64ull << 20);
//   spill::ArenaStats s = arena.stats();            // s.bytes_in_use, s.peak_bytes_in_use, ...
//
// Thread-safe: regions may be allocated, written, read and freed from any thread. Regions keep
// the arena's storage alive, so a region may outlive the SpillArena object that made it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "spill/error.h"

namespace spill {

namespace detail {
class ArenaCore;
}

enum class Backing {
  disk,  // an unnamed, preallocated file in options.directory (the point of spillarena)
  ram,   // anonymous host memory: the same allocator, "offload to CPU RAM"
};

struct ArenaOptions {
  std::string directory;              // "" -> default_spill_directory()
  std::uint64_t capacity_bytes = 0;   // required; see spill::bytes_for_layer_inputs
  Backing backing = Backing::disk;
  bool allow_ram_backed_directory = false;  // permit tmpfs/ramfs/hugetlbfs (saves no memory)
  // Start writeback of each region as soon as it is written, so dirty pages do not pile up
  // against a container's memory limit.
  bool start_writeback_after_write = true;
  // When > 0, the arena keeps at most this many bytes of written regions in the page cache:
  // older ones are written back and dropped (POSIX_FADV_DONTNEED), oldest first. 0: the kernel
  // decides. See Note [Bounded page cache].
  std::uint64_t page_cache_limit_bytes = 0;
};

// Largest capacity accepted (1 PiB): larger values are taken for a unit mistake.
constexpr std::uint64_t kMaxCapacityBytes = 1ull << 50;

struct ArenaStats {
  std::uint64_t capacity_bytes = 0;
  std::uint64_t bytes_in_use = 0;        // rounded sizes of live regions
  std::uint64_t peak_bytes_in_use = 0;
  std::uint64_t bytes_requested = 0;     // sizes asked for by live regions, before rounding
  std::uint64_t live_regions = 0;
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t reuse_hits = 0;          // allocations placed entirely in space used before
  std::uint64_t largest_free_block = 0;
  std::uint64_t free_bytes = 0;
  std::uint64_t high_water_bytes = 0;    // highest end offset ever handed out
  std::uint64_t bytes_written = 0;       // through write(), all time
  std::uint64_t bytes_read = 0;          // through read(), all time
};

// A move-only handle to one region of an arena. The region is freed when the handle dies (or on
// release()). Using a moved-from or released handle throws spill::MovedFromRegionError.
class Region {
 public:
  Region() = default;
  Region(Region&& other) noexcept;
  Region& operator=(Region&& other) noexcept;
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  ~Region();

  std::uint64_t offset() const;           // byte offset in the spill file, page aligned
  std::uint64_t size() const;             // bytes reserved (rounded up to a size class)
  std::uint64_t requested_bytes() const;  // bytes asked for
  void* data() const;                     // pointer into the mapping, page aligned
  bool valid() const { return core_ != nullptr; }
  explicit operator bool() const { return valid(); }

  // Copies bytes in and out. `offset_in_region + bytes` must be <= size().
  void write(const void* src, std::uint64_t bytes, std::uint64_t offset_in_region = 0);
  void read(void* dst, std::uint64_t bytes, std::uint64_t offset_in_region = 0) const;
  // Zero-copy read: the region's bytes in the mapping, counted in bytes_read. The caller reads
  // them in place (the checkpoint wrapper wraps them in a tensor); non-resident pages are read
  // ahead first. `bytes` must be <= size().
  const void* read_in_place(std::uint64_t bytes) const;
  // Hints: readahead of the region; writeback start; writeback, wait and drop from the cache.
  void prefetch() const;
  void start_writeback() const;
  void drop_cached_pages() const;

  void release();  // frees the region now; the handle becomes empty

 private:
  friend class SpillArena;
  Region(std::shared_ptr<detail::ArenaCore> core, std::uint64_t offset, std::uint64_t size,
         std::uint64_t requested);
  const detail::ArenaCore& core_or_throw() const;

  std::shared_ptr<detail::ArenaCore> core_;
  std::uint64_t offset_ = 0;
  std::uint64_t size_ = 0;
  std::uint64_t requested_ = 0;
};

class SpillArena {
 public:
  // Vets the directory, creates and preallocates the file (or reserves host memory). A
  // moved-from SpillArena throws spill::Error from every member. Throws
  // InvalidArgumentError, DirectoryError, RamBackedDirectoryError, InsufficientSpaceError,
  // PreallocationError, IoError; nothing is left on disk after a throw.
  explicit SpillArena(const ArenaOptions& options);
  ~SpillArena();
  SpillArena(SpillArena&&) noexcept;
  SpillArena& operator=(SpillArena&&) noexcept;
  SpillArena(const SpillArena&) = delete;
  SpillArena& operator=(const SpillArena&) = delete;

  // A region of at least `bytes` (> 0). Throws ArenaExhaustedError (arena unchanged) when no
  // free block is large enough, InvalidArgumentError for 0 bytes.
  Region allocate(std::uint64_t bytes);

  // The same as region.write/read/prefetch, after checking the region belongs to this arena.
  void write(Region& region, const void* src, std::uint64_t bytes);
  void read(const Region& region, void* dst, std::uint64_t bytes) const;
  void prefetch(const Region& region) const;

  // {offset, bytes} of the most recent write, and a readahead hint for any range: the
  // checkpoint wrapper prefetches, in backward, the region written just before the current one.
  std::pair<std::uint64_t, std::uint64_t> last_written_range() const;
  void prefetch_range(std::uint64_t offset, std::uint64_t bytes) const;

  ArenaStats stats() const;
  Backing backing() const;
  const std::string& directory() const;         // "" for the RAM backing
  const std::string& file_system_type() const;  // "ext4", ... or "ram"
  bool unnamed_by_o_tmpfile() const;            // false: the mkstemp+unlink fallback was used

  // A second handle to this same arena (same file, same allocator, same stats). Layers that
  // must outlive the caller's SpillArena object (an autograd graph, a module) hold one.
  SpillArena shared_handle() const;

 private:
  explicit SpillArena(std::shared_ptr<detail::ArenaCore> core) : core_(std::move(core)) {}
  void check_owner(const Region& region) const;
  detail::ArenaCore& live_core() const;  // throws spill::Error on a moved-from arena
  std::shared_ptr<detail::ArenaCore> core_;
};

// The directory an arena uses when options.directory is empty: $SPILL_DIR, else $TMPDIR (or
// /tmp) unless that is RAM-backed (tmpfs), in which case /var/tmp when it is on disk.
std::string default_spill_directory();

}  // namespace spill
