#include "tensor_bytes.h"

#include <cstdint>
#include <memory>

namespace spill::detail {

Device device_of(const torch::Device& device) {
  return Device{static_cast<std::int32_t>(device.type()), device.index()};
}

torch::Device torch_device(const Device& device) {
  return torch::Device(static_cast<c10::DeviceType>(device.type),
                       static_cast<c10::DeviceIndex>(device.index));
}

Buffer bytes_of(const torch::Tensor& t) {
  return Buffer(t.data_ptr(), static_cast<std::uint64_t>(t.nbytes()), device_of(t.device()),
                std::make_shared<torch::Tensor>(t));
}

torch::Tensor tensor_of(const Buffer& b) {
  std::shared_ptr<void> owner = b.owner();
  return torch::from_blob(
      b.data(), {static_cast<std::int64_t>(b.bytes())}, [owner](void*) mutable { owner.reset(); },
      torch::TensorOptions().dtype(torch::kUInt8).device(torch_device(b.device())));
}

}  // namespace spill::detail
