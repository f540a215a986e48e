#include "device_engine.h"

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <utility>

#include "capsules.h"

namespace spillarena_python {
namespace {

namespace py = pybind11;
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

py::object device_copies() { return py::module_::import("spillarena.device_copies"); }

// A Python copy (device_copies.Copy): its methods under the GIL; released under it too.
class PythonCopy final : public spill::detail::Copy {
 public:
  explicit PythonCopy(py::object copy) : copy_(new py::object(std::move(copy))) {}
  ~PythonCopy() override {
    py::gil_scoped_acquire gil;
    delete copy_;
  }
  bool done() const override {
    py::gil_scoped_acquire gil;
    return copy_->attr("done")().cast<bool>();
  }
  void synchronize() const override {
    py::gil_scoped_acquire gil;
    copy_->attr("synchronize")();
  }
  void order_current_stream() override {
    py::gil_scoped_acquire gil;
    copy_->attr("order_current_stream")();
  }

 private:
  py::object* copy_;  // a pointer: destroyed under the GIL, whatever thread lets go
};

class PythonEngine final : public spill::detail::CopyEngine {
 public:
  CopyPtr to_host(const Buffer& source, std::uint64_t offset, std::uint64_t bytes,
                  const Buffer& host) override {
    py::gil_scoped_acquire gil;
    return copy(device_copies().attr("copy")(capsule_of(source.slice(offset, bytes)),
                                             capsule_of(host), source.device().type,
                                             source.device().index));
  }
  CopyPtr to_device(const Buffer& host, const Buffer& dest, std::uint64_t offset) override {
    py::gil_scoped_acquire gil;
    return copy(device_copies().attr("copy")(capsule_of(host),
                                             capsule_of(dest.slice(offset, host.bytes())),
                                             dest.device().type, dest.device().index));
  }
  CopyPtr marker(const Device& device) override {
    py::gil_scoped_acquire gil;
    return copy(device_copies().attr("marker")(device.type, device.index));
  }
  Buffer empty(const Device& device, std::uint64_t bytes,
               const spill::detail::ExplainOutOfMemory& explain) override {
    py::gil_scoped_acquire gil;
    return buffer_of(
        device_copies().attr("empty")(device.type, device.index, bytes, py::cpp_function(explain)));
  }
  Buffer pinned_host(std::uint64_t bytes) override {
    py::gil_scoped_acquire gil;
    py::object capsule = device_copies().attr("pinned_host")(bytes);
    return capsule.is_none() ? Buffer() : buffer_of(capsule);
  }

 private:
  static CopyPtr copy(py::object c) { return std::make_shared<PythonCopy>(std::move(c)); }
};

}  // namespace

std::shared_ptr<spill::detail::CopyEngine> python_engine_for_inputs() {
  static const auto real = std::make_shared<PythonEngine>();
  if (auto engine = spill::detail::CopyEngine::override_engine()) return engine;
  return real;
}

}  // namespace spillarena_python
