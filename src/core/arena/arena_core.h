// ArenaCore: what a SpillArena and its Regions share. Storage + allocator + I/O engine +
// counters. Kept alive by every Region, so regions may outlive the arena object.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/alloc/slab_allocator.h"
#include "core/file/storage.h"
#include "core/integrity/integrity.h"
#include "core/io/gds.h"
#include "core/io/io_engine.h"
#include "core/os/fork_guard.h"
#include "core/os/mutex.h"
#include "spill/arena.h"

namespace spill::detail {

// `bytes` rounded up to whole pages: the sizes an arena and its grows are made in. For sizes up
// to kMaxCapacityBytes (checked before), so the sum cannot overflow.
std::uint64_t round_to_pages(std::uint64_t bytes);

// What the I/O engine takes of the arena's options (IoEngineOptions in core/io/io_engine.h).
IoEngineOptions io_engine_options(const ArenaOptions& options);

class ArenaCore {
 public:
  // `options.io` is resolved (buffered or direct); `io_note` says why, for the stats.
  // `gds_requested`: io = gds was asked (then resolved to direct).
  ArenaCore(const ArenaOptions& options, std::unique_ptr<Storage> storage, std::string io_note,
            bool gds_requested = false);
  ~ArenaCore();

  // In a fork() child every operation below throws spill::ForkedProcessError, free() and the
  // destructor touch nothing of the parent's: see Note [Arenas across fork] in
  // src/core/os/fork_guard.cc. check_process is that check, for SpillArena's members.
  void check_process(const char* operation) const { owner_.check(operation); }

  // A block, or nullopt when none is large enough: an overflow, counted, whose bytes count
  // toward the demand while *overflow_hold (set then) lives. Grows the storage first when an
  // earlier allocation found no room and no region is live now. See Note [Growing the arena] in
  // src/core/arena/arena_growth.cc.
  std::optional<Block> allocate(std::uint64_t bytes, std::shared_ptr<void>* overflow_hold);
  void free(const Block& block) noexcept;
  // Warnings for people, each given once per arena (the first overflow, the first refused grow);
  // the front ends (spill::checkpoint, spillarena.checkpoint) take them and warn.
  std::vector<std::string> take_notices();

  // Region I/O: `start` is the region's offset in the file (its integrity hashes are kept by it),
  // `at` the offset in it. Reads throw (or their Pending fails with) spill::IntegrityError.
  void write(std::uint64_t start, std::uint64_t at, const void* src, std::uint64_t bytes);
  void read(std::uint64_t start, std::uint64_t at, void* dst, std::uint64_t bytes);
  Pending write_async(std::uint64_t start, std::uint64_t at, const void* src, std::uint64_t bytes);
  Pending read_async(std::uint64_t start, std::uint64_t at, void* dst, std::uint64_t bytes);
  void read_ahead(std::uint64_t offset, std::uint64_t bytes) const;
  // Host memory only (the RAM arena): the region's bytes where they are, checked against the
  // write's hashes. See Note [A RAM restore is a view] in src/core/arena/arena_internals.cc.
  const void* host_bytes(std::uint64_t start, std::uint64_t bytes);
  void start_writeback(std::uint64_t offset, std::uint64_t bytes) const;
  void drop_cached_pages(std::uint64_t offset, std::uint64_t bytes) const;

  // See SpillArena::attachment.
  std::shared_ptr<void> attachment(const std::function<std::shared_ptr<void>()>& make);

  ArenaStats stats() const;
  void add_sizing_stats(ArenaStats* stats) const;  // the fields of Note [Growing the arena]
  IoMode io_mode() const { return options_.io; }
  // io = gds was asked: device inputs go through cuFile (src/core/io/gds.h) on
  // storage().direct_fd().
  bool gds_requested() const { return gds_requested_; }
  // io = gds: synchronous transfers between device memory and the region through cuFile;
  // `at` and `bytes` multiples of GdsFile::kAlignmentBytes. Bytes the host never sees are not
  // hashed: a write forgets the hashes of the range it covers.
  void write_from_device(std::uint64_t start, std::uint64_t at, const void* device_ptr,
                         std::uint64_t bytes);
  void read_to_device(std::uint64_t start, std::uint64_t at, void* device_ptr, std::uint64_t bytes);
  std::uint64_t io_alignment() const;
  const ArenaOptions& options() const { return options_; }
  const Storage& storage() const {
    owner_.check("a use of the spill file");
    return *storage_;
  }

