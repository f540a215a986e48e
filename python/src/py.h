// The few pieces of CPython's limited API the extension is written with (Note [One file for every
// CPython]): an owned reference, a Python error carried as a C++ exception, the GIL let go and
// taken, a function's positional arguments, and C++ objects held by Python as capsules.
//
//   PyObject* stats(PyObject*, PyObject* args) {
//     return guarded([&] {
//       const Args a(args, 1, "_arena_stats");
//       spill::SpillArena& arena = held<spill::SpillArena>(a[0]);
//       return Ref::steal(PyLong_FromUnsignedLongLong(arena.stats().capacity_bytes));
//     });
//   }
#pragma once

#ifndef Py_LIMITED_API
#error "the extension is built for CPython's limited API (python/CMakeLists.txt defines it)"
#endif
#include <Python.h>

#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "spill/error.h"

namespace spillarena_python {

// An owned reference (Py_XDECREF when it goes). steal() takes a new reference from the C API and
// turns its NULL into PythonError; borrow() takes one more reference to a borrowed one.
class Ref {
 public:
  Ref() = default;
  static Ref steal(PyObject* o);
  static Ref borrow(PyObject* o) {
    Py_XINCREF(o);
    return Ref(o);
  }
  Ref(const Ref& other) : p_(other.p_) { Py_XINCREF(p_); }
  Ref(Ref&& other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  Ref& operator=(Ref other) noexcept {
    std::swap(p_, other.p_);
    return *this;
  }
  ~Ref() { Py_XDECREF(p_); }

  PyObject* get() const { return p_; }
  PyObject* release() { return std::exchange(p_, nullptr); }
  explicit operator bool() const { return p_ != nullptr; }

  Ref attr(const char* name) const { return steal(PyObject_GetAttrString(p_, name)); }
  // Calls the object with positional arguments (each a PyObject*).
  template <class... A>
  Ref operator()(A... args) const {
    return steal(PyObject_CallFunctionObjArgs(p_, static_cast<PyObject*>(args)..., nullptr));
  }

 private:
  explicit Ref(PyObject* p) : p_(p) {}
  PyObject* p_ = nullptr;
};

// Note [Python errors cross C++ as exceptions]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A C API call that fails leaves an exception set in the interpreter. PythonError takes it out
// (PyErr_Fetch) so it can travel like any C++ exception — through the stash, from a stash thread
// that made a device copy to the training thread that waits for it — and guarded() puts it back
// when the call returns to Python: torch's OutOfMemoryError raised by a device allocation
// reaches the user as itself. The fetched objects are released with the GIL taken, on whatever
// thread lets go of the last copy (never once the interpreter ends: python_call.h).
class PythonError : public std::exception {
 public:
  PythonError();  // takes the error set now (there must be one)
  const char* what() const noexcept override { return "a Python exception"; }
  void restore() const;  // sets it again; once

 private:
  struct Fetched;
  std::shared_ptr<Fetched> fetched_;
};

inline Ref Ref::steal(PyObject* o) {
  if (o == nullptr) throw PythonError();
  return Ref(o);
}

// Note [Only a bad argument becomes another error]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A value from Python is checked by calling into it (__index__, __float__, __fspath__, __len__,
// __repr__), and what that raises says either "this argument is wrong" or something else
// altogether: the user pressed Ctrl-C (KeyboardInterrupt from whatever ran then), the interpreter
// ran out of memory, a SystemExit, a bug in the argument's own code. Only the first may become
// spillarena's InvalidArgumentError naming the field; turning the others into it once made a
// KeyboardInterrupt during SpillArena(...) read as "capacity_bytes must be an integer" (issue
// 49). So the binding never clears an error unasked: a failed call into Python goes through
// clear_bad_argument(), which clears TypeError, ValueError and OverflowError (subclasses
// included: UnicodeEncodeError is a ValueError) and throws anything else as PythonError, which
// reaches the caller as itself (Note [Python errors cross C++ as exceptions]).
inline void clear_bad_argument() {
  if (PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_ValueError) ||
      PyErr_ExceptionMatches(PyExc_OverflowError)) {
    PyErr_Clear();
    return;
  }
  throw PythonError();
}

// Whether `o` has the attribute `name`; unlike PyObject_HasAttrString, an error other than
// AttributeError raised while looking is not swallowed (Note [Only a bad argument becomes
// another error]).
inline bool has_attribute(PyObject* o, const char* name) {
  PyObject* value = PyObject_GetAttrString(o, name);
  if (value != nullptr) return static_cast<bool>(Ref::steal(value));
  if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
    PyErr_Clear();
  } else {
    clear_bad_argument();
  }
  return false;
}

