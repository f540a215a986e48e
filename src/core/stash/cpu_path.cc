// The arena stash's CPU path: the input itself is written to its region, and read back into a
// new buffer. See Note [Overlapped spilling] in chain.cc.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <utility>

#include "core/arena/arena_internals.h"
#include "core/os/counted_wait.h"
#include "stash_path.h"

namespace spill::detail {
namespace {

// Note [Restoring from the mapping]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A restore copies the region into a tensor of its own (Region::take_into: the copy and the
// integrity check in one pass, then the region is freed). It was once a view of the mapping
// (from_blob), which spared that copy — but then LibTorch's kernels read the mapping themselves
// during the recomputation and its backward, and a spill file that shrank meanwhile (truncated
// by another process, a failing disk) killed the process with SIGBUS inside a kernel, where no
// handler can turn the fault into an error (found by the red-team pass: 5 of 6 runs).
// take_into faults, if at all, in spillarena's own guarded copy: a spill::IoError (Note [SIGBUS
// on the mapping] in src/core/os/platform_posix.cc). Direct mode reads into an aligned host
// buffer (the read skips the staging pool), queued ahead by prefetch or by the restore's first
// half; buffered mode reads ahead in the page cache then, and the second half copies. A RAM
// arena has no file to shrink: its restore is a view of the region (Note [A RAM restore is a
// view] in src/core/arena/arena_internals.cc).

// What the CPU path keeps of an entry (Note [A path and its state] in stash_path.h): the write
// from the input, and a direct read ahead's destination, which ~Entry destroys only after the
// region's read into it completed.
struct CpuState final : PathState {
  Pending write;
  Buffer host;
  // Completed: the region was freed after it.
  void check_write() const override { write.wait(); }
};

class CpuPath final : public SpillPath {
 public:
  using SpillPath::SpillPath;

  bool takes(const Entry& e) const override { return !e.accelerator; }

  // spill: the input itself is written (spill_from); prefetch and begin_restore: read ahead:
  // the page cache, or direct reads into a host buffer; finish_restore: take_into a new tensor
  // (a RAM arena: a view). A CPU input in writing is still here: the chain gives it back.
  void spill(const EntryPtr& e) override REQUIRES(e->mutex);
  void prefetch(Entry& e) override REQUIRES(e.mutex);
  bool begin_restore(Entry& e) override REQUIRES(e.mutex);
  Buffer finish_restore(Entry& e) override REQUIRES(e.mutex);

 private:
  void wait_for_room(std::uint64_t bytes) EXCLUDES(mutex_);
  void finish_write(const EntryPtr& e) EXCLUDES(e->mutex);
  void wrote(Entry& e) REQUIRES(e.mutex) EXCLUDES(mutex_);
  // A direct arena reads into an aligned host buffer, a buffered one through the mapping.
  bool reads_into_buffer() const { return context_.arena.io_mode() == IoMode::direct; }
  Buffer view(Entry& e) REQUIRES(e.mutex);

