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
#include <string>
#include <vector>

#include "buffer.h"
#include "core/os/mutex.h"
#include "stash_entry.h"

namespace spill::detail {

class Chain;

// What a second restore() of one stored tensor says, in every stash (Python's in-memory and
// per-file stashes quote it through the binding's ALREADY_RESTORED).
extern const char* const kAlreadyRestored;

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
  StoredBytes(StoredBytes&& other) noexcept;  // `other` not in use on another thread
  StoredBytes& operator=(StoredBytes&&) = delete;

  // The bytes, once. CheckpointError after restore() or free(), and, in autograd's words, for
  // an input changed in place since store() (StashInput::changed_in_place). Called again after
  // a restore that failed (that refusal, an IoError, an IntegrityError, a front end's error):
  // CheckpointError quoting the first failure, not "already restored". The region stays until
  // free() or the handle goes.
  Buffer restore();
  void prefetch();  // starts bringing them back; nothing after restore() or free()
  void free();      // an unrestored region goes back now
  bool restored() const;

 private:
  StoredBytes(std::shared_ptr<Chain> chain, EntryPtr entry);

  mutable Mutex mutex_;
  std::shared_ptr<Chain> chain_ GUARDED_BY(mutex_);
  EntryPtr entry_ GUARDED_BY(mutex_);
  bool restored_ GUARDED_BY(mutex_) = false;
  // The first restore's failure, as text: an exception_ptr to a front end's error (a Python
  // exception, its traceback holding this handle) would make a cycle no collector sees.
  std::string failure_ GUARDED_BY(mutex_);
};

}  // namespace spill::detail
