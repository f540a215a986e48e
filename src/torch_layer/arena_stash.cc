// The arena stash as LibTorch's C++ API sees it: a tensor in, its bytes to the chain
// (src/core/stash/chain.cc), the same tensor back. What only a tensor has — shape, dtype,
// strides, its version counter — stays here (Note [The stash moves bytes] in
// src/core/stash/buffer.cc).
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/stash/chain.h"
#include "core/stash/stored_bytes.h"
#include "shared_arena_stash.h"
#include "spill/tensor_stash.h"
#include "storable.h"
#include "stream_engine.h"
#include "tensor_bytes.h"

// Note [Saved tensors and operation outputs from LibTorch]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Spilling more than a layer's input (issue 51) needs two hooks into autograd: one that sees
// every tensor autograd saves (offload without recompute) and one that sees each operation's
// output inside a checkpointed layer (per-operation policies). Torch has both only in Python:
// the default saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks) are kept as Python
// objects (at::SavedTensorDefaultHooks holds c10::SafePyObject pairs), and a dispatch mode
// that sees each operation (TorchDispatchMode, what torch's selective checkpoint is made of)
// is a Python object too. The C++ counterparts — torch::autograd::SavedVariableHooks, set on one
// SavedVariable by torch's own generated code, and c10's dispatch keys — are internals of a
// build, not stable LibTorch API (Note [One wheel for every torch] rules those out). So the
// decision is Python's: python/spillarena/offload.py (Note [Saved tensors to the arena]) and
// policy.py (Note [Operation outputs to the arena]) choose what spills, and hand its bytes to
// the same chain as this file does (python/src/stash_binding.cc), with StashInput::layer_input
// false so that StashStats counts them apart. The bytes move in the C++ core either way: the
// regions, the writes and reads, the integrity check, the overflow rule and the prefetching are
// the chain's. A C++ user spills layer inputs through spill::checkpoint.

namespace spill {
namespace {

std::string describe(const std::vector<int64_t>& sizes, const caffe2::TypeMeta& dtype,
                     std::uint64_t bytes) {
  std::ostringstream text;
  text << "layer input of shape " << c10::IntArrayRef(sizes) << ", dtype " << dtype << ", " << bytes
       << " bytes";
  return text.str();
}

// What the stash is told about `t` (Note [The stash moves bytes]): its contiguous bytes, and
// the version counter it shares with the caller's tensor, which outlives the bytes.
detail::StashInput stash_input(const torch::Tensor& t) {
  detail::StashInput in;
  const torch::Tensor contiguous = t.detach().contiguous();
  in.bytes = detail::bytes_of(contiguous);
  in.accelerator = detail::is_accelerator_input(t);
  if (in.accelerator) in.engine = detail::engine_for_inputs();
  in.describe = [sizes = t.sizes().vec(), dtype = t.dtype(), bytes = in.bytes.bytes()] {
    return describe(sizes, dtype, bytes);
  };
  const c10::VariableVersion counter = t.unsafeGetTensorImpl()->version_counter();
  in.changed_in_place = [counter, version = counter.current_version()] {
    return counter.current_version() != version;
  };
  return in;
}

// One stored tensor: its bytes in the chain (the stash protocol: Note [One stash protocol, two
// front ends] in src/core/stash/stored_bytes.cc) and the tensor's shape, dtype and layout.
class ArenaStashed final : public StashedTensor {
 public:
  ArenaStashed(detail::StoredBytes stored, const torch::Tensor& t)
      : stored_(std::move(stored)),
        sizes_(t.sizes().vec()),
        strides_(detail::strides_to_keep(sizes_, t.strides().vec())),
        dtype_(t.scalar_type()) {}

  void prefetch() override { stored_.prefetch(); }

  torch::Tensor restore() override {
    torch::Tensor restored = detail::tensor_of(stored_.restore()).view(dtype_).view(sizes_);
    if (strides_.empty()) return restored;
    return torch::empty_strided(sizes_, strides_, restored.options()).copy_(restored);
  }

 private:
  detail::StoredBytes stored_;
  const std::vector<int64_t> sizes_;
  const std::vector<int64_t> strides_;  // strides_to_keep: empty for contiguous
  const torch::ScalarType dtype_;
};

class ArenaStash final : public TensorStash {
 public:
  explicit ArenaStash(std::shared_ptr<detail::Chain> chain) : chain_(std::move(chain)) {}

  std::unique_ptr<StashedTensor> store(const torch::Tensor& tensor) override {
    detail::check_storable(tensor, name());
    detail::StoredBytes stored = detail::StoredBytes::store(chain_, stash_input(tensor));
    // The arena's sizing warnings (the first overflow, a refused grow), each once per arena,
    // and the stash's own (a pageable host pool), once per process.
    for (const std::string& notice : chain_->take_notices()) TORCH_WARN(notice);
    return std::make_unique<ArenaStashed>(std::move(stored), tensor);
  }

  std::string name() const override { return to_string(chain_->arena().backing()); }
  StashStats stats() const override { return chain_->stats(); }

 private:
  std::shared_ptr<detail::Chain> chain_;
};

}  // namespace

std::shared_ptr<TensorStash> make_arena_stash(const SpillArena& arena,
                                              const StashOptions& options) {
  return std::make_shared<ArenaStash>(detail::make_chain(arena, options));
}

std::shared_ptr<TensorStash> make_arena_stash(const SpillArena& arena) {
  return make_arena_stash(arena, stash_options(arena));
}

// The arena's shared chain, one per arena while it is in use (a weak reference kept with the
// arena): checkpoint nodes own it through this stash; when the last graph dies, so does it.
std::shared_ptr<TensorStash> detail::shared_arena_stash(const SpillArena& arena) {
  return std::make_shared<ArenaStash>(detail::shared_chain(arena));
}

}  // namespace spill
