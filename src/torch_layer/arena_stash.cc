// The arena stash: layer inputs spilled to regions of a SpillArena, overlapped with compute.
// The chain's common part and its CPU path; the accelerator path is in device_spill.cc.
// See Note [Overlapped spilling].
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/arena_internals.h"
#include "spill/error.h"
#include "spill/tensor_stash.h"
#include "stash_chain.h"
#include "storable.h"

namespace spill {
namespace detail {
namespace {

// Note [Overlapped spilling]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// store() keeps a reference to the input and returns. The input is spilled once keep_last newer
// inputs were stored (the last layers' inputs are needed first in backward, so they stay where
// they are): its region is allocated and its write queued — from the input itself on the CPU,
// from a block of the host pool after a device -> host copy on an accelerator (Note [The host
// pool] in host_pool.cc). Each step after that happens on the chain's progress thread (Note
// [Progress on accelerators]) the moment the copy or the write completed: the device input is
// released when its copy finished, the CPU input and the pool block when the write did. So memory
// follows the I/O, not the next store(). The bytes in flight are bounded: the pool's size on an
// accelerator, host_pool_bytes of CPU inputs otherwise; store() waits for the oldest write when
// they would exceed it. restore() of layer i first secures its own bytes (a read into the pool
// may wait for room), then queues the reads of its prefetch_depth predecessors — this stash's own
// chain of stored tensors — without waiting, keeping room for the next restore, and only then
// waits for its own. The lifecycle is one State: Note [Lifecycle of a stashed tensor] in
// stash_entry.cc.
//
// An input changed in place while the stash references it — before it is spilled, during its
// copy or write, or while kept — is refused in backward with autograd's own words: the bytes on
// disk might be either version, and an integrity error would blame the disk for what the
// program did.

// Note [Progress on accelerators]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The training thread queues kernels far ahead of the device, so at the next store() the device
// -> host copy of an input is rarely done, and the copies of a forward's last layers are never
// looked at again before backward: their writes were not queued and their inputs stayed on the
// device, holding the memory the spill exists to free (on an H200, 4 of 15 inputs per step were
// spilled in direct mode). So each chain has one progress thread (a SerialWorker): for each copy
// it waits for the copy's event and queues the write, then, in a later job, waits for the write
// and returns the pool block; for each CPU write it waits and drops the input. It never waits
// for the training thread, so a store() waiting for room always gets it. A failure in the thread
// is kept and rethrown on the training thread at the next store() or restore().

std::uint64_t elapsed_ns(std::chrono::steady_clock::time_point since) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since)
          .count());
}

[[noreturn]] void throw_modified(const Entry& e, const char* when) {
  throw CheckpointError(
      "spill::checkpoint: one of the variables needed for gradient computation "
      "has been modified by an inplace operation: the stashed " +
      e.describe() + " was changed " + when +
      "; clone it before changing it, or do not modify layer inputs in place");
}

