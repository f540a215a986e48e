// The C++ front end's CopyEngine: copies on a side stream of the tensor's device through c10's
// device-generic stream/event interfaces (nothing here names CUDA), device memory from the
// device's caching allocator, pinned host memory from its host allocator. See Note [Accelerator
// copies] in src/torch_layer/stream_engine.cc.
//
//   std::shared_ptr<spill::detail::CopyEngine> engine = spill::detail::engine_for_inputs();
//   bool device_path = spill::detail::is_accelerator_input(t);
#pragma once

#include <torch/torch.h>

#include <memory>

#include "core/stash/copy_engine.h"

namespace spill::detail {

// The engine for the stash's accelerator inputs: the override while a test installed one.
// Held by whoever still has copies to make with it.
std::shared_ptr<CopyEngine> engine_for_inputs();
// True when `t` takes the accelerator path: on a device, or on the CPU under an override.
bool is_accelerator_input(const torch::Tensor& t);

}  // namespace spill::detail
