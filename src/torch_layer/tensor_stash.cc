#include "spill/tensor_stash.h"

#include <utility>

namespace spill {
namespace {

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

std::shared_ptr<TensorStash> make_in_memory_stash() { return std::make_shared<InMemoryStash>(); }

}  // namespace spill
