#include "spill/tensor_stash.h"

#include <sstream>

#include "spill/error.h"
#include "storable.h"

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

namespace detail {

void check_storable(const torch::Tensor& tensor, const std::string& stash_name) {
  const bool dense = tensor.layout() == torch::kStrided && !tensor.is_nested();
  if (dense && !tensor.is_meta()) return;
  std::ostringstream text;
  text << "spill: the " << stash_name << " stash stores dense tensors with data; got a "
       << (tensor.is_nested() ? std::string("nested") : c10::str(tensor.layout())) << " tensor on "
       << tensor.device() << ". Make it dense (to_dense()) and give it data, or keep it with "
       << "make_in_memory_stash()";
  throw InvalidArgumentError(text.str());
}

}  // namespace detail

std::shared_ptr<TensorStash> make_in_memory_stash() { return std::make_shared<InMemoryStash>(); }

}  // namespace spill
