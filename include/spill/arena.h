// SpillArena: one preallocated, memory-mapped spill file carved into tensor-sized regions.
//
//   spill::ArenaOptions options;
//   options.directory = "/mnt/nvme/spill";         // default: $SPILL_DIR, else a disk temp dir
//   options.capacity_bytes = 8ull << 30;            // required; grows when a step needs more
//   spill::SpillArena arena(options);
//   spill::Region r = arena.allocate(64ull << 20);  // move-only; freed when it dies
//   spill::Region maybe = arena.try_allocate(1 << 20);  // empty when there is no room
//   r.write(src, 64ull << 20);                      // synchronous
//   spill::Pending p = r.write_async(src, 64ull << 20);  // queued; src lives until p completes
//   p.wait();                                       // throws spill::IoError on failure
//   r.read(dst, 64ull << 20);                       // checked against the write's hash
//   spill::Region t = arena.spill_from(src, 4096);  // allocate + queue the write, one call
//   if (t) t.take_into(dst, 4096);                  // wait, read, verify, free: one call back
//   spill::ArenaStats s = arena.stats();            // s.bytes_in_use, s.io_backend, ...
//
// Thread-safe: regions may be allocated, written, read and freed from any thread. Regions keep
// the arena's storage alive, so a region may outlive the SpillArena object that made it; a
// region is returned to the allocator only after every operation queued on it completed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "spill/error.h"
#include "spill/io.h"

