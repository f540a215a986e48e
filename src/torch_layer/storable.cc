#include "storable.h"

#include <sstream>

#include "spill/error.h"

namespace spill::detail {

void check_storable(const torch::Tensor& tensor, const std::string& stash_name) {
  const bool dense = tensor.layout() == torch::kStrided && !tensor.is_nested();
  if (dense && !tensor.is_meta()) return;
  std::ostringstream text;
  text << "spill: the " << stash_name << " stash stores dense tensors with data; got a "
       << (tensor.is_nested() ? std::string("nested") : c10::str(tensor.layout())) << " tensor on "
       << tensor.device() << ". Make it dense (to_dense()) and give it data, or keep it with "
       << "make_in_memory_stash()";
  throw InvalidArgumentError(text.str());
}

}  // namespace spill::detail
