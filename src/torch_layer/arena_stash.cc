// The arena stash: layer inputs spilled to regions of a SpillArena, overlapped with compute.
// See Note [Overlapped spilling].
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "device_copy.h"
#include "serial_worker.h"
#include "spill/tensor_stash.h"
#include "storable.h"

namespace spill {
namespace {

// Note [Overlapped spilling]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// store() keeps a reference to the input and returns. The input is spilled once keep_last newer
// inputs were stored (the last layers' inputs are needed first in backward, so they stay where they
// are): its region is allocated and its write queued; an accelerator tensor is first copied to host
// memory on a side stream (see Note [Accelerator copies] in src/torch_layer/device_copy.cc) and
// written once that copy is done. The reference is dropped when the write completed, so until then
// restore() simply gives the input back and no read can overtake the write. restore() of layer i
// first queues the reads of its prefetch_depth predecessors — this stash's own chain of stored
// tensors, not the arena's last write — then waits for its own bytes only. An input changed in
// place before it was spilled would be spilled wrong, so its version counter is checked.

// Note [Progress on accelerators]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The training thread queues kernels far ahead of the device, so at the next store() the device
// -> host copy of an input is rarely done, and the copies of a forward's last layers are never
// looked at again before backward: their writes were not queued and their inputs stayed on the
// device, holding the memory the spill exists to free (on an H200, 4 of 15 inputs per step were
// spilled in direct mode). So a chain with accelerator inputs has one progress thread (a
// SerialWorker): for each copy it waits for the copy's event and queues the write, then, in a
// later job, waits for the write and drops the device tensor. The training thread still does the
// same when it gets there first: retire() is idempotent under the entry's mutex. A failure in the
// thread (a write that could not be queued) is kept and rethrown on the training thread at the
// next store() or restore(); the entry keeps its input, so nothing is read from a region that was
// never written.

std::string describe(const torch::Tensor& t) {
  std::ostringstream text;
  text << "layer input of shape " << t.sizes() << ", dtype " << t.dtype() << ", " << t.nbytes()
       << " bytes";
  return text.str();
}

std::uint64_t elapsed_ns(std::chrono::steady_clock::time_point since) {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now() - since)
                                        .count());
}

struct Entry {
  std::mutex mutex;  // guards the mutable fields below
  torch::Tensor held;        // the input itself, until its write completed
  std::int64_t version = 0;  // held's version counter at store()
  std::shared_ptr<detail::DeviceCopy> to_host;  // accelerator: device -> host before the write
  std::optional<detail::DeviceCopy> to_device;  // accelerator: host -> device after the read
  torch::Tensor host;  // bytes being written, or the destination of the read
  Region region;
  Pending write;
  Pending read;
  bool spilled = false;
  bool write_queued = false;
  bool handed_off = false;  // to the progress thread; see Note [Progress on accelerators]
  bool read_queued = false;
  bool prefetched = false;
  bool restored = false;
  // Set at store(), then constant.
  std::vector<int64_t> sizes;
  torch::TensorOptions options;
  std::weak_ptr<Entry> previous;  // what this stash stored just before
};
using EntryPtr = std::shared_ptr<Entry>;

// What a stash and its stashed tensors share: the arena, the chain of stored tensors, and the
// host -> device copies still reading their host buffers.
class Chain {
 public:
  explicit Chain(const SpillArena& arena)
      : arena_(arena.shared_handle()), options_(arena_.options()) {}

  const SpillArena& arena() const { return arena_; }
  const ArenaOptions& options() const { return options_; }

  void stored(const EntryPtr& e);
  void keep_until_done(detail::DeviceCopy copy);
  // Rethrows, once, a failure of the progress thread.
  void rethrow_failure();

  void spill(Entry& e);        // caller holds e.mutex
  void retire(Entry& e);       // caller holds e.mutex
  void queue_read(Entry& e);   // caller holds e.mutex
  torch::Tensor aligned_host_buffer(const Entry& e) const;

 private:
  void write(Entry& e, torch::Tensor host);
  void hand_off(const EntryPtr& e);  // caller holds e->mutex
  void finish_copy(const EntryPtr& e);
  void finish_write(const EntryPtr& e, const Pending& write);
  void record_failure(std::exception_ptr failure);