namespace spill {

namespace detail {
class ArenaCore;
struct ArenaAccess;  // spillarena's own layers: src/core/arena/arena_internals.h
}  // namespace detail

enum class Backing {
  disk,  // an unnamed, preallocated file in options.directory (the point of spillarena)
  ram,   // anonymous host memory: the same allocator, "offload to CPU RAM"
};

const char* to_string(Backing backing);  // "disk" or "ram"

// What store() does when the host pool has no room for an accelerator input (and, on the CPU,
// when the bytes of inputs whose writes are in flight reach host_pool_bytes). See Note [The host
// pool] in src/core/stash/host_pool.cc.
enum class PoolFull {
  wait,            // wait for the oldest write in flight to complete (counted in StashStats)
  keep_on_device,  // accelerator inputs: keep this input where it is, unspilled (counted too)
};

const char* to_string(PoolFull policy);  // "wait" or "keep_on_device"

// What the stash (spill::checkpoint, spillarena.checkpoint) does with a layer input that finds no
// room in the arena. Either way the refusal is counted (ArenaStats::overflows) and, with
// ArenaOptions::grow, the file grows at the next moment no region is live to what was live at
// once (times growth_margin). Under error a step stops at its first refusal, so what it reached
// may be less than it needs: it may take several failed steps to fit; a refusal for lack of a
// large enough free block (fragmentation) grows nothing. See Note [Growing the arena] in
// src/core/arena/arena_growth.cc.
enum class WhenFull {
  keep_in_memory,  // the input stays where it is for that step, as in-RAM checkpointing holds it
  error,           // spill::ArenaExhaustedError, raised by store(); the arena is unchanged
};

const char* to_string(WhenFull policy);  // "keep_in_memory" or "error"

// ArenaOptions::host_pool_bytes when not set: sized from the first accelerator input (room for
// StashOptions::prefetch_depth + 2 of them, at least 64 MiB), capped by the memory this process
// may use and by RLIMIT_MEMLOCK.
constexpr std::uint64_t kAutomaticHostPool = ~0ull;

struct ArenaOptions {
  std::string directory;             // "" -> default_spill_directory()
  std::uint64_t capacity_bytes = 0;  // required; see spill::bytes_for_layer_inputs
  WhenFull when_full = WhenFull::keep_in_memory;
  // When a step needed more than the capacity (allocations refused), the file grows to what it
  // needed times growth_margin, re-preallocated after a check for free space, at the next
  // allocation that finds no region live. It never shrinks. A grow that the disk refuses
  // changes nothing (counted, one warning). See Note [Growing the arena] in
  // src/core/arena/arena_growth.cc.
  bool grow = true;
  double growth_margin = 1.25;  // 1 to 16
  Backing backing = Backing::disk;
  bool allow_memory_backed_directory = false;  // permit tmpfs/ramfs/hugetlbfs (saves no memory)
  // Start writeback of written regions still held once they pass 64 MiB, oldest first, so dirty
  // pages do not pile up against a container's memory limit; a region freed before that never
  // goes to the disk. See Note [Writeback of what stays] in src/core/io/io_engine.cc.
  bool start_writeback_after_write = true;
  // When > 0, the arena keeps at most this many bytes of written regions in the page cache:
  // older ones are written back and dropped (POSIX_FADV_DONTNEED), oldest first. 0: the kernel
  // decides. See Note [Bounded page cache] in src/core/io/io_engine.cc. Buffered I/O only.
  std::uint64_t page_cache_limit_bytes = 0;
  // How bytes reach the disk: see Note [Direct I/O and the staging pool] in
  // src/core/io/io_engine.cc. automatic picks direct when capacity_bytes exceeds the memory this
  // process may use (cgroup limit, MemAvailable).
  IoMode io = IoMode::automatic;
  IoBackend io_backend = IoBackend::automatic;
  // Host memory for direct I/O's staging pool (rounded to pages, at least one): at most the
  // capacity, and fitted again, up to this, each time the arena grows.
  std::uint64_t staging_bytes = 64ull << 20;
  // Hash what each write puts in a region (XXH3-64) and check every read against it, so bytes
  // changed behind the arena's back raise spill::IntegrityError instead of reaching a gradient.
  // Costs CPU time (XXH3 on one core of the 2-core test VM: ~10 GB/s of cached bytes, ~4.5 GB/s
  // streaming from RAM; BM_Integrity), mostly off the training thread; a buffered restore pays
  // it on the caller's, in the pass that copies the region out. See Note [Integrity hashing] in
  // src/core/integrity/integrity.cc.
  bool verify_integrity = true;
  // The one host-memory budget of the arena stash (spill::checkpoint), in bytes: for accelerator
  // inputs, the pool that device -> host copies land in, O_DIRECT writes read from and reads
  // land in before the host -> device copy — allocated once, pinned once, reused every step;
  // for CPU inputs, the most bytes of inputs whose writes are in flight. At least one page,
  // at most the memory this process may use. See Note [The host pool] in
  // src/core/stash/host_pool.cc. The arena holds the budget (every stash of one arena shares
  // one pool, and the arena checks the value when it is made); the core does not use it. The
  // stash's own settings (asynchronous, prefetch_depth, keep_last) are spill::StashOptions.
  std::uint64_t host_pool_bytes = kAutomaticHostPool;
  PoolFull when_pool_full = PoolFull::wait;
};

// The staging pools accepted: at least one 4 KiB page (a smaller value is refused, not rounded
// up), at most 64 GiB, against unit mistakes. Values in between are rounded up to pages.
constexpr std::uint64_t kMinStagingBytes = 4096;
constexpr std::uint64_t kMaxStagingBytes = 64ull << 30;

// Largest capacity accepted (1 PiB): larger values are taken for a unit mistake. No arena grows
// beyond it, and a region larger than it is an InvalidArgumentError at any capacity.
constexpr std::uint64_t kMaxCapacityBytes = 1ull << 50;

// The range of ArenaOptions::growth_margin.
constexpr double kMinGrowthMargin = 1.0;
constexpr double kMaxGrowthMargin = 16.0;

// Each field is listed once more, in src/core/arena/arena_fields.h (Note [One list of each
// struct's fields] in src/core/stash/stash_fields.h).
struct ArenaStats {
  std::uint64_t capacity_bytes = 0;  // now: after any grows
  std::uint64_t bytes_in_use = 0;    // rounded sizes of live regions
  std::uint64_t peak_bytes_in_use = 0;
  std::uint64_t bytes_requested = 0;  // sizes asked for by live regions, before rounding
  std::uint64_t live_regions = 0;
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t reuse_hits = 0;  // allocations placed entirely in space used before
  std::uint64_t largest_free_block = 0;
  std::uint64_t free_bytes = 0;
  std::uint64_t high_water_bytes = 0;  // highest end offset ever handed out
  std::uint64_t bytes_written = 0;     // through write(), all time
  std::uint64_t bytes_read = 0;        // through read(), all time
  // The I/O engine (disk backing). See Note [The I/O queue] in src/core/io/io_queue.cc.
  IoMode io_mode = IoMode::buffered;  // resolved: buffered or direct
  IoBackend io_backend = IoBackend::thread_pool;
  std::string io_note;              // why this mode/backend (automatic choices, fallbacks)
  std::uint64_t staging_bytes = 0;  // the staging pool (direct mode)
  std::uint64_t staging_waits = 0;  // writes that found every staging slot busy
  std::uint64_t staging_wait_ns = 0;
  // verify_integrity: bytes hashed (written and read back), read bytes that matched the hash of
  // their write, and reads that did not (each one an IntegrityError).
  std::uint64_t bytes_hashed = 0;
  std::uint64_t bytes_verified = 0;
  std::uint64_t integrity_failures = 0;
  // Sizing (Note [Growing the arena] in src/core/arena/arena_growth.cc). overflows: allocations
  // that found no room (with WhenFull::keep_in_memory the stash kept those inputs in memory), of
  // overflow_bytes asked for. capacity_needed_bytes: the most the arena was asked to hold at
  // once between two moments with no region live (regions in use plus the overflow), so a
  // capacity that would have fit. initial_capacity_bytes: the capacity the arena was made with.
  // grows: times the file grew; grow_failures: grows the disk refused (no space, fallocate or
  // mmap failed), the last one's reason in grow_note.
  std::uint64_t overflows = 0;
  std::uint64_t overflow_bytes = 0;
  std::uint64_t capacity_needed_bytes = 0;
  std::uint64_t initial_capacity_bytes = 0;
  std::uint64_t grows = 0;
  std::uint64_t grow_failures = 0;
  std::string grow_note;
};

// A move-only handle to one region of an arena. The region is freed when the handle dies (or on
// free()). Using a moved-from or freed handle throws spill::MovedFromRegionError.
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
  bool valid() const { return core_ != nullptr; }
  explicit operator bool() const { return valid(); }

