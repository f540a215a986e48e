#include "capsules.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "dlpack_abi.h"
#include "python_call.h"
#include "spill/error.h"

namespace spillarena_python {
namespace {

constexpr const char* kFresh = "dltensor";      // DLPack's name for a capsule not yet used
constexpr const char* kUsed = "used_dltensor";  // ... and for one a consumer took

[[noreturn]] void refuse(const std::string& why) {
  throw spill::InvalidArgumentError(
      "spillarena: expected the DLPack capsule of a 1-D uint8 "
      "contiguous tensor (torch.utils.dlpack.to_dlpack); " +
      why);
}

// What a capsule of ours owns: the buffer and the one dimension of its shape.
struct Held {
  spill::detail::Buffer buffer;
  std::int64_t shape[1];
  DLManagedTensor managed;
};

void delete_held(DLManagedTensor* m) { delete static_cast<Held*>(m->manager_ctx); }

}  // namespace

spill::detail::Buffer buffer_of(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kFresh)) refuse("got something else, or a used capsule");
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kFresh));
  const DLTensor& t = m->dl_tensor;
  if (t.ndim != 1 || t.dtype.code != kDLUInt || t.dtype.bits != 8 || t.dtype.lanes != 1 ||
      (t.strides != nullptr && t.shape[0] > 1 && t.strides[0] != 1)) {
    refuse("got another shape, dtype or layout");
  }
  if (PyCapsule_SetName(capsule, kUsed) != 0) throw PythonError();
  // The stash's threads let go of the tensor too: Note [No Python once the interpreter ends].
  std::shared_ptr<void> owner(m, [](void* p) {
    unless_python_closed(
        [](void* q) {
          auto* managed = static_cast<DLManagedTensor*>(q);
          if (managed->deleter != nullptr) managed->deleter(managed);
        },
        p);
  });
  return spill::detail::Buffer(
      static_cast<char*>(t.data) + t.byte_offset, static_cast<std::uint64_t>(t.shape[0]),
      spill::detail::Device{t.device.device_type, t.device.device_id}, std::move(owner));
}

Ref capsule_of(const spill::detail::Buffer& b) {
  auto* held = new Held{b, {static_cast<std::int64_t>(b.bytes())}, {}};
  DLTensor& t = held->managed.dl_tensor;
  t.data = b.data();
  t.device = DLDevice{b.device().type == 0 ? kDLCPU : b.device().type,
                      b.device().type == 0 ? 0 : b.device().index};
  t.ndim = 1;
  t.dtype = DLDataType{kDLUInt, 8, 1};
  t.shape = held->shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  held->managed.manager_ctx = held;
  held->managed.deleter = delete_held;
  PyObject* capsule = PyCapsule_New(&held->managed, kFresh, [](PyObject* c) {
    if (!PyCapsule_IsValid(c, kFresh)) return;  // consumed: the tensor owns it now
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, kFresh));
    m->deleter(m);
  });
  if (capsule == nullptr) delete held;
  return Ref::steal(capsule);
}

}  // namespace spillarena_python