  SpillArena arena_;
  const ArenaOptions options_;
  std::mutex mutex_;  // guards last_, unsafe_, copies_, failure_
  std::weak_ptr<Entry> last_;
  std::deque<std::weak_ptr<Entry>> unsafe_;  // stored, write not yet complete, oldest first
  std::deque<detail::DeviceCopy> copies_;
  std::exception_ptr failure_;
  detail::SerialWorker progress_;  // last: joined before the members its jobs use are destroyed
};

void Chain::stored(const EntryPtr& e) {
  std::vector<EntryPtr> alive;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    e->previous = last_;
    last_ = e;
    unsafe_.push_back(e);
    std::deque<std::weak_ptr<Entry>> still;
    for (auto& w : unsafe_) {
      if (EntryPtr p = w.lock()) {
        alive.push_back(p);
        still.push_back(w);
      }
    }
    unsafe_.swap(still);
    for (auto& c : copies_) c.release_source_if_done();
    while (!copies_.empty() && copies_.front().done()) copies_.pop_front();
  }
  const std::size_t keep = std::min<std::size_t>(options_.keep_last, alive.size());
  std::vector<const Entry*> safe;  // written: no longer needs this chain's attention
  for (std::size_t i = 0; i < alive.size(); ++i) {
    std::lock_guard<std::mutex> lock(alive[i]->mutex);
    if (i + keep < alive.size()) spill(*alive[i]);
    retire(*alive[i]);
    hand_off(alive[i]);
    if (!alive[i]->held.defined() && !alive[i]->to_host) safe.push_back(alive[i].get());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  unsafe_.erase(std::remove_if(unsafe_.begin(), unsafe_.end(),
                               [&](const std::weak_ptr<Entry>& w) {
                                 const EntryPtr p = w.lock();
                                 return !p || std::find(safe.begin(), safe.end(), p.get()) != safe.end();
                               }),
                unsafe_.end());
}

void Chain::rethrow_failure() {
  std::exception_ptr failure;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failure = std::exchange(failure_, nullptr);
  }
  if (failure) std::rethrow_exception(failure);
}

void Chain::record_failure(std::exception_ptr failure) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_) failure_ = std::move(failure);
}

void Chain::hand_off(const EntryPtr& e) {
  if (e->handed_off || !e->to_host || !options_.asynchronous) return;
  e->handed_off = true;
  progress_.post([this, e] { finish_copy(e); });
}

// On the progress thread: once the copy is done, queue the write, and wait for it in a later job.
void Chain::finish_copy(const EntryPtr& e) {
  try {
    std::shared_ptr<detail::DeviceCopy> copy;
    {
      std::lock_guard<std::mutex> lock(e->mutex);
      copy = e->to_host;
    }
    if (copy) copy->synchronize();
    Pending write;
    {
      std::lock_guard<std::mutex> lock(e->mutex);
      retire(*e);
      write = e->write;
    }
    progress_.post([this, e, write] { finish_write(e, write); });
  } catch (...) {
    record_failure(std::current_exception());
  }
}

// On the progress thread: once the write is done, drop the device tensor. A failed write is
// reported by the arena at the next read of the region.
void Chain::finish_write(const EntryPtr& e, const Pending& write) {
  try {
    write.settle();
    std::lock_guard<std::mutex> lock(e->mutex);
    retire(*e);
  } catch (...) {
    record_failure(std::current_exception());
  }
}

// Only the host buffer is kept: the device tensor belongs to the caller. Finished copies are
// dropped here too, as backward stores nothing.
void Chain::keep_until_done(detail::DeviceCopy copy) {
  copy.release_result();
  std::lock_guard<std::mutex> lock(mutex_);
  while (!copies_.empty() && copies_.front().done()) copies_.pop_front();
  copies_.push_back(std::move(copy));
}

void Chain::spill(Entry& e) {
  if (e.spilled || e.restored || !e.held.defined()) return;
  if (e.held._version() != e.version) {
    throw CheckpointError("spill::checkpoint: a stashed " + describe(e.held) +
                          " was modified in place before it was spilled; clone it before "
                          "changing it, or do not modify layer inputs in place");
  }
  e.spilled = true;
  const std::uint64_t bytes = e.held.nbytes();
  if (bytes == 0) return;
  try {
    e.region = arena_.allocate(bytes);
  } catch (const ArenaExhaustedError& x) {
    throw ArenaExhaustedError(x.requested_bytes(), x.free_bytes(), x.largest_free_block(),
                              "spill::checkpoint: no room to stash the " + describe(e.held) +
                                  ": " + x.what());
  }
  if (e.held.device().is_cpu()) return write(e, e.held);
  e.to_host = std::make_shared<detail::DeviceCopy>(detail::DeviceCopy::to_host(e.held));
  if (!options_.asynchronous) e.to_host->synchronize();
}

