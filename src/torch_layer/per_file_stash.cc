// The per-file baseline for LibTorch's C++ API: torch::save into a file of
// src/core/stash/per_file.cc per stashed tensor, torch::load back.
#include <memory>
#include <string>
#include <utility>

#include "core/stash/per_file.h"
#include "spill/tensor_stash.h"
#include "storable.h"

namespace spill {
namespace {

class PerFileStashed final : public StashedTensor {
 public:
  PerFileStashed(detail::PerFile file, torch::Device device)
      : file_(std::move(file)), device_(device) {}

  torch::Tensor restore() override {
    torch::Tensor t;
    file_.restore([&](const detail::Reader& read, std::uint64_t size_bytes) {
      torch::load(t, read, [size_bytes] { return static_cast<std::size_t>(size_bytes); });
    });
    return device_.is_cpu() ? t : t.to(device_);
  }

 private:
  detail::PerFile file_;
  torch::Device device_;
};

class PerFileStash final : public TensorStash {
 public:
  explicit PerFileStash(std::string directory) : files_(std::move(directory)) {}

  std::unique_ptr<StashedTensor> store(const torch::Tensor& tensor) override {
    detail::check_storable(tensor, name());
    torch::Tensor host = tensor.device().is_cpu() ? tensor : tensor.to(torch::kCPU);
    detail::PerFile file = files_.store([&](const detail::Sink& sink) { torch::save(host, sink); });
    return std::make_unique<PerFileStashed>(std::move(file), tensor.device());
  }

  std::string name() const override { return "per_file"; }

 private:
  detail::PerFileFiles files_;
};

}  // namespace

std::shared_ptr<TensorStash> make_per_file_stash(const std::string& directory) {
  return std::make_shared<PerFileStash>(directory);
}

}  // namespace spill
