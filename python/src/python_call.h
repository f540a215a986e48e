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

// Runs `release` (which may take the GIL itself: torch's DLPack deleter does) unless the
// interpreter is ending, when what it would release is left to the OS. It does not take the GIL.
void unless_python_closed(void (*release)(void*), void* object);

// spillarena._C._close_python, registered with atexit by spillarena/__init__.py: from then on no
// PythonCall takes the GIL; it waits, the GIL let go, for those already in.
PyObject* close_python(PyObject*, PyObject*);

}  // namespace spillarena_python