void Chain::write(Entry& e, torch::Tensor host) {
  e.host = std::move(host);
  e.write = e.region.write_async(e.host.data_ptr(), e.host.nbytes());
  e.write_queued = true;
  if (!options_.asynchronous) e.write.wait();
}

void Chain::retire(Entry& e) {
  if (e.to_host && (e.to_host->done() || !options_.asynchronous)) {
    torch::Tensor host = e.to_host->result();
    e.to_host.reset();
    write(e, std::move(host));
  }
  if (e.spilled && !e.to_host && e.write_queued && e.write.ready()) {
    e.held = torch::Tensor();
    if (!e.read_queued) e.host = torch::Tensor();
  }
}

// Direct reads skip the staging pool when the destination is aligned: allocate with slack and
// view the aligned part. Pinned buffers come page-aligned from LibTorch's host allocator, which
// rounds sizes up to a power of two: slack there would double a 128 MiB buffer, so an exact
// pinned buffer is tried first.
torch::Tensor Chain::aligned_host_buffer(const Entry& e) const {
  const auto align = static_cast<std::int64_t>(arena_.io_alignment());
  const std::int64_t bytes = static_cast<std::int64_t>(e.region.requested_bytes());
  auto host_options = torch::TensorOptions().dtype(torch::kUInt8);
  const auto typed = [&e](const torch::Tensor& raw) {
    return raw.view(e.options.dtype().toScalarType()).view(e.sizes);
  };
  if (!e.options.device().is_cpu()) {
    host_options = host_options.pinned_memory(true);
    try {
      torch::Tensor exact = torch::empty({bytes}, host_options);
      if (reinterpret_cast<std::uintptr_t>(exact.data_ptr()) % align == 0) return typed(exact);
    } catch (const c10::Error&) {
      host_options = torch::TensorOptions().dtype(torch::kUInt8);  // pinning refused
    }
  }
  torch::Tensor raw;
  try {
    raw = torch::empty({bytes + align}, host_options);
  } catch (const c10::Error&) {
    raw = torch::empty({bytes + align}, torch::TensorOptions().dtype(torch::kUInt8));
  }
  const auto address = reinterpret_cast<std::uintptr_t>(raw.data_ptr());
  const auto pad = static_cast<std::int64_t>((align - address % align) % align);
  return typed(raw.narrow(0, pad, bytes));
}

void Chain::queue_read(Entry& e) {
  if (e.read_queued || !e.spilled || e.held.defined() || !e.region.valid()) return;
  const bool zero_copy = e.options.device().is_cpu() && arena_.io_mode() == IoMode::buffered;
  if (zero_copy) {
    e.region.prefetch();  // readahead; restore() views the mapping
  } else {
    e.host = aligned_host_buffer(e);
    e.read = e.region.read_async(e.host.data_ptr(), e.host.nbytes());
  }
  e.read_queued = true;
}

class ArenaStashed final : public StashedTensor {
 public:
  ArenaStashed(std::shared_ptr<Chain> chain, EntryPtr entry)
      : chain_(std::move(chain)), entry_(std::move(entry)) {}

  void prefetch() override {
    std::lock_guard<std::mutex> lock(entry_->mutex);
    prefetch_locked(*entry_);
  }

  torch::Tensor restore() override {
    chain_->rethrow_failure();
    prefetch_predecessors();
    std::lock_guard<std::mutex> lock(entry_->mutex);
    Entry& e = *entry_;
    if (e.restored) return torch::Tensor();
    e.restored = true;
    chain_->retire(e);
    if (e.held.defined()) return give_back_held(e);
    if (!e.region.valid()) return torch::empty(e.sizes, e.options);
    chain_->queue_read(e);
    const bool ready = e.options.device().is_cpu() && chain_->arena().io_mode() == IoMode::buffered
                           ? e.region.resident()
                           : e.read.ready();
    const auto start = std::chrono::steady_clock::now();
    torch::Tensor result = bring_back(e);
    chain_->arena().record_restore(e.prefetched, ready, elapsed_ns(start));
    return result;
  }

