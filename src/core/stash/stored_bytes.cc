#include "stored_bytes.h"

#include <algorithm>
#include <utility>

#include "chain.h"
#include "spill/error.h"

namespace spill::detail {

// Note [One stash protocol, two front ends]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The C++ front end (src/torch_layer/arena_stash.cc) and the Python binding
// (python/src/stash_binding.cc, for python/spillarena's arena stash, the offload policy and
// offload()) each wrote the same sequence around the chain: rethrow the progress thread's
// failure, make the entry, link it; restore once and refuse a second restore; refuse an input
// changed in place; keep the strides of a transposed input. Each copy drifted (the C++ one gave
// an undefined tensor on a second restore, the Python one checked the version twice). They now
// call this: what is left in each is what its language must do — a tensor's bytes and layout
// (DLPack or from_blob), the version counter (read under the GIL for Python), and its errors
// and warnings (TORCH_WARN, Python's warnings). A third front end calls the same four.

std::vector<std::int64_t> strides_to_keep(const std::vector<std::int64_t>& sizes,
                                          const std::vector<std::int64_t>& strides) {
  if (std::find(sizes.begin(), sizes.end(), 0) != sizes.end()) return {};  // no element
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // (stride, size), sizes above 1
  for (std::size_t i = 0; i < sizes.size() && i < strides.size(); ++i) {
    if (sizes[i] != 1) dims.emplace_back(strides[i], sizes[i]);
  }
  const bool contiguous_order = std::is_sorted(
      dims.begin(), dims.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::sort(dims.begin(), dims.end());
  std::int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return {};  // overlapping or with gaps: restored contiguous
    expected *= size;
  }
  return contiguous_order ? std::vector<std::int64_t>() : strides;
}

const char* const kAlreadyRestored =
    "spillarena: this stashed tensor was already restored (or freed); its region was consumed. "
    "Run forward again for a new graph (retain_graph is not supported with spilled inputs)";

StoredBytes StoredBytes::store(std::shared_ptr<Chain> chain, StashInput input) {
  chain->rethrow_failure();
  auto e = std::make_shared<Entry>(std::move(input), chain->counters());
  chain->stored(e);
  return StoredBytes(std::move(chain), std::move(e));
}

StoredBytes::StoredBytes(std::shared_ptr<Chain> chain, EntryPtr entry)
    : chain_(std::move(chain)), entry_(std::move(entry)) {}

StoredBytes::StoredBytes(StoredBytes&& other) noexcept {
  MutexLock theirs(other.mutex_);
  MutexLock mine(mutex_);
  chain_ = std::move(other.chain_);
  entry_ = std::move(other.entry_);
  restored_ = other.restored_;
  failure_ = std::move(other.failure_);
}

Buffer StoredBytes::restore() {
  MutexLock lock(mutex_);
  if (!failure_.empty()) {
    throw CheckpointError("spillarena: this stashed tensor's restore failed already (" + failure_ +
                          "); run forward again for a new graph");
  }
  if (restored_ || !entry_) throw CheckpointError(kAlreadyRestored);
  try {
    Buffer bytes = chain_->restore(entry_);
    restored_ = true;
    return bytes;
  } catch (const std::exception& e) {
    failure_ = e.what();
    throw;
  }
}

void StoredBytes::prefetch() {
  MutexLock lock(mutex_);
  if (!entry_ || restored_ || !failure_.empty()) return;
  MutexLock entry_lock(entry_->mutex);
  chain_->prefetch(*entry_);
}

void StoredBytes::free() {
  MutexLock lock(mutex_);
  entry_.reset();
}

bool StoredBytes::restored() const {
  MutexLock lock(mutex_);
  return restored_;
}

}  // namespace spill::detail
