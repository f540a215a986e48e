// The per-file baseline: one torch::save file per stashed tensor, as the original Python feature
// does with torch.save / torch.load / os.remove. Reproduced faithfully so benchmarks compare
// spillarena with what it replaces, not with a straw man.
#include <atomic>
#include <cstdio>

#include "platform.h"
#include "spill/tensor_stash.h"

namespace spill {
namespace {

class PerFileStashed final : public StashedTensor {
 public:
  PerFileStashed(std::string path, torch::Device device) : path_(std::move(path)), device_(device) {}
  ~PerFileStashed() override { std::remove(path_.c_str()); }

  torch::Tensor restore() override {
    torch::Tensor t;
    torch::load(t, path_);
    std::remove(path_.c_str());
    return device_.is_cpu() ? t : t.to(device_);
  }

 private:
  std::string path_;
  torch::Device device_;
};

class PerFileStash final : public TensorStash {
 public:
  explicit PerFileStash(std::string directory) : directory_(std::move(directory)) {
    if (int e = platform::check_writable_directory(directory_); e != 0) {
      throw DirectoryError(directory_, e, "spill: per-file stash directory '" + directory_ +
                                              "' is missing or not writable; create it or choose "
                                              "another");
    }
  }

  std::unique_ptr<StashedTensor> store(const torch::Tensor& tensor) override {
    const std::string path = directory_ + "/spillarena-per-file-" + std::to_string(platform::process_id()) +
                             "-" + std::to_string(next_file_number()) + ".pt";
    torch::Tensor host = tensor.device().is_cpu() ? tensor : tensor.to(torch::kCPU);
    torch::save(host, path);
    return std::make_unique<PerFileStashed>(path, tensor.device());
  }

  std::string name() const override { return "per_file"; }

 private:
  // One counter for the process: two stashes on the same directory never share a file name.
  static std::uint64_t next_file_number() {
    static std::atomic<std::uint64_t> counter{0};
    return counter.fetch_add(1);
  }

  std::string directory_;
};

}  // namespace

std::shared_ptr<TensorStash> make_per_file_stash(const std::string& directory) {
  return std::make_shared<PerFileStash>(directory);
}

}  // namespace spill