  // Copies bytes in and out. `offset_in_region + bytes` must be <= size(). With
  // verify_integrity a read throws spill::IntegrityError when the bytes of a write it covers
  // whole differ from what was written (see Note [Integrity hashing] in
  // src/core/integrity/integrity.cc); `dst` must not be used then.
  void write(const void* src, std::uint64_t bytes, std::uint64_t offset_in_region = 0);
  void read(void* dst, std::uint64_t bytes, std::uint64_t offset_in_region = 0) const;
  // Queued copies: they return before the bytes moved (a buffered write of at most 512 KiB is
  // made before write_async returns, its Pending ready). `src`/`dst` must stay valid and `src`
  // unchanged until the Pending completes, in every mode (a direct-mode write from memory
  // aligned to SpillArena::io_alignment() is written from where it is, without a staging
  // copy). A failure surfaces at Pending::wait, and at every write or read of the arena
  // (synchronous too) until this region is freed; a read's integrity check, done before the
  // Pending is ready, fails its Pending::wait with spill::IntegrityError (on a RAM arena,
  // read_async checks and throws at once). A direct-mode read lands in `dst` without a copy
  // when `dst` is so aligned.
  // `offset_in_region` moves a piece of the region (page-aligned in direct mode).
  Pending write_async(const void* src, std::uint64_t bytes, std::uint64_t offset_in_region = 0);
  Pending read_async(void* dst, std::uint64_t bytes, std::uint64_t offset_in_region = 0);
  // The operations queued on this region so far (its writes and reads).
  Pending pending() const;
  // One call coming back: waits for the operations queued on the region, reads its first
  // `bytes` into `dst` (checked against the write's hash) and frees the region. True when the
  // bytes were in memory already (resident pages, or a read_ahead into `dst` that completed),
  // so nothing waited for the disk. On a throw the region stays allocated.
  bool take_into(void* dst, std::uint64_t bytes);
  // Starts bringing the region's bytes into memory without waiting: with `dst`, its
  // requested_bytes() are read there (take_into(dst, ...) then completes that read); without,
  // the page cache reads ahead.
  void read_ahead(void* dst = nullptr);

  // Frees the region (after its queued operations completed); the handle becomes empty.
  void free();