 private:
  // A tensor still in memory (kept, or its write in flight) counts as prefetched: it will be
  // ready when backward asks, which is what the counter measures.
  void prefetch_locked(Entry& e) {
    if (e.restored || e.prefetched) return;
    e.prefetched = true;
    chain_->arena().record_prefetch();
    chain_->retire(e);
    if (e.held.defined() || !e.region.valid()) return;
    chain_->queue_read(e);
  }

  void prefetch_predecessors() {
    EntryPtr p = entry_->previous.lock();
    for (std::uint32_t i = 0; p && i < chain_->options().prefetch_depth; ++i) {
      {
        std::lock_guard<std::mutex> lock(p->mutex);
        prefetch_locked(*p);
        if (!p->options.device().is_cpu() && p->read_queued && !p->to_device && p->read.ready()) {
          p->to_device = detail::DeviceCopy::to_device(p->host, p->options.device());
        }
      }
      p = p->previous.lock();
    }
  }

  torch::Tensor give_back_held(Entry& e) {
    if (e.held._version() != e.version) {
      throw CheckpointError("spill::checkpoint: a stashed " + describe(e.held) +
                            " was modified in place between forward and backward; clone it "
                            "before changing it");
    }
    chain_->arena().record_restore(e.prefetched, true, 0);
    return std::exchange(e.held, torch::Tensor());
  }

  // Note [Zero-copy restore]
  // ~~~~~~~~~~~~~~~~~~~~~~~~
  // In buffered mode a CPU tensor is restored as a view of its region in the mapping (from_blob),
  // not copied out: the recomputation reads the page cache directly, no anonymous memory is
  // allocated, and the region is freed when the last reference to that tensor dies (normally at
  // the end of this layer's backward). Direct mode and accelerators read into a host buffer and
  // free the region at once.
  torch::Tensor bring_back(Entry& e) {
    if (e.options.device().is_cpu() && chain_->arena().io_mode() == IoMode::buffered) {
      e.write.wait();
      auto region = std::make_shared<Region>(std::move(e.region));
      const std::uint64_t bytes = region->requested_bytes();
      return torch::from_blob(const_cast<void*>(region->read_in_place(bytes)), e.sizes,
                              [region](void*) mutable { region.reset(); }, e.options);
    }
    e.read.wait();
    e.region.free();
    torch::Tensor host = std::exchange(e.host, torch::Tensor());
    if (e.options.device().is_cpu()) return host;
    if (!e.to_device) e.to_device = detail::DeviceCopy::to_device(host, e.options.device());
    e.to_device->order_current_stream();
    torch::Tensor result = e.to_device->result();
    chain_->keep_until_done(std::move(*e.to_device));  // keeps the host buffer alive
    e.to_device.reset();
    return result;
  }

  std::shared_ptr<Chain> chain_;
  EntryPtr entry_;
};

class ArenaStash final : public TensorStash {
 public:
  explicit ArenaStash(const SpillArena& arena) : chain_(std::make_shared<Chain>(arena)) {}

  std::unique_ptr<StashedTensor> store(const torch::Tensor& tensor) override {
    detail::check_storable(tensor, name());
    chain_->rethrow_failure();
    auto e = std::make_shared<Entry>();
    e->held = tensor.detach().contiguous();
    e->version = e->held._version();
    e->sizes = tensor.sizes().vec();
    e->options = tensor.options();
    chain_->stored(e);
    return std::make_unique<ArenaStashed>(chain_, std::move(e));
  }

  std::string name() const override {
    return to_string(chain_->arena().backing());
  }

 private:
  std::shared_ptr<Chain> chain_;
};

}  // namespace

std::shared_ptr<TensorStash> make_arena_stash(const SpillArena& arena) {
  return std::make_shared<ArenaStash>(arena);
}

// One stash per arena while it is in use: a registry of weak references, keyed by the arena's
// identity. Checkpoint nodes own the stash; when the last graph dies, so does the stash.
std::shared_ptr<TensorStash> shared_arena_stash(const SpillArena& arena) {
  static std::mutex mutex;
  static std::map<const void*, std::weak_ptr<TensorStash>> stashes;
  std::lock_guard<std::mutex> lock(mutex);
  for (auto it = stashes.begin(); it != stashes.end();) {
    it = it->second.expired() ? stashes.erase(it) : std::next(it);
  }
  std::weak_ptr<TensorStash>& slot = stashes[arena.identity()];
  std::shared_ptr<TensorStash> stash = slot.lock();
  if (!stash) {
    stash = make_arena_stash(arena);
    slot = stash;
  }
  return stash;
}

}  // namespace spill
