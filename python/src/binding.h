// Shared pieces of the spillarena._C extension: the per-area bind functions called by module.cc,
// and FieldTable, which maps a C++ options/stats struct to Python one field per line:
//
//   static const auto table = FieldTable<spill::ArenaOptions>()
//       .field("capacity_bytes", &spill::ArenaOptions::capacity_bytes)
//       .field("backing", &spill::ArenaOptions::backing);
//   table.set(options, "capacity_bytes", py::int_(1 << 30));  // checked, typed errors
//   py::dict d = table.to_dict(options);                      // {"capacity_bytes": ..., ...}
//
// A field of a new type needs a Convert<T> specialization (an enum: an EnumNames<E> entry).
#pragma once

#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "spill/error.h"

namespace spillarena_python {

namespace py = pybind11;

void bind_errors(py::module_& m);
void bind_arena(py::module_& m);
void bind_stash(py::module_& m);

// ---------------------------------------------------------------------------------------------
// Conversions between field values and Python objects
// ---------------------------------------------------------------------------------------------

[[noreturn]] inline void throw_bad_value(const std::string& field, const std::string& expected,
                                         py::handle value) {
  throw spill::InvalidArgumentError("spillarena: " + field + " must be " + expected + ", got " +
                                    py::repr(value).cast<std::string>());
}

// Each enum that appears in options or stats lists its names here (specialized in the .cc that
// knows the enum). Python sees enums as these strings.
template <class E>
struct EnumNames;

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
// Only a Python int (not bool, not float) in [0, max] is accepted, anything else is an
// InvalidArgumentError naming the field.
template <class T>
struct Convert<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static py::object to_python(T v) { return py::int_(v); }
  static T from_python(py::handle v, const std::string& field) {
    const std::string expected = std::is_signed_v<T> ? "an integer" : "a non-negative integer";
    if (py::isinstance<py::bool_>(v) || !py::isinstance<py::int_>(v)) {
      throw_bad_value(field, expected, v);
    }
    const py::int_ value = py::reinterpret_borrow<py::int_>(v);
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

template <>
struct Convert<std::string> {
  static py::object to_python(const std::string& v) { return py::str(v); }
  static std::string from_python(py::handle v, const std::string& field) {
    // str or os.PathLike (pathlib.Path) for directories.
    py::object text = py::reinterpret_borrow<py::object>(v);
    if (py::hasattr(text, "__fspath__")) text = text.attr("__fspath__")();
    if (!py::isinstance<py::str>(text)) throw_bad_value(field, "a string or path", v);
    return text.cast<std::string>();
  }
};

template <class E>
struct Convert<E, std::enable_if_t<std::is_enum_v<E>>> {
  static py::object to_python(E v) {
    for (const auto& [name, value] : EnumNames<E>::values) {
      if (value == v) return py::str(name);
    }
    return py::int_(static_cast<std::int64_t>(v));
  }
  static E from_python(py::handle v, const std::string& field) {
    std::string names;
    for (const auto& [name, value] : EnumNames<E>::values) {
      if (py::isinstance<py::str>(v) && v.cast<std::string>() == name) return value;
      names += (names.empty() ? "\"" : ", \"") + std::string(name) + "\"";
    }
    throw_bad_value(field, "one of " + names, v);
  }
};

// ---------------------------------------------------------------------------------------------
// FieldTable
// ---------------------------------------------------------------------------------------------

template <class Struct>
class FieldTable {
 public:
  template <class T>
  FieldTable& field(const char* name, T Struct::*member) {
    entries_.push_back(
        {name, [member](const Struct& s) { return Convert<T>::to_python(s.*member); },
         [member, name](Struct& s, py::handle v) {
           s.*member = Convert<T>::from_python(v, name);
         }});
    return *this;
  }

  py::dict to_dict(const Struct& s) const {
    py::dict out;
    for (const auto& e : entries_) out[py::str(e.name)] = e.get(s);
    return out;
  }

  // Throws spill::InvalidArgumentError for an unknown name or a value of the wrong kind.
  void set(Struct& s, const std::string& name, py::handle value) const {
    for (const auto& e : entries_) {
      if (name == e.name) return e.set(s, value);
    }
    std::string known;
    for (const auto& e : entries_) known += (known.empty() ? "" : ", ") + std::string(e.name);
    throw spill::InvalidArgumentError("spillarena: unknown option '" + name +
                                      "'; the options are: " + known);
  }

  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : entries_) out.emplace_back(e.name);
    return out;
  }

 private:
  struct Entry {
    const char* name;
    std::function<py::object(const Struct&)> get;
    std::function<void(Struct&, py::handle)> set;
  };
  std::vector<Entry> entries_;
};

}  // namespace spillarena_python
