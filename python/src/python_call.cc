#include "python_call.h"

#include <atomic>
#include <chrono>
#include <thread>

namespace spillarena_python {
namespace {

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
// exit does. The same door covers a stash thread releasing torch's tensors (the DLPack
// deleter takes the GIL itself): during finalization that ended the process with
// std::terminate.
std::atomic<bool> python_closed{false};
std::atomic<int> python_calls{0};  // entered or waiting for the GIL

}  // namespace

PythonCall::PythonCall() {
  python_calls.fetch_add(1);  // before the check: close_python() then waits for this call
  if (python_closed.load()) return;
  gil_ = PyGILState_Ensure();
  PyErr_Fetch(&kept_[0], &kept_[1], &kept_[2]);
}

PythonCall::~PythonCall() {
  if (gil_) {
    PyErr_Clear();  // a call's own error was taken (PythonError) or is not ours to leave
    if (kept_[0] != nullptr) PyErr_Restore(kept_[0], kept_[1], kept_[2]);
    PyGILState_Release(*gil_);
  }
  python_calls.fetch_sub(1);
}

AnyThreadRef::~AnyThreadRef() {
  if (p_ == nullptr) return;
  PythonCall call;
  if (call) Py_DECREF(p_);  // else left to the OS: Note [No Python once the interpreter ends]
}

void unless_python_closed(void (*release)(void*), void* object) {
  python_calls.fetch_add(1);
  if (!python_closed.load()) release(object);  // else: Note [No Python once the interpreter ends]
  python_calls.fetch_sub(1);
}

PyObject* close_python(PyObject*, PyObject*) {
  python_closed.store(true);
  PyThreadState* state = PyEval_SaveThread();
  while (python_calls.load() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  PyEval_RestoreThread(state);
  Py_RETURN_NONE;
}

}  // namespace spillarena_python