  Mutex mutex_;
  std::condition_variable room_;  // bytes in flight went down
};

// One call into the arena: the region is allocated and the input's write queued.
void CpuPath::spill(const EntryPtr& e) {
  wait_for_room(e->bytes);
  e->region = context_.region_for(*e, e->input.data());
  if (!e->region) return advance(*e, State::kept);
  CpuState& s = state_of<CpuState>(*e);
  s.write = e->region.pending();
  StashCounters& counters = *context_.counters;
  counters.add_in_flight(e->bytes);
  advance(*e, State::writing);
  if (!progress_.asynchronous()) {
    // The comparison point: the write completes before store() returns, failures thrown here.
    try {
      s.write.wait();
    } catch (...) {
      counters.sub_in_flight(e->bytes);
      throw;
    }
    return wrote(*e);
  }
  // A write made at once (Note [A small write is made at once] in src/core/arena/arena_core.cc)
  // is finished here: the progress thread would have to be woken for it.
  if (s.write.ready()) return wrote(*e);
  progress_.post([this, e] { finish_write(e); });
}

// Bounds the bytes of CPU inputs held for writes in flight (host_pool_bytes; by default room for
// prefetch_depth + 2 inputs): store() waits for the oldest writes to complete.
void CpuPath::wait_for_room(std::uint64_t bytes) {
  const std::uint64_t budget = context_.host_budget(bytes);
  StashCounters& counters = *context_.counters;
  const auto fits = [&] {
    const std::uint64_t now = counters.host_bytes_in_flight.load();
    return now == 0 || now + bytes <= budget || progress_.failed();
  };
  MutexLock lock(mutex_);
  if (fits()) return;
  const CountedWait counted(counters.pool_waits, counters.pool_wait_ns);
  while (!fits()) room_.wait_for(lock, std::chrono::milliseconds(5));
}

// On the progress thread: the write completed (or failed: the arena reports it at the region's
// next read), so the input is no longer needed here.
void CpuPath::finish_write(const EntryPtr& e) {
  Pending write;
  {
    MutexLock lock(e->mutex);
    write = state_of<CpuState>(*e).write;
  }
  write.settle();
  MutexLock lock(e->mutex);
  wrote(*e);
}

// The write settled (waited for, or ready): the input is let go, the bytes in flight go down and
// a store waiting for room is woken.
void CpuPath::wrote(Entry& e) {
  e.input = Buffer();
  if (e.state == State::writing) {
    advance(e, State::spilled);
    context_.counters->record_spilled(e.layer_input);
  }
  context_.counters->sub_in_flight(e.bytes);
  MutexLock lock(mutex_);
  room_.notify_all();
}

// Direct reads skip the staging pool when the destination is aligned.
void CpuPath::prefetch(Entry& e) {
  if (e.state != State::spilled || !e.region) return;
  CpuState& s = state_of<CpuState>(e);
  if (reads_into_buffer()) s.host = host_buffer(context_, e.bytes);
  e.region.read_ahead(s.host.defined() ? s.host.data() : nullptr);
  advance(e, State::reading);
}

// Ready: the pages were resident (buffered), or a prefetch's read into the host buffer had
// completed (direct), before this call queued anything. A RAM arena has nothing to read.
bool CpuPath::begin_restore(Entry& e) {
  if (!e.region || context_.arena.backing() == Backing::ram) return true;
  const bool ready = reads_into_buffer() ? e.state == State::reading && e.region.pending().ready()
                                         : resident(e.region, e.bytes);
  prefetch(e);  // a no-op where a successor's restore queued it
  return ready;
}

// See Note [Restoring from the mapping].
Buffer CpuPath::finish_restore(Entry& e) {
  if (!e.region) {  // 0 bytes
    advance(e, State::restored);
    return host_buffer(context_, 0);
  }
  if (context_.arena.backing() == Backing::ram) return view(e);
  CpuState& s = state_of<CpuState>(e);
  Buffer out = s.host.defined() ? std::exchange(s.host, Buffer()) : host_buffer(context_, e.bytes);
  e.region.take_into(out.data(), e.bytes);  // one call: waits for the read; the region is freed
  advance(e, State::restored);
  return out;
}

// The region is freed when the last reference to the tensor dies (normally at the end of this
// layer's backward).
Buffer CpuPath::view(Entry& e) {
  auto region = std::make_shared<Region>(std::move(e.region));
  void* memory = const_cast<void*>(host_bytes(*region, e.bytes));
  advance(e, State::restored);
  return Buffer(memory, e.bytes, Device{}, std::move(region));
}

}  // namespace

Buffer host_buffer(const StashContext& context, std::uint64_t bytes) {
  constexpr std::uint64_t kTorchAlignment = 64;  // LibTorch's CPU allocator's
  const bool direct = context.arena.io_mode() == IoMode::direct;
  const std::uint64_t alignment =
      direct ? std::max(context.arena.io_alignment(), kTorchAlignment) : kTorchAlignment;
  if (bytes == 0) return Buffer::host(0, alignment);
  return context.shared->restore_pool->take(bytes, alignment);
}

std::unique_ptr<SpillPath> make_cpu_path(StashContext& context, Progress& progress) {
  return std::make_unique<CpuPath>(context, progress);
}

}  // namespace spill::detail