 private:
  friend class SpillArena;
  friend struct detail::ArenaAccess;
  Region(std::shared_ptr<detail::ArenaCore> core, std::uint64_t offset, std::uint64_t size,
         std::uint64_t requested);
  explicit Region(std::shared_ptr<void> overflow_hold) : overflow_hold_(std::move(overflow_hold)) {}
  detail::ArenaCore& core_or_throw() const;
  // io = gds, for the stash through detail::write_from_device and read_to_device
  // (src/core/arena/arena_internals.h).
  void write_from_device(const void* device_ptr, std::uint64_t bytes,
                         std::uint64_t offset_in_region);
  void read_to_device(void* device_ptr, std::uint64_t bytes, std::uint64_t offset_in_region);

  std::shared_ptr<detail::ArenaCore> core_;
  std::uint64_t offset_ = 0;
  std::uint64_t size_ = 0;
  std::uint64_t requested_ = 0;
  Pending in_flight_;  // operations queued on this region, waited for before it is freed
  void* ahead_destination_ = nullptr;  // read_ahead(dst)'s read, covered by in_flight_
  Pending ahead_;
  // An empty Region from an allocation that found no room: the overflow's bytes count toward the
  // arena's demand while this lives. See Note [Growing the arena] in arena_growth.cc.
  std::shared_ptr<void> overflow_hold_;
};

class SpillArena {
 public:
  // Vets the directory, creates and preallocates the file (or reserves host memory). A
  // moved-from SpillArena throws spill::Error from every member. Throws
  // InvalidArgumentError, DirectoryError, MemoryBackedDirectoryError, InsufficientSpaceError,
  // PreallocationError, IoError; nothing is left on disk after a throw.
  explicit SpillArena(const ArenaOptions& options);
  ~SpillArena();
  SpillArena(SpillArena&&) noexcept;
  SpillArena& operator=(SpillArena&&) noexcept;
  SpillArena(const SpillArena&) = delete;
  SpillArena& operator=(const SpillArena&) = delete;

  // A region of at least `bytes` (> 0). Throws ArenaExhaustedError (arena unchanged) when no
  // free block is large enough, InvalidArgumentError for 0 bytes or more than
  // kMaxCapacityBytes. With options().grow, the arena first grows when an earlier allocation
  // found no room and no region is live now.
  Region allocate(std::uint64_t bytes);
  // allocate(), but an empty Region (valid() false) where allocate would throw
  // ArenaExhaustedError. Both count the refusal in ArenaStats::overflows. The empty Region
  // stands for the input kept in memory instead: while it lives, its bytes count toward what
  // the arena needs at once (capacity_needed_bytes, the figure a grow aims at); keep it as long
  // as that input is held and drop it (or free() it) when the input goes.
  Region try_allocate(std::uint64_t bytes);
  // One call going forward: a region of `bytes` with the write of `src` queued (Region::
  // pending() says when it completed; `src` must stay valid and unchanged until then). Where
  // there is no room: an empty Region under WhenFull::keep_in_memory, ArenaExhaustedError under
  // WhenFull::error (options().when_full).
  Region spill_from(const void* src, std::uint64_t bytes);

  ArenaStats stats() const;
  // As resolved: directory, io mode, rounded sizes. capacity_bytes is the capacity the arena
  // was made with; stats().capacity_bytes is the capacity now.
  const ArenaOptions& options() const;
  IoMode io_mode() const;              // resolved: buffered or direct
  std::uint64_t io_alignment() const;  // alignment a direct read or write needs to skip staging
  Backing backing() const;
  const std::string& directory() const;         // "" for the RAM backing
  const std::string& file_system_type() const;  // "ext4", ... or "ram"
  // True when the spill file never had a name (made unnamed by the system); false when it had
  // one for an instant (created, then unlinked) or the arena is in RAM.
  bool opened_without_name() const;

  // A second handle to this same arena (same file, same allocator, same stats). Layers that
  // must outlive the caller's SpillArena object (an autograd graph, a module) hold one.
  SpillArena shared_handle() const;

 private:
  friend struct detail::ArenaAccess;
  explicit SpillArena(std::shared_ptr<detail::ArenaCore> core) : core_(std::move(core)) {}
  detail::ArenaCore& live_core() const;  // throws spill::Error on a moved-from arena
  std::shared_ptr<detail::ArenaCore> core_;
};

// The directory an arena uses when options.directory is empty: $SPILL_DIR, else $TMPDIR (or
// /tmp) unless that is memory-backed (tmpfs), in which case /var/tmp when it is on disk.
std::string default_spill_directory();

}  // namespace spill
