// Between LibTorch's tensors and the stash's Buffers (Note [The stash moves bytes] in
// src/core/stash/buffer.cc): the C++ front end's half of the conversion.
//
//   spill::detail::Buffer b = spill::detail::bytes_of(t.contiguous());  // keeps t alive
//   torch::Tensor u = spill::detail::tensor_of(b);   // uint8, b.bytes() long, on b's device
#pragma once

#include <torch/torch.h>

#include "core/stash/buffer.h"

namespace spill::detail {

Device device_of(const torch::Device& device);
torch::Device torch_device(const Device& device);

// The bytes of contiguous `t`, kept alive by a reference to it.
Buffer bytes_of(const torch::Tensor& t);
// A uint8 tensor over `b`'s bytes that keeps `b`'s owner alive.
torch::Tensor tensor_of(const Buffer& b);

}  // namespace spill::detail
