#include "core/arena/arena_core.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "core/os/platform.h"
#include "core/text/quote.h"
#include "spill/error.h"

namespace spill::detail {

IoEngineOptions io_engine_options(const ArenaOptions& o) {
  IoEngineOptions e;
  e.backend = o.io_backend;
  e.staging_bytes = o.staging_bytes;
  e.start_writeback_after_write = o.start_writeback_after_write;
  e.page_cache_limit_bytes = o.page_cache_limit_bytes;
  return e;
}

std::uint64_t round_to_pages(std::uint64_t bytes) {
  const std::uint64_t page = platform::capabilities().page_size_bytes;
  return (bytes + page - 1) / page * page;
}

ArenaCore::ArenaCore(const ArenaOptions& options, std::unique_ptr<Storage> storage,
                     std::string io_note, bool gds_requested)
    : options_(options),
      io_note_(std::move(io_note)),
      gds_requested_(gds_requested),
      storage_(std::move(storage)),
      allocator_(options.capacity_bytes, platform::capabilities().page_size_bytes) {
  if (options_.verify_integrity) ledger_ = std::make_unique<IntegrityLedger>();
  if (options_.backing == Backing::disk) {
    engine_ = std::make_unique<IoEngine>(*storage_, io_engine_options(options_), options_.io);
  }
  // Opened with the arena, so a driver cuFile cannot start is a typed error now, and the stats
  // can say which mode runs.
  if (gds_requested_ && engine_) gds_ = std::make_unique<GdsFile>(storage_->direct_fd());
}

void ArenaCore::write_from_device(std::uint64_t start, std::uint64_t at, const void* device_ptr,
                                  std::uint64_t bytes) {
  owner_.check("a write from device memory (io = gds)");
  if (!gds_)
    throw InvalidArgumentError("spill: write_from_device needs an arena made with io = gds");
  engine_->throw_if_failed();
  if (ledger_) ledger_->forget(start, Span{at, bytes});
  gds_->write(device_ptr, bytes, start + at);
  bytes_written_.fetch_add(bytes, std::memory_order_relaxed);
}

void ArenaCore::read_to_device(std::uint64_t start, std::uint64_t at, void* device_ptr,
                               std::uint64_t bytes) {
  owner_.check("a read into device memory (io = gds)");
  if (!gds_) throw InvalidArgumentError("spill: read_to_device needs an arena made with io = gds");
  engine_->throw_if_failed();
  gds_->read(device_ptr, bytes, start + at);
  bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
}

std::shared_ptr<void> ArenaCore::attachment(const std::function<std::shared_ptr<void>()>& make) {
  MutexLock lock(attachment_mutex_);
  if (!attachment_) attachment_ = make();
  return attachment_;
}

ArenaCore::~ArenaCore() {
  if (engine_ && !owner_.forked()) engine_->drain();
}

// The hashes go first: once the block is back in the allocator, another thread may carve the
// same offset and record its own.
void ArenaCore::free(const Block& block) noexcept {
  if (owner_.forked()) return;  // the child's copy of the allocator is never used again
  if (ledger_) ledger_->drop(block.offset);
  if (engine_) engine_->released(block.offset, block.size);
  try {
    allocator_.free(block);
  } catch (...) {
    // Region handles free each block exactly once; nothing to report from a destructor.
  }
}

// Synchronous buffered writes stay on the calling thread: a queue hop buys nothing when the
// caller waits anyway (see Note [Why pwrite, not memcpy, for the forward copy] in
// src/core/file/spill_file.cc).
void ArenaCore::write(std::uint64_t start, std::uint64_t at, const void* src, std::uint64_t bytes) {
  owner_.check("a write of a region");
  if (engine_ && options_.io != IoMode::buffered) {
    write_async(start, at, src, bytes).wait();
    return;
  }
  if (engine_) engine_->throw_if_failed();
  write_here(start, at, src, bytes);
}

// A buffered or host-memory write on this thread, hashed where the arena verifies.
void ArenaCore::write_here(std::uint64_t start, std::uint64_t at, const void* src,
                           std::uint64_t bytes) {
  if (ledger_) {
    write_hashed(start, at, static_cast<const char*>(src), bytes);
  } else {
    storage_->write(start + at, src, bytes);
  }
  bytes_written_.fetch_add(bytes, std::memory_order_relaxed);
  if (engine_) engine_->written(start + at, bytes);
}

// Host memory is copied here; a file's reads are decided in read_async, which this waits for.
void ArenaCore::read(std::uint64_t start, std::uint64_t at, void* dst, std::uint64_t bytes) {
  owner_.check("a read of a region");
  if (engine_) return read_async(start, at, dst, bytes).wait();
  read_resident(start, at, static_cast<char*>(dst), bytes);
  bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
}

// A file: the kernel's pwrite makes the copy on this thread while a queue thread hashes the
// source (Note [Hashing beside the kernel's copy] in src/core/integrity/integrity.cc); a write of
// at most a slice hashes it here, after the pwrite read it into the cache. A pwrite that fails
// throws, once the hash let go of the source, before any hash is recorded. Host memory copies
// and hashes in one pass instead.
void ArenaCore::write_hashed(std::uint64_t start, std::uint64_t at, const char* src,
                             std::uint64_t bytes) {
  const Span write{at, bytes};
  ledger_->forget(start, write);
  if (storage_->fd() < 0) return write_memory_hashed(start, write, src);
  WriteHasher hasher(write);
  if (bytes <= kHashSliceBytes) {
    storage_->write(start + at, src, bytes);
    hasher.update(src, bytes);
    return ledger_->record(start, hasher);
  }
  const Pending hashing = engine_->beside([&hasher, src, bytes] { hasher.update(src, bytes); });
  try {
    storage_->write(start + at, src, bytes);
  } catch (...) {
    hashing.settle();
    throw;
  }
  hashing.wait();
  ledger_->record(start, hasher);
}

// Host memory: the write is a memcpy into it (HostMemory::write), here fused with the hash of
// each chunk (Note [Copying and hashing in one pass] in src/core/integrity/integrity.cc).
void ArenaCore::write_memory_hashed(std::uint64_t start, const Span& write, const char* src) {
  WriteHasher hasher(write);
  hasher.copy(storage_->base() + start + write.offset, src, write.bytes);
  ledger_->record(start, hasher);
}

// Resident pages (or host memory), copied from the mapping as SpillFile::read does. Each
// recorded chunk the read covers whole is copied and hashed in one pass (Note [Copying and
// hashing in one pass] in src/core/integrity/integrity.cc) and compared as it lands; bytes no chunk
// covers are only copied. Nothing in the guarded copy has a destructor to skip: a SIGBUS leaves it
// by siglongjmp (Note [SIGBUS on the mapping] in src/core/os/platform_posix.cc).
void ArenaCore::read_resident(std::uint64_t start, std::uint64_t at, char* dst,
                              std::uint64_t bytes) {
  std::optional<IntegrityLedger::ReadCheck> check;
  if (ledger_) check.emplace(ledger_->checker(start, Span{at, bytes}));
  const char* from = storage_->base() + start + at;
  std::exception_ptr mismatch;
  auto copy = [&] {
    if (!check) return copy_in_slices(dst, from, bytes);
    mismatch = check->copy(dst, from, bytes);
  };
  read_mapping(start + at, bytes, IoOp::read, copy);
  if (mismatch) std::rethrow_exception(mismatch);
}

// ---------------------------------------------------------------------------------------------
// Reading the mapping (see Note [SIGBUS on the mapping] in src/core/os/platform_posix.cc)
// ---------------------------------------------------------------------------------------------

namespace {
template <class Read>
void run(void* read) {
  (*static_cast<Read*>(read))();
}
}  // namespace

// `read` reads [offset, offset + bytes) of the mapping. A file shorter than that is an IoError
// before it runs; a SIGBUS while it runs is one after (the file shrank meanwhile, or the disk
// failed to read a page in). Host memory has no file: `read` just runs.
template <class Read>
void ArenaCore::read_mapping(std::uint64_t offset, std::uint64_t bytes, IoOp op, Read& read) const {
  if (storage_->fd() < 0) return read();
  throw_if_shrunk(offset, bytes, op);
  if (platform::read_mapped(storage_->base() + offset, bytes, &run<Read>, &read) == 0) return;
  throw_unreadable(offset, bytes, op);
}

// A read of the mapping faulted: the file shrank meanwhile, or the disk failed to read a page in.
void ArenaCore::throw_unreadable(std::uint64_t offset, std::uint64_t bytes, IoOp op) const {
  throw_if_shrunk(offset, bytes, op);
  throw IoError(EIO,
                "spill: reading " + std::to_string(bytes) + " bytes at offset " +
                    std::to_string(offset) + " of the spill file in " +
                    quote(storage_->info().directory) +
                    " through its mapping failed (SIGBUS): the disk could not read a page of it "
                    "back; check the disk (dmesg, its SMART log), and move the spill directory to "
                    "a healthy disk if it happens again",
                op, offset, bytes);
}

void ArenaCore::throw_if_shrunk(std::uint64_t offset, std::uint64_t bytes, IoOp op) const {
  platform::FileStatus status;
  if (platform::file_status(storage_->fd(), &status) != 0) return;  // the read will tell
  if (status.size_bytes >= offset + bytes) return;
  throw IoError(
      EIO,
      "spill: the spill file in " + quote(storage_->info().directory) + " is " +
          std::to_string(status.size_bytes) + " bytes long, not the " +
          std::to_string(storage_->info().capacity_bytes) +
          " it was made with: something truncated it behind the arena's back (a process writing "
          "through /proc/" +
          std::to_string(platform::process_id()) + "/fd/" + std::to_string(storage_->fd()) +
          ", or a tool cleaning the directory), and the " + std::to_string(bytes) +
          " bytes at offset " + std::to_string(offset) +
          " are gone. Nothing was read; create a new SpillArena, and keep cleanup tools and other "
          "processes away from the spill directory while it is in use",
      op, offset, bytes);
}

// A piece holds its hash chunks whole when a transfer starts on the chunk grid (at 0: every
// asynchronous transfer of a Region), so each piece hashes its own.
static_assert(IoEngine::kPieceBytes % kHashChunkBytes == 0, "pieces must hold whole chunks");

namespace {
// The engine's pieces (file offsets) as spans of the region that starts at `start`.
std::vector<Span> in_region(std::uint64_t start, const std::vector<IoEngine::Piece>& pieces) {
  std::vector<Span> spans;
  for (const auto& [offset, bytes] : pieces) spans.push_back(Span{offset - start, bytes});
  return spans;
}
}  // namespace

// Hashed as the pieces move, and recorded once every piece is on the file: a buffered write on a
// queue thread while the others copy the source into the page cache (`beside`), a direct write
// on the submitting thread as it queues each piece (`staged`, or `copy_staged` for a staging
// copy). The caller keeps the source unchanged until the Pending completes, by contract. See
// Note [Integrity hashing] and Note [Hashing beside the kernel's copy] in
// src/core/integrity/integrity.cc.
IoEngine::Hooks ArenaCore::hash_written(std::uint64_t start, std::uint64_t at, const void* src,
                                        std::uint64_t bytes) {
  const Span written{at, bytes};
  ledger_->forget(start, written);
  IoEngine::Hooks hooks;
  auto hasher = std::make_shared<WriteHasher>(written);
  if (options_.io == IoMode::direct) {
    hooks.staged = [hasher](const char* memory, std::uint64_t n) { hasher->update(memory, n); };
    hooks.copy_staged = [hasher](char* slot, const char* from, std::uint64_t n) {
      hasher->copy(slot, from, n);
    };
  } else {
    hooks.beside = [hasher, from = static_cast<const char*>(src), bytes] {
      hasher->update(from, bytes);
    };
  }
  hooks.after = [ledger = ledger_.get(), start, hasher](bool all_succeeded,
                                                        const std::vector<IoEngine::Piece>&) {
    if (all_succeeded) ledger->record(start, *hasher);
    return std::exception_ptr();
  };
  return hooks;
}

// Each piece checks the chunks it holds whole when it landed; the rest after the last piece.
IoEngine::Hooks ArenaCore::check_read(std::uint64_t start, std::uint64_t at, void* dst,
                                      std::uint64_t bytes) {
  IoEngine::Hooks hooks;
  hooks.piece = [ledger = ledger_.get(), start](std::uint64_t offset, const char* memory,
                                                std::uint64_t n) {
    return ledger->check(start, Span{offset - start, n}, memory);
  };
  hooks.after = [ledger = ledger_.get(), start, read = Span{at, bytes}, dst](
                    bool all_succeeded, const std::vector<IoEngine::Piece>& pieces) {
    if (!all_succeeded) return std::exception_ptr();
    const std::vector<Span> done = in_region(start, pieces);
    return ledger->check(start, read, static_cast<const char*>(dst), &done);
  };
  return hooks;
}

Pending ArenaCore::write_async(std::uint64_t start, std::uint64_t at, const void* src,
                               std::uint64_t bytes) {
  owner_.check("an asynchronous write of a region");
  if (!engine_) {
    write(start, at, src, bytes);
    return Pending();
  }
  engine_->throw_if_failed();  // before hash_written forgets the hashes of the bytes on file
  if (options_.io == IoMode::buffered && bytes <= kWriteAtOnceBytes && !engine_->has_test_hook()) {
    return write_at_once(start, at, src, bytes);
  }
  IoEngine::Hooks hooks = ledger_ ? hash_written(start, at, src, bytes) : IoEngine::Hooks{};
  Pending p = engine_->write(start + at, src, bytes, std::move(hooks));
  bytes_written_.fetch_add(bytes, std::memory_order_relaxed);
  return p;
}

// Note [A small write is made at once]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A buffered write_async of a few pages went through the I/O queue like a large one: submitted,
// completed by io_uring in the submitting call (the kernel's copy into the page cache) or by a
// worker, its hash run on the queue's thread beside it, and its completion handed to that thread,
// which had to be woken, as had the caller waiting for it. On the 2-core test VM a 4 KiB input's
// store cost ~100 us inside a training step against ~15 us in a loop that kept every thread
// awake: the wake-ups, not the copy. So a buffered write of at most kWriteAtOnceBytes is made on
// the calling thread, as write() makes it (write_here: pwrite, then the hash of bytes still in
// cache), and returns a Pending that is ready, holding any failure for wait() to throw; the failure
// is also recorded with the engine, so that every later write and read reports it until the region
// is freed, as a queued write's is (no one may read the bytes it left wrong). On an accelerator the
// stash's progress thread makes such a write from a host pool block, under the entry's mutex:
// other completions wait behind its pwrite (50 us at most at 11 GB/s), not the training thread.
// Under the I/O test hook
// (spill::testing::set_io_test_hook) every write is queued still: the hook shapes queued
// operations, and the tests that set it are about writes in flight; a write made at once fails
// through the platform's fault hook instead. Above a slice the wake-ups are a small share of the
// step (1 and 4 MiB inputs measured the same either way), and a write keeps the queue's parallel
// pieces and the hash beside the kernel's copy. Figures: docs/benchmarks.md, "A small spill's fixed
// cost".
Pending ArenaCore::write_at_once(std::uint64_t start, std::uint64_t at, const void* src,
                                 std::uint64_t bytes) {
  std::exception_ptr error;
  try {
    write_here(start, at, src, bytes);
  } catch (const IoError& e) {  // Note [Failures last until freed] in src/core/io/io_engine.cc
    engine_->record(IoStatus{e.error_number(), e.op(), e.offset(), e.bytes()});
    error = std::current_exception();
    bytes_written_.fetch_add(bytes, std::memory_order_relaxed);  // as a queued write counts it
  }
  return IoEngine::finished(IoOp::write, start + at, bytes, std::move(error));
}

// The one place a read of a file is decided: resident pages of a buffered file are copied from
// the mapping on this thread — read faults on resident page-cache pages are cheap and mapped 16
// at a time (fault-around), which skips pread's per-page lookups; io_uring would make that copy
// on this thread too (it completes a read of cached pages inline, in the submitting call); and a
// copy of the arena's own checks each chunk in the pass that makes it (Note [Hashing beside the
// kernel's copy] in src/core/integrity/integrity.cc). Its failures (an IntegrityError, a file
// shrunk under the mapping) wait in the Pending, as a queued read's do. Anything else goes
// through the I/O engine in parallel pieces (Note [Parallel reads from disk] in
// src/core/io/io_engine.cc).
Pending ArenaCore::read_async(std::uint64_t start, std::uint64_t at, void* dst,
                              std::uint64_t bytes) {
  owner_.check("an asynchronous read of a region");
  if (!engine_) {
    read(start, at, dst, bytes);
    return Pending();
  }
  engine_->throw_if_failed();
  if (options_.io == IoMode::buffered && storage_->resident(start + at, bytes)) {
    std::exception_ptr error;
    try {
      read_resident(start, at, static_cast<char*>(dst), bytes);
    } catch (...) {
      error = std::current_exception();
    }
    bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
    return IoEngine::finished(IoOp::read, start + at, bytes, std::move(error));
  }
  IoEngine::Hooks hooks = ledger_ ? check_read(start, at, dst, bytes) : IoEngine::Hooks{};
  Pending p = engine_->read(start + at, dst, bytes, std::move(hooks));
  bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
  return p;
}

void ArenaCore::read_ahead(std::uint64_t offset, std::uint64_t bytes) const {
  owner_.check("a read-ahead of a region");
  storage_->read_ahead(offset, bytes);
}

const void* ArenaCore::host_bytes(std::uint64_t start, std::uint64_t bytes) {
  owner_.check("a view of a region");
  if (storage_->fd() >= 0) {
    throw InvalidArgumentError(
        "spill: a view of a region is for RAM arenas only (Backing::ram); read a disk arena's "
        "region with Region::read or take_into");
  }
  const char* memory = storage_->base() + start;
  if (ledger_) {
    if (std::exception_ptr e = ledger_->check(start, Span{0, bytes}, memory)) {
      std::rethrow_exception(e);
    }
  }
  bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
  return memory;
}

void ArenaCore::start_writeback(std::uint64_t offset, std::uint64_t bytes) const {
  owner_.check("a writeback of a region");
  storage_->start_writeback(offset, bytes);
}

void ArenaCore::drop_cached_pages(std::uint64_t offset, std::uint64_t bytes) const {
  owner_.check("a cache drop of a region");
  storage_->drop_cached_pages(offset, bytes);
}

std::uint64_t ArenaCore::io_alignment() const {
  return engine_ ? engine_->alignment() : platform::capabilities().page_size_bytes;
}

ArenaStats ArenaCore::stats() const {
  const AllocatorStats a = allocator_.stats();
  ArenaStats s;
  s.capacity_bytes = a.capacity_bytes;
  s.bytes_in_use = a.bytes_in_use;
  s.peak_bytes_in_use = a.peak_bytes_in_use;
  s.bytes_requested = a.bytes_requested;
  s.live_regions = a.live_blocks;
  s.allocations = a.allocations;
  s.frees = a.frees;
  s.reuse_hits = a.reuse_hits;
  s.largest_free_block = a.largest_free_block;
  s.free_bytes = a.free_bytes;
  s.high_water_bytes = a.high_water_bytes;
  s.bytes_written = bytes_written_.load(std::memory_order_relaxed);
  s.bytes_read = bytes_read_.load(std::memory_order_relaxed);
  s.io_mode = options_.io;
  s.io_note = io_note_;
  if (gds_) s.io_note += std::string("; cuFile mode: ") + gds_->mode();
  if (engine_) {
    s.io_backend = engine_->backend();
    if (!engine_->backend_note().empty()) {
      s.io_note += (s.io_note.empty() ? "" : "; ") + engine_->backend_note();
    }
    s.staging_bytes = engine_->staging_bytes();
    s.staging_waits = engine_->staging_waits();
    s.staging_wait_ns = engine_->staging_wait_ns();
  }
  if (ledger_) {
    s.bytes_hashed = ledger_->bytes_hashed();
    s.bytes_verified = ledger_->bytes_verified();
    s.integrity_failures = ledger_->failures();
  }
  add_sizing_stats(&s);
  return s;
}

}  // namespace spill::detail
