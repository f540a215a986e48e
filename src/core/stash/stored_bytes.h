// The stash protocol both front ends call, torch-free: store a tensor's bytes in a chain, give
// them back once, refuse an input changed in place, and say which layout a restore rebuilds. A
// front end keeps only what its language must: tensor <-> bytes, the version counter behind
// StashInput::changed_in_place, its errors and warnings (Note [One stash protocol, two front
// ends] in stored_bytes.cc).
//
//   spill::detail::StoredBytes s = spill::detail::StoredBytes::store(chain, std::move(input));
//   const std::vector<int64_t> strides = spill::detail::strides_to_keep(sizes, strides_of_t);
//   spill::detail::Buffer bytes = s.restore();  // once: CheckpointError after restore or free
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "buffer.h"
#include "stash_entry.h"

namespace spill::detail {

class Chain;

// The strides a restore gives back: the input's own when they are a permutation of a contiguous
// layout other than the contiguous one (a transpose), none (contiguous) otherwise. Kernels choose
// their paths by strides, and bitwise gradients need the recomputation to take the forward's.
std::vector<std::int64_t> strides_to_keep(const std::vector<std::int64_t>& sizes,
                                          const std::vector<std::int64_t>& strides);

// One stored tensor's bytes in a chain, as a front end holds them. Any thread may call it; a
// mutex serialises them, so free() waits for a restore in flight and a second restore gets
// CheckpointError, never a freed entry.
class StoredBytes {
 public:
  // Links `input` after the last stored entry of `chain` (throwing, first, a failure of its
  // progress thread). The chain's notices are left for the front end to give its own way.
  static StoredBytes store(std::shared_ptr<Chain> chain, StashInput input);
  StoredBytes(StoredBytes&& other) noexcept;
  StoredBytes& operator=(StoredBytes&&) = delete;

  // The bytes, once. CheckpointError after restore() or free(), and, in autograd's words, for
  // an input changed in place since store() (StashInput::changed_in_place).
  Buffer restore();
  void prefetch();  // starts bringing them back; nothing after restore() or free()
  void free();      // an unrestored region goes back now
  bool restored() const;

 private:
  StoredBytes(std::shared_ptr<Chain> chain, EntryPtr entry);

  mutable std::mutex mutex_;  // guards the three below
  std::shared_ptr<Chain> chain_;
  EntryPtr entry_;
  bool restored_ = false;
};

}  // namespace spill::detail