// A write that has completed (its region freed, so it is settled): whether it succeeded. A
// failure was already recorded for the next store() or restore() to raise.
bool write_succeeded(const Pending& write) {
  try {
    write.wait();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

std::shared_ptr<ArenaShared> shared_state_of(const SpillArena& arena) {
  return std::static_pointer_cast<ArenaShared>(
      attachment(arena, [] { return std::make_shared<ArenaShared>(); }));
}

Chain::Chain(const SpillArena& arena, const StashOptions& options)
    : arena_(arena.shared_handle()),
      arena_options_(arena_.options()),
      options_(options),
      shared_(shared_state_of(arena_)),
      counters_(shared_->counters),
      gds_(uses_gds(arena_)) {}

Chain::~Chain() = default;

StashStats ArenaShared::stats() {
  const StashCounters& c = *counters;
  StashStats s;
  s.inputs_stored = c.inputs_stored;
  s.inputs_spilled = c.inputs_spilled;
  s.device_bytes_held = c.device_bytes_held;
  s.peak_device_bytes_held = c.peak_device_bytes_held;
  s.host_bytes_in_flight = c.host_bytes_in_flight;
  s.peak_host_bytes_in_flight = c.peak_host_bytes_in_flight;
  s.pool_waits = c.budget_waits;
  s.pool_wait_ns = c.budget_wait_ns;
  s.inputs_kept_on_device = c.inputs_kept_on_device;
  s.bytes_kept_on_device = c.bytes_kept_on_device;
  s.pieces = c.pieces;
  s.restores = c.restores;
  s.restore_waits = c.restore_waits;
  s.restore_wait_ns = c.restore_wait_ns;
  s.prefetches = c.prefetches;
  s.prefetch_hits = c.prefetch_hits;
  MutexLock lock(mutex);
  if (pool) {
    s.host_pool_bytes = pool->bytes();
    s.host_pool_pinned = pool->pinned();
    s.peak_host_pool_bytes_in_use = pool->peak_bytes_in_use();
    s.pool_waits += pool->waits();
    s.pool_wait_ns += pool->wait_ns();
  }
  if (gds_staging) {
    s.gds_buffer_bytes = gds_staging->bytes();
    s.gds_buffer_registered = gds_staging->registered();
  }
  if (cufile) {  // live: a later arena of the process may have lowered the limit since
    s.cufile_mode = cufile->mode();
    s.cufile_bounce_bytes = cufile->bounce_bytes();
  }
  s.cufile_bytes_written = c.cufile_bytes_written;
  s.cufile_bytes_read = c.cufile_bytes_read;
  return s;
}

// ---------------------------------------------------------------------------------------------
// Common
// ---------------------------------------------------------------------------------------------

void Chain::stored(const EntryPtr& e) {
  std::vector<EntryPtr> to_spill;
  {
    MutexLock lock(mutex_);
    e->previous = last_;
    last_ = e;
    largest_input_ = std::max(largest_input_, e->bytes);
    unspilled_.push_back(e);
    while (unspilled_.size() > options_.keep_last) {
      if (EntryPtr p = unspilled_.front().lock()) to_spill.push_back(std::move(p));
      unspilled_.pop_front();
    }
  }
  for (const EntryPtr& p : to_spill) {
    MutexLock lock(p->mutex);
    spill(p);
  }
}

void Chain::spill(const EntryPtr& e) {
  if (e->state != State::held || e->kept) return;
  if (e->changed_in_place()) throw_modified(*e, "before it was spilled");
  if (e->bytes == 0) {
    e->input = torch::Tensor();
    return advance(*e, State::spilled);
  }
  if (arena_options_.when_full == WhenFull::keep_in_memory) {
    e->region = arena_.try_allocate(e->bytes);
    // No room: the input stays where it is for this step, as in-RAM checkpointing holds it
    // (counted by the arena; Note [Growing the arena] in src/core/arena_growth.cc).
    if (!e->region) {
      e->kept = true;
      return;
    }
  } else {
    try {
      e->region = arena_.allocate(e->bytes);
    } catch (const ArenaExhaustedError& x) {
      throw ArenaExhaustedError(
          x.requested_bytes(), x.free_bytes(), x.largest_free_block(),
          "spill::checkpoint: no room to stash the " + e->describe() + ": " + x.what());
    }
  }
  if (e->accelerator) return spill_device(e);
  spill_cpu(e);
}

torch::Tensor Chain::restore(const EntryPtr& e) {
  rethrow_failure();
  Entry& entry = *e;
  MutexLock lock(entry.mutex);
  if (entry.state == State::restored) return torch::Tensor();
  if (entry.changed_in_place()) throw_modified(entry, "after it was stored");
  const bool in_memory = entry.input.defined();
  if (in_memory) {  // held, copying, or a CPU input being written: given back as it is
    torch::Tensor t = give_back_input(entry);
    lock.unlock();
    prefetch_predecessors(entry);
    return t;
  }
  const bool was_prefetched = entry.prefetched;
  const auto start = std::chrono::steady_clock::now();
  torch::Tensor result;
  if (entry.accelerator) {
    const bool ready = entry.state == State::uploading ||
                       (entry.state == State::reading && entry.piece.io.ready());
    if (through_gds(entry) && entry.region.valid()) {
      result = restore_gds(entry);  // its writes completed under the entry's mutex, or failed
    } else {
      if (entry.state == State::writing) {  // its device bytes are gone: wait, then read back
        entry.piece.io.settle();
        finish_device_write_locked(entry);
      }
      if (entry.state == State::spilled && entry.region.valid() &&
          entry.bytes > pool_for(entry).largest_piece()) {
        result = restore_in_pieces(entry, pool_for(entry));
      } else {
        queue_device_read(entry, true);  // first its own bytes, then the predecessors'
        lock.unlock();
        prefetch_predecessors(entry);
        lock.lock();
        result = finish_device_restore(entry);
      }
    }
    counters_->record_restore(was_prefetched, ready, elapsed_ns(start));
  } else {
    queue_cpu_read(entry);
    const bool ready =
        !entry.region.valid() ||
        (reads_through_mapping() && arena_.backing() == Backing::disk ? resident(entry.region)
                                                                      : entry.read.ready());
    lock.unlock();
    prefetch_predecessors(entry);
    lock.lock();
    result = restore_cpu(entry);
    counters_->record_restore(was_prefetched, ready, elapsed_ns(start));
  }
  return result;
}

// The region goes back now, after a write still in flight completed (a short wait: it was
// queued before backward began), so the arena is drained when backward ends.
torch::Tensor Chain::give_back_input(Entry& e) {
  if (e.changed_in_place()) throw_modified(e, "between forward and backward");
  counters_->record_restore(e.prefetched, true, 0);
  if (e.accelerator) counters_->sub_device_bytes(e.bytes);
  const bool cpu_write_in_flight = !e.accelerator && e.state == State::writing;
  e.region.free();  // after the write in flight, if any
  advance(e, State::restored);
  torch::Tensor input = std::exchange(e.input, torch::Tensor());
  if (!cpu_write_in_flight) return input;
  // Written all the same: counted as spilled (the CLI's "wrote N inputs" must match its bytes),
  // here rather than in finish_cpu_write, which finds the entry restored. A write that failed
  // fails the step as it would had backward come later (and read the region): whether a full
  // or failing disk is reported must not depend on how fast backward caught up with it.
  if (!write_succeeded(e.write)) e.write.wait();  // throws the write's spill::IoError
  counters_->inputs_spilled.fetch_add(1);
  return input;
}

// Idempotent; a read that found no room in the pool is tried again at the next call.
void Chain::prefetch(Entry& e) {
  if (e.state == State::restored) return;
  if (!e.prefetched) {
    e.prefetched = true;
    counters_->prefetches.fetch_add(1);
  }
  if (e.input.defined() || !e.region.valid() || through_gds(e)) return;
  if (e.accelerator) {
    queue_device_read(e, false);
    upload_if_read(e);
  } else {
    queue_cpu_read(e);
  }
}

void Chain::prefetch_predecessors(const Entry& e) {
  EntryPtr p = e.previous.lock();
  for (std::uint32_t i = 0; p && i < options_.prefetch_depth; ++i) {
    {
      MutexLock lock(p->mutex);
      prefetch(*p);  // uploads only within the depth: device memory stays bounded
    }
    p = p->previous.lock();
  }
}

void Chain::rethrow_failure() {
  std::exception_ptr failure;
  {
    MutexLock lock(mutex_);
    failure = std::exchange(failure_, nullptr);
  }
  if (failure) std::rethrow_exception(failure);
}

void Chain::record_failure(std::exception_ptr failure) {
  {
    MutexLock lock(mutex_);
    if (!failure_) failure_ = std::move(failure);
  }
  room_.notify_all();
}

bool Chain::failed() const {
  MutexLock lock(mutex_);
  return failure_ != nullptr;
}

void Chain::post(std::function<void()> job) {
  if (options_.asynchronous) return progress_.post(std::move(job));
  job();
}

// ---------------------------------------------------------------------------------------------
// CPU inputs: the input itself is written; see Note [Overlapped spilling]
// ---------------------------------------------------------------------------------------------

void Chain::spill_cpu(const EntryPtr& e) {
  wait_for_room(e->bytes);
  e->write = e->region.write_async(e->input.data_ptr(), e->bytes);
  counters_->add_in_flight(e->bytes);
  advance(*e, State::writing);
  if (!options_.asynchronous) {
    // The comparison point: the write completes before store() returns, failures thrown here.
    try {
      e->write.wait();
    } catch (...) {
      counters_->sub_in_flight(e->bytes);
      throw;
    }
    e->input = torch::Tensor();
    counters_->sub_in_flight(e->bytes);
    counters_->inputs_spilled.fetch_add(1);
    return advance(*e, State::spilled);
  }
  progress_.post([this, e] { finish_cpu_write(e); });
}

// Bounds the bytes of CPU inputs held for writes in flight (host_pool_bytes; by default room for
// prefetch_depth + 2 inputs): store() waits for the oldest writes to complete.
void Chain::wait_for_room(std::uint64_t bytes) {
  const std::uint64_t budget =
      arena_options_.host_pool_bytes != kAutomaticHostPool
          ? arena_options_.host_pool_bytes
          : automatic_host_pool_bytes(bytes, options_.prefetch_depth + 2ull);
  const auto fits = [&]() REQUIRES(mutex_) {
    const std::uint64_t now = counters_->host_bytes_in_flight.load();
    return now == 0 || now + bytes <= budget || failure_ != nullptr;
  };
  MutexLock lock(mutex_);
  if (fits()) return;
  const auto start = std::chrono::steady_clock::now();
  counters_->budget_waits.fetch_add(1);
  while (!fits()) room_.wait_for(lock, std::chrono::milliseconds(5));
  counters_->budget_wait_ns.fetch_add(elapsed_ns(start));
}

// On the progress thread: the write completed (or failed: the arena reports it at the region's
// next read), so the input is no longer needed here.
void Chain::finish_cpu_write(const EntryPtr& e) {
  Pending write;
  {
    MutexLock lock(e->mutex);
    write = e->write;
  }
  write.settle();
  {
    MutexLock lock(e->mutex);
    e->input = torch::Tensor();
    if (e->state == State::writing) {
      advance(*e, State::spilled);
      counters_->inputs_spilled.fetch_add(1);
    }
  }
  counters_->sub_in_flight(e->bytes);
  MutexLock lock(mutex_);
  room_.notify_all();
}

// Direct reads skip the staging pool when the destination is aligned.
torch::Tensor Chain::aligned_host_buffer(const Entry& e) const {
  return aligned_host_bytes(e.bytes, arena_.io_alignment())
      .view(e.options.dtype().toScalarType())
      .view(e.sizes);
}

void Chain::queue_cpu_read(Entry& e) {
  if (e.state != State::spilled || !e.region.valid()) return;
  if (reads_through_mapping()) {
    read_ahead(e.region);  // readahead; restore_cpu() reads through the mapping
  } else {
    e.host = aligned_host_buffer(e);
    e.read = e.region.read_async(e.host.data_ptr(), e.bytes);
  }
  advance(e, State::reading);
}

// Note [Restoring from the mapping]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A buffered disk restore copies the region out of the mapping (Region::read: the copy and the
// integrity check in one pass) into a tensor of its own, and frees the region at once. It was a
// view of the mapping (from_blob), which spared that copy and one input of anonymous memory —
// but then LibTorch's kernels read the mapping themselves during the recomputation and its
// backward, and a spill file that shrank meanwhile (truncated by another process, a failing
// disk) killed the process with SIGBUS inside a kernel, where no handler can turn the fault into
// an error (found by the red-team pass: 5 of 6 runs). Region::read faults, if at all, in
// spillarena's own guarded copy: a spill::IoError (Note [SIGBUS on the mapping] in
// src/core/platform_posix.cc). The RAM backing has no file to shrink and keeps the view: the
// region is freed when the last reference to the tensor dies (normally at the end of this
// layer's backward). Direct mode reads into a host buffer and frees the region at once.
torch::Tensor Chain::restore_cpu(Entry& e) {
  if (!e.region.valid()) {
    advance(e, State::restored);
    return torch::empty(e.sizes, e.options);
  }
  queue_cpu_read(e);
  advance(e, State::restored);
  if (reads_through_mapping()) {
    e.write.wait();
    if (arena_.backing() == Backing::disk) {
      torch::Tensor copy = torch::empty(e.sizes, e.options);
      e.region.read(copy.data_ptr(), e.bytes);
      e.region.free();
      return copy;
    }
    auto region = std::make_shared<Region>(std::move(e.region));
    return torch::from_blob(
        const_cast<void*>(region->read_in_place(e.bytes)), e.sizes,
        [region](void*) mutable { region.reset(); }, e.options);
  }
  e.read.wait();
  e.region.free();
  return std::exchange(e.host, torch::Tensor());
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// The stash
// ---------------------------------------------------------------------------------------------

namespace {

// The options a stash can honour, or an InvalidArgumentError naming the value and the fix.
const StashOptions& checked(const StashOptions& options) {
  constexpr std::uint64_t kMaxGdsBuffer = 1ull << 40;  // 1 TiB: far above any device
  if (options.gds_buffer_bytes == 0 || options.gds_buffer_bytes > kMaxGdsBuffer) {
    throw InvalidArgumentError(
        "spill: StashOptions::gds_buffer_bytes is " + std::to_string(options.gds_buffer_bytes) +
        "; give the device staging buffer of io = gds 1 byte to 1 TiB (it is rounded up to "
        "4 KiB; the default is 16 MiB)");
  }
  return options;
}

class ArenaStashed final : public StashedTensor {
 public:
  ArenaStashed(std::shared_ptr<detail::Chain> chain, detail::EntryPtr entry)
      : chain_(std::move(chain)), entry_(std::move(entry)) {}

  void prefetch() override {
    detail::MutexLock lock(entry_->mutex);
    chain_->prefetch(*entry_);
  }

  torch::Tensor restore() override { return entry_->in_stored_layout(chain_->restore(entry_)); }

 private:
  std::shared_ptr<detail::Chain> chain_;
  detail::EntryPtr entry_;
};

class ArenaStash final : public TensorStash {
 public:
  ArenaStash(const SpillArena& arena, const StashOptions& options)
      : chain_(std::make_shared<detail::Chain>(arena, checked(options))) {}

  std::unique_ptr<StashedTensor> store(const torch::Tensor& tensor) override {
    detail::check_storable(tensor, name());
    chain_->rethrow_failure();
    auto e = std::make_shared<detail::Entry>(tensor, chain_->counters());
    chain_->stored(e);
    // The arena's sizing warnings (the first overflow, a refused grow), each once per arena;
    // Python turns them into spillarena.SpillArenaWarning (python/src/stash_binding.cc).
    for (const std::string& notice : detail::take_notices(chain_->arena())) TORCH_WARN(notice);
    return std::make_unique<ArenaStashed>(chain_, std::move(e));
  }

  std::string name() const override { return to_string(chain_->arena().backing()); }
  StashStats stats() const override { return chain_->stats(); }

 private:
  std::shared_ptr<detail::Chain> chain_;
};

}  // namespace

std::shared_ptr<TensorStash> make_arena_stash(const SpillArena& arena,
                                              const StashOptions& options) {
  checked(options);
  return std::make_shared<ArenaStash>(arena, options);
}

std::shared_ptr<TensorStash> make_arena_stash(const SpillArena& arena) {
  return make_arena_stash(arena, stash_options(arena));
}

void set_stash_options(const SpillArena& arena, const StashOptions& options) {
  checked(options);
  const auto shared = detail::shared_state_of(arena);
  detail::MutexLock lock(shared->mutex);
  shared->options = options;
}

StashOptions stash_options(const SpillArena& arena) {
  const auto shared = detail::shared_state_of(arena);
  detail::MutexLock lock(shared->mutex);
  return shared->options;
}

// One stash per arena while it is in use: a weak reference kept with the arena. Checkpoint
// nodes own the stash; when the last graph dies, so does the stash.
std::shared_ptr<TensorStash> shared_arena_stash(const SpillArena& arena) {
  const auto shared = detail::shared_state_of(arena);
  detail::MutexLock lock(shared->mutex);
  std::shared_ptr<TensorStash> stash = shared->shared_stash.lock();
  if (!stash) {
    stash = std::make_shared<ArenaStash>(arena, shared->options);
    shared->shared_stash = stash;
  }
  return stash;
}

StashStats stash_stats(const SpillArena& arena) { return detail::shared_state_of(arena)->stats(); }

}  // namespace spill
