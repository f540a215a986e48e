// The tensors a spilling stash can store: dense and strided, with storage on a real device.
// Sparse, nested and meta tensors get a typed error at store() instead of LibTorch's internal
// messages from deep inside a copy.
//
//   spill::detail::check_storable(tensor, "disk");   // throws spill::InvalidArgumentError
#pragma once

#include <torch/torch.h>

#include <string>

namespace spill::detail {

void check_storable(const torch::Tensor& tensor, const std::string& stash_name);

}  // namespace spill::detail