 private:
  // verify_integrity (see Note [Integrity hashing] in src/core/integrity/integrity.cc): how a
  // queued write hashes and a queued read checks its bytes as they move; a synchronous check that
  // throws spill::IntegrityError.
  IoEngine::Hooks hash_written(std::uint64_t start, std::uint64_t at, const void* src,
                               std::uint64_t bytes);
  IoEngine::Hooks check_read(std::uint64_t start, std::uint64_t at, void* dst, std::uint64_t bytes);
  void write_here(std::uint64_t start, std::uint64_t at, const void* src, std::uint64_t bytes);
  void write_hashed(std::uint64_t start, std::uint64_t at, const char* src, std::uint64_t bytes);
  void write_memory_hashed(std::uint64_t start, const Span& write, const char* src);
  void read_resident(std::uint64_t start, std::uint64_t at, char* dst, std::uint64_t bytes);
  // A buffered write_async of at most kWriteAtOnceBytes, made by write_here() on this thread (Note
  // [A small write is made at once] in arena_core.cc).
  static constexpr std::uint64_t kWriteAtOnceBytes = kHashSliceBytes;
  Pending write_at_once(std::uint64_t start, std::uint64_t at, const void* src,
                        std::uint64_t bytes);
  template <class Read>
  void read_mapping(std::uint64_t offset, std::uint64_t bytes, IoOp op, Read& read) const;
  void throw_if_shrunk(std::uint64_t offset, std::uint64_t bytes, IoOp op) const;
  [[noreturn]] void throw_unreadable(std::uint64_t offset, std::uint64_t bytes, IoOp op) const;

  // Note [Growing the arena] (src/core/arena/arena_growth.cc).
  void grow_if_due() REQUIRES(sizing_mutex_);
  std::uint64_t grow_target(std::uint64_t needed) const;
  void record_demand(std::uint64_t bytes_in_use) REQUIRES(sizing_mutex_);
  std::shared_ptr<void> record_overflow(std::uint64_t bytes) REQUIRES(sizing_mutex_);
  std::string overflow_notice(std::uint64_t bytes) const REQUIRES(sizing_mutex_);

  const ProcessOwner owner_;
  const ArenaOptions options_;
  const std::string io_note_;
  const bool gds_requested_;
  std::unique_ptr<Storage> storage_;
  SlabAllocator allocator_;
  std::atomic<std::uint64_t> bytes_written_{0};
  std::atomic<std::uint64_t> bytes_read_{0};
  std::unique_ptr<IntegrityLedger> ledger_;  // verify_integrity only; outlives the engine
  std::unique_ptr<GdsFile> gds_;             // io = gds only
  // Sizing: held by allocate (and a grow) only; free() never takes it.
  mutable Mutex sizing_mutex_;
  // Rounded bytes of overflowed inputs still held (their holds alive). Shared with the holds,
  // which take their bytes off when they die, on any thread and without the mutex, and may
  // outlive the arena.
  const std::shared_ptr<std::atomic<std::uint64_t>> overflow_held_ =
      std::make_shared<std::atomic<std::uint64_t>>(0);
  std::uint64_t needed_since_empty_ GUARDED_BY(sizing_mutex_) = 0;
  std::uint64_t needed_peak_ GUARDED_BY(sizing_mutex_) = 0;
  std::uint64_t overflows_ GUARDED_BY(sizing_mutex_) = 0;
  std::uint64_t overflow_bytes_ GUARDED_BY(sizing_mutex_) = 0;
  std::uint64_t grows_ GUARDED_BY(sizing_mutex_) = 0;
  std::uint64_t grow_failures_ GUARDED_BY(sizing_mutex_) = 0;
  std::string grow_note_ GUARDED_BY(sizing_mutex_);
  bool warned_overflow_ GUARDED_BY(sizing_mutex_) = false;
  bool warned_grow_ GUARDED_BY(sizing_mutex_) = false;
  std::vector<std::string> notices_ GUARDED_BY(sizing_mutex_);
  Mutex attachment_mutex_;
  std::shared_ptr<void> attachment_ GUARDED_BY(attachment_mutex_);
  std::unique_ptr<IoEngine> engine_;  // disk only; last member: drained first
};

}  // namespace spill::detail
