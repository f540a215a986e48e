#include "spill/tensor_stash.h"

#include <utility>

#include "core/stash/stored_bytes.h"
#include "spill/error.h"

namespace spill {
namespace {

// ---------------------------------------------------------------------------------------------
// In-memory stash (classic recompute checkpointing)
// ---------------------------------------------------------------------------------------------

class InMemoryStashed final : public StashedTensor {
 public:
  explicit InMemoryStashed(torch::Tensor t) : tensor_(std::move(t)) {}
  torch::Tensor restore() override {  // once, as every stash's (spill/tensor_stash.h)
    if (std::exchange(restored_, true)) throw CheckpointError(detail::kAlreadyRestored);
    return std::exchange(tensor_, torch::Tensor());
  }

 private:
  torch::Tensor tensor_;
  bool restored_ = false;
};

class InMemoryStash final : public TensorStash {
 public:
  std::unique_ptr<StashedTensor> store(const torch::Tensor& tensor) override {
    return std::make_unique<InMemoryStashed>(tensor.detach());
  }
  std::string name() const override { return "recompute"; }
};

}  // namespace

std::shared_ptr<TensorStash> make_in_memory_stash() { return std::make_shared<InMemoryStash>(); }

}  // namespace spill
