#include "device_engine.h"

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "binding.h"
#include "capsules.h"
#include "python_call.h"

namespace spillarena_python {

template <>
struct CapsuleName<spill::detail::ExplainOutOfMemory> {
  static constexpr const char* value = "spillarena.explain";
};

namespace {

using spill::detail::Buffer;
using spill::detail::CopyPtr;
using spill::detail::Device;

// Note [Device copies through Python]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The stash's device path needs four things of the device: a copy each way on a side stream,
// ordered after the current stream and leaving an event; a marker of the current stream (io =
// gds); device memory from the caching allocator; pinned host memory for the pool. LibTorch's
// C++ front end does them through c10 (src/torch_layer/stream_engine.cc). This extension links
// no torch, so it asks torch's Python API (python/spillarena/device_copies.py), passing buffers
// as DLPack capsules; each call takes the GIL, which the training thread gives up whenever it
// waits in the stash. The copies are the same torch calls the C++ engine makes, the same
// side-stream protocol (Note [Accelerator copies]), so the two front ends agree.

Ref device_copies(const char* function) {
  return Ref::steal(PyImport_ImportModule("spillarena.device_copies")).attr(function);
}

[[noreturn]] void python_is_closed() {
  throw std::runtime_error("spillarena: the interpreter is ending; no device copy is started");
}

Ref number(std::int64_t v) { return Convert<std::int64_t>::to_python(v); }

// A Python copy (device_copies.Copy): its methods under the GIL; released under it too.
class PythonCopy final : public spill::detail::Copy {
 public:
  explicit PythonCopy(Ref copy) : copy_(AnyThreadRef::adopt(copy.release())) {}
  bool done() const override {
    PythonCall call;
    if (!call) return true;
    const Ref answer = Ref::borrow(copy_.get()).attr("done")();
    const int done = PyObject_IsTrue(answer.get());
    if (done < 0) throw PythonError();
    return done != 0;
  }
  void synchronize() const override {
    PythonCall call;
    if (call) Ref::borrow(copy_.get()).attr("synchronize")();
  }
  void order_current_stream() override {
    PythonCall call;
    if (call) Ref::borrow(copy_.get()).attr("order_current_stream")();
  }

 private:
  AnyThreadRef copy_;  // released under the GIL, whatever thread lets go
};

// explain(cause) as a Python callable, for device_copies.empty's out-of-memory message.
PyObject* call_explain(PyObject* self, PyObject* cause) {
  return guarded([&] {
    const auto& explain = held<spill::detail::ExplainOutOfMemory>(self);
    return message_to_python(explain(utf8(cause, "explain: cause")));
  });
}

PyMethodDef explain_definition = {"explain", call_explain, METH_O, nullptr};

Ref python_callable(spill::detail::ExplainOutOfMemory explain) {
  const Ref function = hold(std::move(explain));
  return Ref::steal(PyCFunction_NewEx(&explain_definition, function.get(), nullptr));
}

class PythonEngine final : public spill::detail::CopyEngine {
 public:
  CopyPtr to_host(const Buffer& source, std::uint64_t offset, std::uint64_t bytes,
                  const Buffer& host) override {
    PythonCall call;
    if (!call) python_is_closed();
    return copy(source.slice(offset, bytes), host, source.device());
  }
  CopyPtr to_device(const Buffer& host, const Buffer& dest, std::uint64_t offset) override {
    PythonCall call;
    if (!call) python_is_closed();
    return copy(host, dest.slice(offset, host.bytes()), dest.device());
  }
  CopyPtr marker(const Device& device) override {
    PythonCall call;
    if (!call) python_is_closed();
    return wrap(device_copies("marker")(number(device.type).get(), number(device.index).get()));
  }
  Buffer empty(const Device& device, std::uint64_t bytes,
               const spill::detail::ExplainOutOfMemory& explain) override {
    PythonCall call;
    if (!call) python_is_closed();
    const Ref capsule = device_copies("empty")(
        number(device.type).get(), number(device.index).get(),
        Convert<std::uint64_t>::to_python(bytes).get(), python_callable(explain).get());
    return buffer_of(capsule.get());
  }
  Buffer pinned_host(std::uint64_t bytes) override {
    PythonCall call;
    if (!call) return Buffer();
    const Ref capsule =
        device_copies("pinned_host")(Convert<std::uint64_t>::to_python(bytes).get());
    return capsule.get() == Py_None ? Buffer() : buffer_of(capsule.get());
  }

 private:
  static CopyPtr copy(const Buffer& from, const Buffer& to, const Device& device) {
    return wrap(device_copies("copy")(capsule_of(from).get(), capsule_of(to).get(),
                                      number(device.type).get(), number(device.index).get()));
  }
  static CopyPtr wrap(Ref c) { return std::make_shared<PythonCopy>(std::move(c)); }
};

}  // namespace

std::shared_ptr<spill::detail::CopyEngine> python_engine_for_inputs() {
  static const auto real = std::make_shared<PythonEngine>();
  if (auto engine = spill::detail::CopyEngine::override_engine()) return engine;
  return real;
}

}  // namespace spillarena_python
