// Entering Python from the stash's own threads (a device copy made by torch, a Python object let
// go of), and the door that closes at interpreter exit (Note [No Python once the interpreter ends]
// in python/src/python_call.cc).
//
//   PythonCall call;                  // takes the GIL, unless the interpreter is ending
//   if (!call) return;                // it is: do without Python
//   Ref done = copy.attr("done")();
#pragma once

#include <Python.h>

#include <optional>
#include <utility>

namespace spillarena_python {

// Takes the GIL for a call into Python, unless the interpreter is ending. An exception already
// set on this thread (a capsule that dies while one propagates) is kept aside meanwhile.
class PythonCall {
 public:
  PythonCall();
  ~PythonCall();
  PythonCall(const PythonCall&) = delete;
  PythonCall& operator=(const PythonCall&) = delete;
  explicit operator bool() const { return gil_.has_value(); }

 private:
  std::optional<PyGILState_STATE> gil_;
  PyObject* kept_[3] = {nullptr, nullptr, nullptr};
};

// An owned reference that any thread may let go of: released with the GIL taken (a PythonCall),
// or left to the OS once the interpreter ends. Ref (py.h) is for code that holds the GIL; this
// is for what a stash thread may destroy last (a device copy, a fetched exception). The binding's
// one other owner: no Py_XDECREF at a call site.
class AnyThreadRef {
 public:
  AnyThreadRef() = default;
  // Takes over `owned`, a new reference (nullptr: none).
  static AnyThreadRef adopt(PyObject* owned) {
    AnyThreadRef r;
    r.p_ = owned;
    return r;
  }
  AnyThreadRef(AnyThreadRef&& other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  AnyThreadRef& operator=(AnyThreadRef other) noexcept {
    std::swap(p_, other.p_);
    return *this;
  }
  ~AnyThreadRef();
  PyObject* get() const { return p_; }

 private:
  PyObject* p_ = nullptr;
};

// Runs `release` (which may take the GIL itself: torch's DLPack deleter does) unless the
// interpreter is ending, when what it would release is left to the OS. It does not take the GIL.
void unless_python_closed(void (*release)(void*), void* object);

// spillarena._C._close_python, registered with atexit by spillarena/__init__.py: from then on no
// PythonCall takes the GIL; it waits, the GIL let go, for those already in.
PyObject* close_python(PyObject*, PyObject*);

}  // namespace spillarena_python
