#include "device_engine.h"

#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
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

// Note [No Python once the interpreter ends]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A program may end with a device input's copy in flight (a graph kept alive by a traceback).
// A stash thread that then takes the GIL while the interpreter finalizes is ended inside our
// frames (SIGABRT), and one that releases a Python object crashes the process (SIGSEGV): both
// seen, one run in three. So the stash's threads enter Python only through PythonCall, and an
// atexit hook (registered at import, run before finalization, with the GIL) closes the door:
// no call starts after it, and it waits, the GIL released, for the calls already entered or
// waiting for the GIL to finish. From then on a Python copy counts as done and its object is
// left to the OS with the rest of the process's memory: the bytes no longer matter, an orderly
// exit does.
std::atomic<bool> python_closed{false};
std::atomic<int> python_calls{0};  // entered or waiting for the GIL

class PythonCall {
 public:
  PythonCall() {
    python_calls.fetch_add(1);  // before the check: close_python() then waits for this call
    if (!python_closed.load()) gil_.emplace();
  }
  ~PythonCall() {
    gil_.reset();
    python_calls.fetch_sub(1);
  }
  PythonCall(const PythonCall&) = delete;
  PythonCall& operator=(const PythonCall&) = delete;
  explicit operator bool() const { return gil_.has_value(); }

 private:
  std::optional<py::gil_scoped_acquire> gil_;
};

[[noreturn]] void python_is_closed() {
  throw std::runtime_error("spillarena: the interpreter is ending; no device copy is started");
}

// A Python copy (device_copies.Copy): its methods under the GIL; released under it too.
class PythonCopy final : public spill::detail::Copy {
 public:
  explicit PythonCopy(py::object copy) : copy_(new py::object(std::move(copy))) {}
  ~PythonCopy() override {
    PythonCall call;
    if (call) delete copy_;  // else left to the OS: Note [No Python once the interpreter ends]
  }
  bool done() const override {
    PythonCall call;
    return !call || copy_->attr("done")().cast<bool>();
  }
  void synchronize() const override {
    PythonCall call;
    if (call) copy_->attr("synchronize")();
  }
  void order_current_stream() override {
    PythonCall call;
    if (call) copy_->attr("order_current_stream")();
  }

 private:
  py::object* copy_;  // a pointer: destroyed under the GIL, whatever thread lets go
};

class PythonEngine final : public spill::detail::CopyEngine {
 public:
  CopyPtr to_host(const Buffer& source, std::uint64_t offset, std::uint64_t bytes,
                  const Buffer& host) override {
    PythonCall call;
    if (!call) python_is_closed();
    return copy(device_copies().attr("copy")(capsule_of(source.slice(offset, bytes)),
                                             capsule_of(host), source.device().type,
                                             source.device().index));
  }
  CopyPtr to_device(const Buffer& host, const Buffer& dest, std::uint64_t offset) override {
    PythonCall call;
    if (!call) python_is_closed();
    return copy(device_copies().attr("copy")(capsule_of(host),
                                             capsule_of(dest.slice(offset, host.bytes())),
                                             dest.device().type, dest.device().index));
  }
  CopyPtr marker(const Device& device) override {
    PythonCall call;
    if (!call) python_is_closed();
    return copy(device_copies().attr("marker")(device.type, device.index));
  }
  Buffer empty(const Device& device, std::uint64_t bytes,
               const spill::detail::ExplainOutOfMemory& explain) override {
    PythonCall call;
    if (!call) python_is_closed();
    return buffer_of(
        device_copies().attr("empty")(device.type, device.index, bytes, py::cpp_function(explain)));
  }
  Buffer pinned_host(std::uint64_t bytes) override {
    PythonCall call;
    if (!call) return Buffer();
    py::object capsule = device_copies().attr("pinned_host")(bytes);
    return capsule.is_none() ? Buffer() : buffer_of(capsule);
  }

 private:
  static CopyPtr copy(py::object c) { return std::make_shared<PythonCopy>(std::move(c)); }
};

}  // namespace

void close_python_at_exit() {
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    python_closed.store(true);
    py::gil_scoped_release release;
    while (python_calls.load() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }));
}

std::shared_ptr<spill::detail::CopyEngine> python_engine_for_inputs() {
  static const auto real = std::make_shared<PythonEngine>();
  if (auto engine = spill::detail::CopyEngine::override_engine()) return engine;
  return real;
}

}  // namespace spillarena_python
