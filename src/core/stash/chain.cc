// The arena stash's chain: layer inputs spilled to regions of a SpillArena, overlapped with
// compute — what every path shares. The options kept with the arena are StashSettings
// (arena_shared.h); the paths that move bytes are cpu_path.cc, device_path.cc and gds_path.cc;
// the front ends are src/torch_layer/arena_stash.cc and python/src/stash_binding.cc.
// See Note [Overlapped spilling].
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "chain.h"
#include "core/arena/arena_internals.h"
#include "core/os/counted_wait.h"
#include "core/text/quote.h"
#include "spill/error.h"

namespace spill {
namespace detail {

// Note [Overlapped spilling]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// store() keeps a reference to the input and returns. The input is spilled once keep_last newer
// inputs were stored (the last layers' inputs are needed first in backward, so they stay where
// they are): its region is allocated and its write queued — from the input itself on the CPU,
// from a block of the host pool after a device -> host copy on an accelerator (Note [The host
// pool] in host_pool.cc). Each step after that happens on the chain's progress thread (Note
// [Progress on accelerators]) the moment the copy or the write completed: the device input is
// released when its copy finished, the CPU input and the pool block when the write did. So memory
// follows the I/O, not the next store(). A buffered write of at most 512 KiB is made before it
// returns (Note [A small write is made at once] in src/core/arena/arena_core.cc): a CPU input
// that small is let go inside store(), with no step left for the progress thread; on an
// accelerator the progress thread makes such a write itself, under the entry's mutex. The bytes in
// flight are bounded: the pool's size on an accelerator, host_pool_bytes of CPU inputs otherwise;
// store() waits for the oldest write when they would exceed it. restore() of layer i comes in two
// halves, liburing's submit and complete (SpillPath::begin_restore and finish_restore in
// stash_path.h). The first secures its own bytes: it queues their read where no prefetch did (a
// read into the pool may wait for room; on a buffered CPU arena the read is the page cache's
// readahead, and the copy out of the mapping is the second half's) and notes whether they were in
// memory already. Then the reads of its prefetch_depth predecessors — this stash's own chain of
// stored tensors — are queued without waiting, keeping room in the pool for the next restore, and
// only then does the second half wait for its own bytes. Waiting first would leave the disk with
// one read while backward stalls on it, and the predecessors' reads would start only as the
// recomputation does. The lifecycle is one State: Note [Lifecycle of a stashed tensor] in
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
// spilled in direct mode). So each chain has two progress threads (SerialWorkers). The copies'
// waits for each copy's event, queues the write and releases the device input; the writes'
// waits for each write and returns the pool block, and for each CPU write still in flight when
// store() returned it waits and drops the input. Two, not one: a copy's release queued behind a
// wait for an earlier input's disk write kept device memory for as long as the disk took (Note
// [The device-held bound] in copy_window.cc). Neither waits for the training thread, so a
// store() waiting for room or for copies always gets it. A failure in either is kept and
// rethrown on the training thread at the next store() or restore().

// ---------------------------------------------------------------------------------------------
// What the paths share: the context and the progress thread
// ---------------------------------------------------------------------------------------------

StashContext::StashContext(const SpillArena& a, const StashOptions& o)
    : arena(a.shared_handle()),
      arena_options(arena.options()),
      options(o),
      shared(shared_state_of(arena)),
      counters(shared->counters) {}

std::uint64_t StashContext::host_budget(std::uint64_t bytes) const {
  return arena_options.host_pool_bytes != kAutomaticHostPool
             ? arena_options.host_pool_bytes
             : automatic_host_pool_bytes(bytes, options.prefetch_depth + 2ull);
}

Region StashContext::region_for(const Entry& e, const void* src) {
  try {
    if (src) return arena.spill_from(src, e.bytes);
    // No room under keep_in_memory: the input stays where it is for this step, as in-RAM
    // checkpointing holds it (counted by the arena; Note [Growing the arena] in
    // src/core/arena/arena_growth.cc).
    if (arena_options.when_full == WhenFull::keep_in_memory) return arena.try_allocate(e.bytes);
    return arena.allocate(e.bytes);
  } catch (const ArenaExhaustedError& x) {
    throw ArenaExhaustedError(
        x.requested_bytes(), x.free_bytes(), x.largest_free_block(),
        "spill::checkpoint: no room to stash the " + e.describe() + ": " + x.what());
  }
}

void Progress::post(std::function<void()> job) {
  if (asynchronous_) return writes_.post(std::move(job));
  job();
}

void Progress::post_prefetch(std::function<void()> job) {
  if (!asynchronous_) return job();
  prefetches_.post([job = std::move(job)] {
    try {
      job();
    } catch (const std::exception&) {
      // A prefetch that failed changed nothing its entry's own restore relies on: that restore
      // reads again, or waits for the failed read, and reports what failed then. Kept for the
      // training thread it would come out of some later call, and make waits for room give up.
    }
  });
}

void Progress::when_copied(const EntryPtr& e, CopyPtr copy,
                           std::function<void(const EntryPtr&)> next) {
  if (asynchronous_) {
    return copies_.post([this, e, copy = std::move(copy), next = std::move(next)]() mutable {
      after_copy(e, std::move(copy), next);
    });
  }
  copy->synchronize();
  next(e);
}

// `copy` is the job's own reference, dropped when this call returns (the path drops its own in
// `next`).
void Progress::after_copy(const EntryPtr& e, CopyPtr copy,
                          const std::function<void(const EntryPtr&)>& next) {
  try {
    if (copy) copy->synchronize();
    MutexLock lock(e->mutex);
    next(e);
  } catch (...) {
    record_failure(std::current_exception());
  }
}

void Progress::record_failure(std::exception_ptr failure) {
  MutexLock lock(mutex_);
  if (!failure_) failure_ = std::move(failure);
}

bool Progress::failed() const {
  MutexLock lock(mutex_);
  return failure_ != nullptr;
}

void Progress::rethrow_failure() {
  std::exception_ptr failure;
  {
    MutexLock lock(mutex_);
    failure = std::exchange(failure_, nullptr);
  }
  if (failure) std::rethrow_exception(failure);
}

// A wait for room or for copies gave up: a failure of the progress threads, rethrown here (or,
// if another thread took it first, named).
void Progress::throw_abandoned_wait() {
  rethrow_failure();
  throw IoError(EIO,
                "spill::checkpoint: the wait for room in the host pool or for device copies ended "
                "on a failure already reported by another call; free the step's graph and run "
                "again");
}

// ---------------------------------------------------------------------------------------------
// The chain
// ---------------------------------------------------------------------------------------------

// Note [Prefetching off the training thread]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A restore queues its predecessors' reads after its own (Note [Overlapped spilling]). In
// buffered mode a read of pages the page cache holds is a copy out of the mapping, made by the
// thread that queues it (Note [A small write is made at once] and ArenaCore::read_async in
// src/core/arena/arena_core.cc), so the training thread copied its predecessors' inputs itself:
// 128 MiB each on the H200 run, where backward waited 0.7-3.5 s per four steps for reads. The
// hypothesis that this bounds backward is untested; SPILLARENA_PREFETCH_THREAD=worker (read when
// a chain is made) is its A/B switch for the GPU check: the predecessors' prefetches then run on
// a thread of the chain's own, after the restore's own read was queued, each under its entry's
// mutex as before; a prefetch that fails there is dropped, as the entry's own restore reads
// again or waits for the failed read and reports it. Unset (or "training"), they run where they
// always did; another value is named in a notice. Limits of the switch, for reading its figures:
// the worker's device copies go on the device's current stream of that thread (the default
// stream), which is the training thread's only where training runs on the default stream (the
// benchmark does); and how many prefetches reach an entry before backward does is timing, so
// prefetches and prefetch_hits do not compare between the arms. Whichever arm measures faster
// on the GPU becomes the only way.
namespace {

// Whether SPILLARENA_PREFETCH_THREAD says "worker"; a value that is neither that nor "training"
// gets a notice naming it (an A/B run with a typo would otherwise measure one arm twice).
bool prefetch_on_worker(std::string& notice) {
  const char* where = std::getenv("SPILLARENA_PREFETCH_THREAD");
  const std::string value = where != nullptr ? where : "";
  if (!value.empty() && value != "worker" && value != "training") {
    notice = "spillarena: SPILLARENA_PREFETCH_THREAD=" + quote(value) +
             " is neither \"worker\" nor \"training\"; prefetches run on the training thread";
  }
  return value == "worker";
}

// The paths in the order path_for asks them (Note [A path and its state] in stash_path.h): a
// new path is one more line here.
using MakePath = std::unique_ptr<SpillPath> (*)(StashContext&, Progress&);
constexpr MakePath kPaths[] = {make_gds_path, make_device_path, make_cpu_path};

std::vector<std::unique_ptr<SpillPath>> make_paths(StashContext& context, Progress& progress) {
  std::vector<std::unique_ptr<SpillPath>> paths;
  for (const MakePath make : kPaths) paths.push_back(make(context, progress));
  return paths;
}

}  // namespace

Chain::Chain(const SpillArena& arena, const StashOptions& options)
    : context_(arena, options),
      prefetch_on_worker_(prefetch_on_worker(prefetch_notice_)),
      paths_(make_paths(context_, progress_)),
      progress_(options.asynchronous) {}

Chain::~Chain() = default;

// The first path that takes `e`; the CPU path, last, takes every input the others leave.
SpillPath& Chain::path_for(const Entry& e) const {
  for (const std::unique_ptr<SpillPath>& path : paths_) {
    if (path->takes(e)) return *path;
  }
  throw std::logic_error("spill: no path takes the stashed " + e.describe() +
                         "; see Note [A path and its state]");
}

void Chain::stored(const EntryPtr& e) {
  std::vector<EntryPtr> to_spill;
  {
    MutexLock lock(mutex_);
    e->previous = last_;
    last_ = e;
    unspilled_.push_back(e);
    while (unspilled_.size() > context_.options.keep_last) {
      if (EntryPtr p = unspilled_.front().lock()) to_spill.push_back(std::move(p));
      unspilled_.pop_front();
    }
  }
  raise_to(context_.largest_input, e->bytes);
  for (const EntryPtr& p : to_spill) {
    MutexLock lock(p->mutex);
    spill(p);
  }
  // Note [The device-held bound] in copy_window.cc
  const StashOptions& o = context_.options;
  for (const std::unique_ptr<SpillPath>& path : paths_) {
    path->wait_for_copies(std::max(o.prefetch_depth, o.keep_last) - o.keep_last);
  }
}

void Chain::spill(const EntryPtr& e) {
  if (e->state != State::held) return;
  // Changed in place before it was written: kept as it is, and refused when backward asks for
  // it (restore's check), as autograd refuses it. Not here: store() of the next tensor, in the
  // forward, is no place for this one's error, and there may be no backward at all.
  if (e->changed_in_place()) return advance(*e, State::kept);
  if (e->bytes == 0) {
    e->input = Buffer();
    return advance(*e, State::spilled);
  }
  path_for(*e).spill(e);
}

namespace {

// held, kept, copying, and a CPU input in writing (an accelerator's was released when its copy
// completed): the input itself is still here.
bool input_still_here(const Entry& e) REQUIRES(e.mutex) {
  switch (e.state) {
    case State::held:
    case State::kept:
    case State::copying:
      return true;
    case State::writing:
      return e.input.defined();
    case State::failed:
    case State::spilled:
    case State::reading:
    case State::uploading:
    case State::restored:
      return false;
  }
  return false;
}

}  // namespace

// One switch on the state (Note [Lifecycle of a stashed tensor] in stash_entry.cc): an input
// still in memory goes back as it is; its path reads back the others, in two halves with the
// predecessors' reads queued between them, so that they overlap this read and then this layer's
// recomputation (Note [Overlapped spilling]). Never two entries' mutexes at once.
Buffer Chain::restore(const EntryPtr& e) {
  rethrow_failure();
  Entry& entry = *e;
  MutexLock lock(entry.mutex);
  if (entry.state == State::restored) return Buffer();
  if (entry.changed_in_place()) throw_modified(entry, "between forward and backward");
  if (entry.state == State::failed) std::rethrow_exception(entry.failure);
  const bool was_prefetched = entry.prefetched;
  const auto start = std::chrono::steady_clock::now();
  bool ready = true;
  Buffer result;
  if (input_still_here(entry)) {
    result = give_back_input(entry);
    lock.unlock();
    prefetch_predecessors(entry);
  } else {
    SpillPath& path = path_for(entry);
    ready = path.begin_restore(entry);  // its own read first, so it is queued before theirs
    lock.unlock();
    prefetch_predecessors(entry);
    lock.lock();
    result = path.finish_restore(entry);  // only now the wait for its own bytes
    lock.unlock();
  }
  context_.counters->record_restore(was_prefetched, ready, elapsed_ns(start));
  if (!entry.previous.lock()) {
    // The oldest input still stashed: the backward is over, so is reuse until the next one
    // (Note [Restoring into reused memory] in restore_pool.cc).
    context_.shared->restore_pool->release_idle();
  }
  return result;
}

// Idempotent; a read that found no room in the pool is tried again at the next call.
void Chain::prefetch(Entry& e) {
  if (e.state == State::restored) return;
  if (!e.prefetched) {
    e.prefetched = true;
    context_.counters->prefetches.fetch_add(1);
  }
  path_for(e).prefetch(e);
}

void Chain::prefetch_predecessors(const Entry& e) {
  EntryPtr p = e.previous.lock();
  if (!p) return;
  if (!prefetch_on_worker_) return prefetch_from(std::move(p));
  progress_.post_prefetch([this, p] { prefetch_from(p); });
}

void Chain::prefetch_from(EntryPtr p) {
  for (std::uint32_t i = 0; p && i < context_.options.prefetch_depth; ++i) {
    {
      MutexLock lock(p->mutex);
      prefetch(*p);  // uploads only within the depth: device memory stays bounded
    }
    p = p->previous.lock();
  }
}

std::vector<std::string> Chain::take_notices() {
  std::vector<std::string> notices = detail::take_notices(context_.arena);
  for (std::string& notice : context_.shared->host_pool.take_notices()) {
    notices.push_back(std::move(notice));
  }
  MutexLock lock(mutex_);
  if (!prefetch_notice_.empty()) notices.push_back(std::exchange(prefetch_notice_, {}));
  return notices;
}

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

std::shared_ptr<Chain> make_chain(const SpillArena& arena, const StashOptions& options) {
  return std::make_shared<Chain>(arena, checked(options));
}

// Kept by the arena's StashSettings, below the chain, type-erased: made there with the options of
// that moment, under the settings' mutex.
std::shared_ptr<Chain> shared_chain(const SpillArena& arena) {
  const auto make = [&arena](const StashOptions& options) -> std::shared_ptr<void> {
    return std::make_shared<Chain>(arena, options);
  };
  return std::static_pointer_cast<Chain>(shared_state_of(arena)->settings.get_or_make_shared(make));
}

}  // namespace detail

void set_stash_options(const SpillArena& arena, const StashOptions& options) {
  detail::checked(options);
  detail::shared_state_of(arena)->settings.set_options(options);
}

StashOptions stash_options(const SpillArena& arena) {
  return detail::shared_state_of(arena)->settings.options();
}

}  // namespace spill
