#include "spill/tensor_stash.h"

#include <sstream>

namespace spill {
namespace {

std::string describe(const torch::Tensor& t) {
  std::ostringstream text;
  text << "layer input of shape " << t.sizes() << ", dtype " << t.dtype() << ", "
       << t.nbytes() << " bytes";
  return text.str();
}

// ---------------------------------------------------------------------------------------------
// Arena stash
// ---------------------------------------------------------------------------------------------

class ArenaStashed final : public StashedTensor {
 public:
  ArenaStashed(SpillArena arena, Region region, torch::Tensor like,
               std::pair<std::uint64_t, std::uint64_t> previous)
      : arena_(std::move(arena)),
        region_(std::move(region)),
        sizes_(like.sizes().vec()),
        options_(like.options()),
        previous_(previous) {}

  // Note [Zero-copy restore]
  // A CPU tensor is restored as a view of its region in the mapping (from_blob), not copied
  // out: the recomputation reads the page cache directly, no anonymous memory is allocated, and
  // the region is freed when the last reference to that tensor dies (normally at the end of this
  // layer's backward). Other devices copy from the mapping to the device and free at once.
  torch::Tensor restore() override {
    if (!region_.valid()) return torch::empty(sizes_, options_);
    auto region = std::make_shared<Region>(std::move(region_));
    const std::uint64_t bytes = region->requested_bytes();
    torch::Tensor mapped = torch::from_blob(
        const_cast<void*>(region->read_in_place(bytes)), sizes_, [region](void*) mutable { region.reset(); },
        options_.device(torch::kCPU));
    if (options_.device().is_cpu()) return mapped;
    return mapped.to(options_.device());
  }

  void prefetch_previous() override { arena_.prefetch_range(previous_.first, previous_.second); }

 private:
  SpillArena arena_;
  Region region_;  // empty for a zero-element tensor
  std::vector<int64_t> sizes_;
  torch::TensorOptions options_;
  std::pair<std::uint64_t, std::uint64_t> previous_;
};

class ArenaStash final : public TensorStash {
 public:
  explicit ArenaStash(const SpillArena& arena) : arena_(arena.shared_handle()) {}

  std::unique_ptr<StashedTensor> store(const torch::Tensor& tensor) override {
    torch::Tensor host = tensor.contiguous();
    if (!host.device().is_cpu()) host = host.to(torch::kCPU);
    const auto previous = arena_.last_written_range();
    Region region;
    if (host.nbytes() > 0) {
      region = allocate_for(tensor, host.nbytes());
      region.write(host.data_ptr(), host.nbytes());
    }
    return std::make_unique<ArenaStashed>(arena_.shared_handle(), std::move(region), tensor,
                                          previous);
  }

  std::string name() const override {
    return arena_.backing() == Backing::disk ? "disk" : "ram";
  }

 private:
  Region allocate_for(const torch::Tensor& tensor, std::uint64_t bytes) {
    try {
      return arena_.allocate(bytes);
    } catch (const ArenaExhaustedError& e) {
      throw ArenaExhaustedError(e.requested_bytes(), e.free_bytes(), e.largest_free_block(),
                                "spill::checkpoint: no room to stash the " + describe(tensor) +
                                    ": " + e.what());
    }
  }

  SpillArena arena_;
};

// ---------------------------------------------------------------------------------------------
// In-memory stash (classic recompute checkpointing)
// ---------------------------------------------------------------------------------------------

class InMemoryStashed final : public StashedTensor {
 public:
  explicit InMemoryStashed(torch::Tensor t) : tensor_(std::move(t)) {}
  torch::Tensor restore() override { return std::exchange(tensor_, torch::Tensor()); }

 private:
  torch::Tensor tensor_;
};

class InMemoryStash final : public TensorStash {
 public:
  std::unique_ptr<StashedTensor> store(const torch::Tensor& tensor) override {
    return std::make_unique<InMemoryStashed>(tensor.detach());
  }
  std::string name() const override { return "recompute"; }
};

}  // namespace

std::shared_ptr<TensorStash> make_arena_stash(const SpillArena& arena) {
  return std::make_shared<ArenaStash>(arena);
}

std::shared_ptr<TensorStash> make_in_memory_stash() { return std::make_shared<InMemoryStash>(); }

}  // namespace spill
