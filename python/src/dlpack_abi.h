// The DLPack exchange structs (the unversioned ABI, DLPack 0.x: what torch.utils.dlpack's
// to_dlpack gives and from_dlpack takes in every torch release since 1.x), declared from the
// published specification (https://dmlc.github.io/dlpack/latest/c_api.html). Tensors cross
// between torch and this extension only through these: Note [The stash moves bytes] in
// src/core/stash/buffer.cc.
//
//   auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
//   void* bytes = static_cast<char*>(m->dl_tensor.data) + m->dl_tensor.byte_offset;
#pragma once

#include <cstdint>

extern "C" {

struct DLDevice {
  std::int32_t device_type;  // kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLROCM = 10, ...
  std::int32_t device_id;
};

struct DLDataType {
  std::uint8_t code;  // kDLUInt = 1
  std::uint8_t bits;
  std::uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // nullptr: compact row-major
  std::uint64_t byte_offset;
};

struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

}  // extern "C"

namespace spillarena_python {
constexpr std::int32_t kDLCPU = 1;
constexpr std::uint8_t kDLUInt = 1;
}  // namespace spillarena_python
