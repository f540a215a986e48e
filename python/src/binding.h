// Shared pieces of the spillarena._C extension: the per-area bind functions called by module.cc
// and Convert<T> between field values and Python objects (structs as dicts by field name, made
// from these: fields.h):
//
//   py::object o = Convert<std::uint64_t>::to_python(1 << 30);
//   std::uint64_t n = Convert<std::uint64_t>::from_python(o, "capacity_bytes");  // checked
//
// A field of a new type needs a Convert<T> specialization (an enum: a spill::to_string for it).
#pragma once

#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "spill/error.h"

namespace spillarena_python {

namespace py = pybind11;

void bind_errors(py::module_& m);
void bind_arena(py::module_& m);
void bind_stash(py::module_& m);
void bind_per_file(py::module_& m);

// ---------------------------------------------------------------------------------------------
// Conversions between field values and Python objects
// ---------------------------------------------------------------------------------------------

[[noreturn]] inline void throw_bad_value(const std::string& field, const std::string& expected,
                                         py::handle value) {
  throw spill::InvalidArgumentError("spillarena: " + field + " must be " + expected + ", got " +
                                    py::repr(value).cast<std::string>());
}

template <class T, class Enable = void>
struct Convert;

template <>
struct Convert<bool> {
  static py::object to_python(bool v) { return py::bool_(v); }
  static bool from_python(py::handle v, const std::string& field) {
    if (!py::isinstance<py::bool_>(v)) throw_bad_value(field, "True or False", v);
    return v.cast<bool>();
  }
};

// Note [Numbers from Python are bounded before they reach C++]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A negative int cast to uint64 wraps to 2^64 - 1 and a float truncates; both once broke the CLI.
// Only an integer — a Python int or what operator.index accepts (numpy integers, integer 0-dim
// tensors), never bool or float — in [0, max] is accepted; anything else is an
// InvalidArgumentError naming the field.
template <class T>
struct Convert<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static py::object to_python(T v) { return py::int_(v); }
  static T from_python(py::handle v, const std::string& field) {
    const std::string expected = std::is_signed_v<T> ? "an integer" : "a non-negative integer";
    if (py::isinstance<py::bool_>(v) || !PyIndex_Check(v.ptr()))
      throw_bad_value(field, expected, v);
    PyObject* index = PyNumber_Index(v.ptr());
    if (index == nullptr) {
      PyErr_Clear();
      throw_bad_value(field, expected, v);
    }
    const py::int_ value = py::reinterpret_steal<py::int_>(index);
    const py::int_ low(std::numeric_limits<T>::min());
    const py::int_ high(std::numeric_limits<T>::max());
    if (value < low || value > high) throw_bad_value(field, expected + " that fits the field", v);
    return value.cast<T>();
  }
};

template <class T>
struct Convert<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  static py::object to_python(T v) { return py::float_(v); }
  static T from_python(py::handle v, const std::string& field) {
    if (py::isinstance<py::bool_>(v) ||
        !(py::isinstance<py::float_>(v) || py::isinstance<py::int_>(v))) {
      throw_bad_value(field, "a number", v);
    }
    const T value = v.cast<T>();
    if (!std::isfinite(value)) throw_bad_value(field, "a finite number", v);
    return value;
  }
};

// Note [Paths are bytes, as the OS sees them]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A Linux path is bytes, not necessarily UTF-8; Python spells a path it cannot decode as a str
// with surrogate escapes (os.fsdecode), which a plain str-to-std::string cast refuses with a
// raw UnicodeEncodeError, so such directories could not be used at all (issue 19). Strings
// cross the boundary the way the os module does: in through os.fsencode (str, bytes or
// os.PathLike), out through os.fsdecode, so os.fsencode(arena.directory) gives back the bytes.
inline py::str path_to_python(const std::string& v) {
  PyObject* text = PyUnicode_DecodeFSDefaultAndSize(v.data(), static_cast<Py_ssize_t>(v.size()));
  if (text == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(text);
}

// A message for people: UTF-8, with any other byte shown as \xNN (never an exception).
inline py::str message_to_python(const std::string& v) {
  PyObject* text =
      PyUnicode_DecodeUTF8(v.data(), static_cast<Py_ssize_t>(v.size()), "backslashreplace");
  if (text == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(text);
}

template <>
struct Convert<std::string> {
  static py::object to_python(const std::string& v) { return path_to_python(v); }
  static std::string from_python(py::handle v, const std::string& field) {
    // str, bytes or os.PathLike (pathlib.Path) for directories; see the Note above.
    if (!py::isinstance<py::str>(v) && !py::isinstance<py::bytes>(v) &&
        !py::hasattr(v, "__fspath__")) {
      throw_bad_value(field, "a string, bytes or path", v);
    }
    py::object encoded;
    try {
      encoded = py::module_::import("os").attr("fsencode")(v);
    } catch (py::error_already_set&) {
      throw_bad_value(field, "a string, bytes or path", v);
    }
    if (!py::isinstance<py::bytes>(encoded)) throw_bad_value(field, "a string, bytes or path", v);
    return encoded.cast<std::string>();
  }
};

// Note [An arena is shared by copies, never pickled]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An arena (and a stash over one) is a resource of this process, like an open file: its spill
// file has no name to reopen and its regions belong to this process's graphs. copy.copy and
// copy.deepcopy return the object itself, so copy.deepcopy(model) after spillarena.enable (EMA
// copies, trainers that copy models) gives a model whose checkpoint function spills to the same
// arena (issue 19). Pickling raises InvalidArgumentError saying what to do instead.
template <class PyClass>
void share_on_copy(PyClass& cls, const char* what) {
  const std::string refusal =
      std::string("spillarena: a ") + what +
      " cannot be pickled: it is an open spill file of "
      "this process. Save the model's state_dict(), or call spillarena.disable(model) before "
      "pickling it (copy.deepcopy works: the copy shares the arena)";
  cls.def("__copy__", [](py::object self) { return self; })
      .def(
          "__deepcopy__", [](py::object self, py::handle) { return self; }, py::arg("memo"))
      .def("__reduce_ex__",
           [refusal](py::handle, py::handle) -> py::object {
             throw spill::InvalidArgumentError(refusal);
           })
      .def("__reduce__",
           [refusal](py::handle) -> py::object { throw spill::InvalidArgumentError(refusal); });
}

// Python sees an enum as the names spill::to_string gives its values (found by argument-dependent
// lookup); to_string answers "?" past the last value.
template <class E>
struct Convert<E, std::enable_if_t<std::is_enum_v<E>>> {
  static py::object to_python(E v) { return py::str(to_string(v)); }
  static E from_python(py::handle v, const std::string& field) {
    std::string names;
    for (int i = 0; std::string_view(to_string(static_cast<E>(i))) != "?"; ++i) {
      const std::string name = to_string(static_cast<E>(i));
      if (py::isinstance<py::str>(v) && v.cast<std::string>() == name) return static_cast<E>(i);
      names += (names.empty() ? "\"" : ", \"") + name + "\"";
    }
    throw_bad_value(field, "one of " + names, v);
  }
};

}  // namespace spillarena_python
