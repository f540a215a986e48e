// spillarena._C: the C++ half of the Python package. It links no torch (Note [One wheel for every
// torch] in python/CMakeLists.txt) and uses CPython's limited API only (Note [One file for every
// CPython]); spillarena/__init__.py checks the torch version first.
#include <utility>
#include <vector>

#include "binding.h"
#include "python_call.h"

namespace spillarena_python {
namespace {

// Note [One file for every CPython]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A module built against CPython's full API works with the one minor version it was built for,
// so a wheel was one file per Python (cp311-cp311). This one is built with Py_LIMITED_API =
// 3.10 and tagged cp310-abi3: one file for CPython 3.10 and every later release
// (scripts/build_wheel.sh checks it with abi3audit). pybind11 cannot build such a module, and
// nanobind's abi3 needs 3.12, so the binding is written with the few pieces py.h holds: owned
// references, Python errors as C++ exceptions, the GIL let go, capsules for the C++ objects
// Python holds. The classes a user sees are Python classes over those capsules
// (spillarena/arena.py, chain.py, arena_stash.py), which is also where repr, properties and copying
// live.
std::vector<PyMethodDef>& functions() {
  static std::vector<PyMethodDef> all;
  return all;
}

std::vector<std::pair<const char*, Ref>>& constants() {
  static std::vector<std::pair<const char*, Ref>> all;
  return all;
}

PyObject* make_module() {
  return guarded([] {
    add_errors();
    add_arena();
    add_stash();
    add_per_file();
    add_function("_close_python", close_python, METH_NOARGS,
                 "Called at exit (atexit): the stash's threads no longer enter Python.");
    functions().push_back({nullptr, nullptr, 0, nullptr});
    static PyModuleDef definition = {
        PyModuleDef_HEAD_INIT,
        "_C",
        "spillarena C++ core: the arena, its stash and the error types",
        -1,
        functions().data(),
        nullptr,
        nullptr,
        nullptr,
        nullptr};
    Ref module = Ref::steal(PyModule_Create(&definition));
    for (auto& [name, value] : constants()) {
      if (PyModule_AddObjectRef(module.get(), name, value.get()) != 0) throw PythonError();
    }
    constants().clear();
    return module;
  });
}

}  // namespace

void add_function(const char* name, PyCFunction function, int flags, const char* doc) {
  functions().push_back({name, function, flags, doc});
}

void add_constant(const char* name, Ref value) { constants().emplace_back(name, std::move(value)); }

// ---------------------------------------------------------------------------------------------
// py.h and binding.h
// ---------------------------------------------------------------------------------------------

struct PythonError::Fetched {  // the last copy may go on a stash thread
  AnyThreadRef type;
  AnyThreadRef value;
  AnyThreadRef traceback;
};

PythonError::PythonError() : fetched_(std::make_shared<Fetched>()) {
  PyObject* fetched[3] = {nullptr, nullptr, nullptr};
  PyErr_Fetch(&fetched[0], &fetched[1], &fetched[2]);
  if (fetched[0] == nullptr) {
    fetched[0] = Py_NewRef(PyExc_SystemError);
    fetched[1] = PyUnicode_FromString("spillarena: a C API call failed without an error");
  }
  fetched_->type = AnyThreadRef::adopt(fetched[0]);
  fetched_->value = AnyThreadRef::adopt(fetched[1]);
  fetched_->traceback = AnyThreadRef::adopt(fetched[2]);
}

void PythonError::restore() const {
  PyErr_Restore(Py_XNewRef(fetched_->type.get()), Py_XNewRef(fetched_->value.get()),
                Py_XNewRef(fetched_->traceback.get()));
}

std::string repr(PyObject* value) {
  // Note [Only a bad argument becomes another error]: a __repr__ that raises TypeError or
  // ValueError (a lone surrogate UTF-8 cannot encode among them) still leaves a message to give.
  PyObject* text = PyObject_Repr(value);
  if (text == nullptr) {
    clear_bad_argument();
    return "<unprintable object>";
  }
  const Ref owned = Ref::steal(text);
  Py_ssize_t size = 0;
  const char* bytes = PyUnicode_AsUTF8AndSize(text, &size);
  if (bytes == nullptr) {
    clear_bad_argument();
    return "<unprintable object>";
  }
  return std::string(bytes, static_cast<std::size_t>(size));
}

std::string utf8(PyObject* value, const std::string& field) {
  Py_ssize_t size = 0;
  const char* bytes = PyUnicode_Check(value) ? PyUnicode_AsUTF8AndSize(value, &size) : nullptr;
  if (bytes == nullptr) {
    if (PyUnicode_Check(value)) clear_bad_argument();  // else no call was made, nothing is set
    throw_bad_value(field, PyUnicode_Check(value) ? "a string UTF-8 can encode" : "a string",
                    value);
  }
  return std::string(bytes, static_cast<std::size_t>(size));
}

std::string path_from_python(PyObject* v, const std::string& field) {
  if (!PyUnicode_Check(v) && !PyBytes_Check(v) && !has_attribute(v, "__fspath__")) {
    throw_bad_value(field, "a string, bytes or path", v);
  }
  const Ref os = Ref::steal(PyImport_ImportModule("os"));
  PyObject* encoded = PyObject_CallMethod(os.get(), "fsencode", "O", v);
  if (encoded == nullptr) {
    clear_bad_argument();  // a __fspath__ that returned neither str nor bytes: TypeError
    throw_bad_value(field, "a string, bytes or path", v);
  }
  const Ref owned = Ref::steal(encoded);
  char* bytes = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(encoded, &bytes, &size) != 0) throw PythonError();
  return std::string(bytes, static_cast<std::size_t>(size));
}

}  // namespace spillarena_python

PyMODINIT_FUNC PyInit__C() { return spillarena_python::make_module(); }
