// The stash spill::checkpoint(arena, ...) uses: one per arena while any of its tensors is
// stashed, so consecutive layers form one chain for prefetching and keep_last. Internal (not
// installed): the checkpoint's arena form and the Python package (spillarena.shared_arena_stash,
// for its own checkpoint) reach it; C++ users call spill::checkpoint(arena, ...) or make a stash
// of their own (spill::make_arena_stash).
//
//   std::shared_ptr<spill::TensorStash> stash = spill::detail::shared_arena_stash(arena);
//   torch::Tensor y = spill::checkpoint(*stash, layer, x);  // the same chain as checkpoint(arena)
#pragma once

#include <memory>

#include "spill/tensor_stash.h"

namespace spill::detail {

// Made with the arena's stash options (set_stash_options) when no graph holds one; a shared
// stash already in use keeps the options it was made with.
std::shared_ptr<TensorStash> shared_arena_stash(const SpillArena& arena);

}  // namespace spill::detail
