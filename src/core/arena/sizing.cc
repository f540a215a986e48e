#include "spill/sizing.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/arena/arena_core.h"

#include "core/alloc/slab_allocator.h"
#include "core/os/platform.h"
#include "spill/arena.h"
#include "spill/error.h"
#include "spill/units.h"

namespace spill {
namespace {

std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, const char* what) {
  std::uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) {
    throw InvalidArgumentError(std::string("spill: ") + what + " overflows 64 bits (" +
                               std::to_string(a) + " x " + std::to_string(b) +
                               "); check the units of the shape");
  }
  return r;
}

void check_positive(std::uint64_t value, const char* name) {
  if (value == 0) {
    throw InvalidArgumentError(std::string("spill: bytes_for_layer_inputs: ") + name +
                               " is 0; every dimension must be at least 1");
  }
}

}  // namespace

std::uint64_t page_size_bytes() { return platform::capabilities().page_size_bytes; }

std::uint64_t bytes_for_layer_input(const ActivationShape& shape,
                                    std::uint64_t element_size_bytes) {
  check_positive(shape.batch, "batch");
  check_positive(shape.seq, "seq");
  check_positive(shape.hidden, "hidden");
  check_positive(element_size_bytes, "element size");
  std::uint64_t bytes = checked_mul(shape.batch, shape.seq, "batch x seq");
  bytes = checked_mul(bytes, shape.hidden, "batch x seq x hidden");
  bytes = checked_mul(bytes, element_size_bytes, "layer input bytes");
  return SlabAllocator::rounded_size(bytes, platform::capabilities().page_size_bytes);
}

std::uint64_t capacity_with_margin(std::uint64_t needed_bytes, double growth_margin) {
  if (!(growth_margin >= kMinGrowthMargin && growth_margin <= kMaxGrowthMargin)) {  // NaN too
    throw InvalidArgumentError("spill: capacity_with_margin: growth_margin = " +
                               format_real(growth_margin) + " is out of range; use 1 to 16");
  }
  const double wanted = std::ceil(static_cast<double>(needed_bytes) * growth_margin);
  const double most = static_cast<double>(kMaxCapacityBytes);
  return detail::round_to_pages(static_cast<std::uint64_t>(std::min(wanted, most)));
}

std::uint64_t bytes_for_layer_inputs(std::uint64_t layers, const ActivationShape& shape,
                                     std::uint64_t element_size_bytes) {
  check_positive(layers, "layers");
  return checked_mul(layers, bytes_for_layer_input(shape, element_size_bytes), "capacity");
}

}  // namespace spill