// Raises e as the spillarena.errors class of its type, with its fields (errors_binding.cc).
void raise_in_python(const spill::Error& e);

// Runs `body` (returning a Ref) for a function Python called: a C++ exception becomes the
// matching Python one and nullptr, as the C API expects.
template <class Body>
PyObject* guarded(Body&& body) noexcept {
  try {
    return body().release();
  } catch (const PythonError& e) {
    e.restore();
  } catch (const spill::Error& e) {
    raise_in_python(e);
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "spillarena: an unknown C++ exception");
  }
  return nullptr;
}

// The GIL let go for a scope (the arena's mutex, disk I/O, waits for the stash's threads).
class Unlocked {
 public:
  Unlocked() : state_(PyEval_SaveThread()) {}
  ~Unlocked() { PyEval_RestoreThread(state_); }
  Unlocked(const Unlocked&) = delete;
  Unlocked& operator=(const Unlocked&) = delete;

 private:
  PyThreadState* state_;
};

// The exception set when made (if any) is set again when destroyed: code run in between starts
// with none and leaves none behind. With the GIL, made and destroyed on one thread.
class KeptError {
 public:
  KeptError() { PyErr_Fetch(&type_, &value_, &traceback_); }
  ~KeptError() {
    if (type_ != nullptr) PyErr_Restore(type_, value_, traceback_);
  }
  KeptError(const KeptError&) = delete;
  KeptError& operator=(const KeptError&) = delete;

 private:
  PyObject* type_ = nullptr;
  PyObject* value_ = nullptr;
  PyObject* traceback_ = nullptr;
};

// A function's positional arguments, their number checked.
class Args {
 public:
  Args(PyObject* args, Py_ssize_t count, const char* function) : args_(args) {
    if (PyTuple_Size(args) != count) {
      throw spill::InvalidArgumentError("spillarena: " + std::string(function) + " takes " +
                                        std::to_string(count) + " arguments");
    }
  }
  PyObject* operator[](Py_ssize_t i) const { return PyTuple_GetItem(args_, i); }

 private:
  PyObject* args_;
};

// Note [C++ objects Python holds]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An arena, a chain, a stored input and a per-file file reach Python as capsules named after
// their type; the Python classes over them (spillarena.SpillArena, chain.py's Chain, Stored)
// hold one each. When Python drops a capsule, its object is destroyed with the GIL let go: a
// chain's destructor joins the stash's progress thread and an entry's waits for its I/O, and
// those threads may be waiting for the GIL (Note [Letting go of the stash without the GIL]).
template <class T>
struct CapsuleName;

template <class T>
Ref hold(T object) {
  auto* held = new T(std::move(object));
  PyObject* capsule = PyCapsule_New(held, CapsuleName<T>::value, [](PyObject* c) {
    // A capsule may die while an exception propagates; what the object's destructor does in
    // Python (a device copy's synchronize) must neither see nor swallow it.
    const KeptError kept;
    auto* p = static_cast<T*>(PyCapsule_GetPointer(c, CapsuleName<T>::value));
    Unlocked unlocked;
    delete p;
  });
  if (capsule == nullptr) delete held;
  return Ref::steal(capsule);
}

template <class T>
T& held(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, CapsuleName<T>::value)) {
    throw spill::InvalidArgumentError(std::string("spillarena: expected a handle of ") +
                                      CapsuleName<T>::value);
  }
  return *static_cast<T*>(PyCapsule_GetPointer(capsule, CapsuleName<T>::value));
}

// The module's functions, by area (module.cc gathers them).
void add_function(const char* name, PyCFunction function, int flags, const char* doc);
void add_errors();
void add_arena();
void add_stash();
void add_per_file();
// Module attributes set at import (constants).
void add_constant(const char* name, Ref value);

}  // namespace spillarena_python
