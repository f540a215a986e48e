// Conversions between the library's field values and Python objects (structs as dicts by field
// name are made from these: fields.h), with the checks every value from Python gets:
//
//   Ref o = Convert<std::uint64_t>::to_python(1 << 30);
//   std::uint64_t n = Convert<std::uint64_t>::from_python(o.get(), "capacity_bytes");  // checked
//
// A field of a new type needs a Convert<T> specialization (an enum: a spill::to_string for it).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

#include "py.h"
#include "spill/error.h"

namespace spill {
class SpillArena;
}

namespace spillarena_python {

template <>
struct CapsuleName<spill::SpillArena> {
  static constexpr const char* value = "spillarena.SpillArena";
};

// repr(value), for messages.
std::string repr(PyObject* value);
// A str's UTF-8 bytes; InvalidArgumentError naming `field` for anything else.
std::string utf8(PyObject* value, const std::string& field);

[[noreturn]] inline void throw_bad_value(const std::string& field, const std::string& expected,
                                         PyObject* value) {
  throw spill::InvalidArgumentError("spillarena: " + field + " must be " + expected + ", got " +
                                    repr(value));
}

template <class T, class Enable = void>
struct Convert;

template <>
struct Convert<bool> {
  static Ref to_python(bool v) { return Ref::borrow(v ? Py_True : Py_False); }
  static bool from_python(PyObject* v, const std::string& field) {
    if (!PyBool_Check(v)) throw_bad_value(field, "True or False", v);
    return v == Py_True;
  }
};

// Whether `v` converts to a number but is none here: a bool, or a numpy or torch value that is a
// boolean (np.True_, torch.tensor(True): 0 and 1), complex (its real part alone), or not a scalar
// (torch.tensor([[3]]): one element, but an array); a dtype or ndim that cannot be read counts as
// none too (Note [Only a bad argument becomes another error]).
inline bool no_real_scalar(PyObject* v) {
  if (PyBool_Check(v) || PyComplex_Check(v)) return true;
  const auto read = [v](const char* name) {
    PyObject* value = PyObject_GetAttrString(v, name);
    if (value == nullptr && PyErr_ExceptionMatches(PyExc_AttributeError)) {
      PyErr_Clear();
      return Ref();
    }
    if (value == nullptr) clear_bad_argument();  // else a TypeError or ValueError: refused
    return value != nullptr ? Ref::steal(value) : Ref::borrow(Py_None);
  };
  if (const Ref ndim = read("ndim")) {
    if (ndim.get() == Py_None || !PyLong_Check(ndim.get())) return true;
    const long n = PyLong_AsLong(ndim.get());
    if (n == -1 && PyErr_Occurred() != nullptr) clear_bad_argument();
    if (n != 0) return true;
  }
  const Ref dtype = read("dtype");
  if (!dtype) return false;
  PyObject* text = dtype.get() == Py_None ? nullptr : PyObject_Str(dtype.get());
  if (text == nullptr) {
    if (dtype.get() != Py_None) clear_bad_argument();
    return true;
  }
  const Ref name = Ref::steal(text);
  const char* utf8_name = PyUnicode_AsUTF8AndSize(name.get(), nullptr);
  if (utf8_name == nullptr) {
    clear_bad_argument();
    return true;
  }
  const std::string_view n(utf8_name);
  return n == "bool" || n == "torch.bool" || n.find("complex") != std::string_view::npos;
}

// Note [Numbers from Python are bounded before they reach C++]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A negative int cast to uint64 wraps to 2^64 - 1 and a float truncates; both once broke the CLI.
// Only an integer — a Python int or what operator.index accepts (numpy integers, integer 0-dim
// tensors), never a bool (no_real_scalar: numpy's and torch's too, nor an array of one element) or
// float — in [0, max] is accepted; anything else is an InvalidArgumentError naming the field.
template <class T>
struct Convert<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static Ref to_python(T v) {
    if constexpr (std::is_signed_v<T>) return Ref::steal(PyLong_FromLongLong(v));
    return Ref::steal(PyLong_FromUnsignedLongLong(v));
  }
  static T from_python(PyObject* v, const std::string& field) {
    const std::string expected = std::is_signed_v<T> ? "an integer" : "a non-negative integer";
    if (!PyIndex_Check(v) || no_real_scalar(v)) throw_bad_value(field, expected, v);
    PyObject* index = PyNumber_Index(v);
    if (index == nullptr) {
      clear_bad_argument();  // Note [Only a bad argument becomes another error] (py.h)
      throw_bad_value(field, expected, v);
    }
    const Ref value = Ref::steal(index);
    int overflow = 0;
    const long long low = PyLong_AsLongLongAndOverflow(value.get(), &overflow);
    bool fits = overflow == 0 && low >= static_cast<long long>(std::numeric_limits<T>::min());
    if constexpr (std::is_unsigned_v<T>) {
      if (overflow > 0) {  // above LLONG_MAX: unsigned long long holds it, or nothing does
        const unsigned long long high = PyLong_AsUnsignedLongLong(value.get());
        if (high == static_cast<unsigned long long>(-1) && PyErr_Occurred() != nullptr) {
          clear_bad_argument();  // OverflowError: above 2^64 - 1
        } else if (high <= std::numeric_limits<T>::max()) {
          return static_cast<T>(high);
        }
      } else if (fits) {
        fits = static_cast<unsigned long long>(low) <= std::numeric_limits<T>::max();
      }
    } else if (fits) {
      fits = low <= static_cast<long long>(std::numeric_limits<T>::max());
    }
    if (!fits) {
      throw_bad_value(field,
                      expected + " that fits the field (at most " +
                          std::to_string(std::numeric_limits<T>::max()) + ")",
                      v);
    }
    return static_cast<T>(low);
  }
};

// Note [One numeric conversion for every option]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A number option (growth_margin, a pressure) takes what Python calls a real number: an int,
// a float, and what converts to one itself — numpy's integers and floats (np.int64(2) was
// refused while np.float64 and numpy integers for the integer options were taken: issue 49),
// a 0-dim tensor, a Fraction. An int goes through operator.index, anything else through
// float(), the conversion its type defines (a str defines none: "2" stays refused, as do bool
// and NaN or infinity). What the conversion raises follows Note [Only a bad argument becomes
// another error] in py.h.
template <class T>
struct Convert<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  static Ref to_python(T v) { return Ref::steal(PyFloat_FromDouble(v)); }
  static T from_python(PyObject* v, const std::string& field) {
    const bool has_float = PyType_GetSlot(Py_TYPE(v), Py_nb_float) != nullptr;
    if (!(has_float || PyIndex_Check(v)) || no_real_scalar(v))
      throw_bad_value(field, "a number", v);
    const bool integer = PyLong_Check(v) || !has_float;
    PyObject* converted = integer ? PyNumber_Index(v) : PyNumber_Float(v);
    if (converted == nullptr) {
      clear_bad_argument();
      throw_bad_value(field, "a number", v);
    }
    const Ref number = Ref::steal(converted);
    const double value = integer ? PyLong_AsDouble(number.get()) : PyFloat_AsDouble(number.get());
    if (value == -1.0 && PyErr_Occurred() != nullptr) {
      clear_bad_argument();  // OverflowError: an int beyond a double's range
      throw_bad_value(field, "a finite number", v);
    }
    if (!std::isfinite(value)) throw_bad_value(field, "a finite number", v);
    return static_cast<T>(value);
  }
};

// Note [Paths are bytes, as the OS sees them]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A Linux path is bytes, not necessarily UTF-8; Python spells a path it cannot decode as a str
// with surrogate escapes (os.fsdecode), which a plain str-to-std::string cast refuses with a
// raw UnicodeEncodeError, so such directories could not be used at all (issue 19). Strings
// cross the boundary the way the os module does: in through os.fsencode (str, bytes or
// os.PathLike), out through os.fsdecode, so os.fsencode(arena.directory) gives back the bytes.
inline Ref path_to_python(const std::string& v) {
  return Ref::steal(PyUnicode_DecodeFSDefaultAndSize(v.data(), static_cast<Py_ssize_t>(v.size())));
}

// A message for people: UTF-8, with any other byte shown as \xNN (never an exception).
inline Ref message_to_python(const std::string& v) {
  return Ref::steal(
      PyUnicode_DecodeUTF8(v.data(), static_cast<Py_ssize_t>(v.size()), "backslashreplace"));
}

// os.fsencode(v) for a str, bytes or os.PathLike; InvalidArgumentError naming `field` otherwise.
std::string path_from_python(PyObject* v, const std::string& field);

template <>
struct Convert<std::string> {
  static Ref to_python(const std::string& v) { return path_to_python(v); }
  static std::string from_python(PyObject* v, const std::string& field) {
    return path_from_python(v, field);
  }
};

// Python sees an enum as the names spill::to_string gives its values (found by argument-dependent
// lookup); to_string answers "?" past the last value.
template <class E>
struct Convert<E, std::enable_if_t<std::is_enum_v<E>>> {
  static Ref to_python(E v) { return message_to_python(to_string(v)); }
  static E from_python(PyObject* v, const std::string& field) {
    std::string names;
    const bool text = PyUnicode_Check(v) != 0;
    const std::string given = text ? utf8(v, field) : std::string();
    for (int i = 0; std::string_view(to_string(static_cast<E>(i))) != "?"; ++i) {
      const std::string name = to_string(static_cast<E>(i));
      if (text && given == name) return static_cast<E>(i);
      names += (names.empty() ? "\"" : ", \"") + name + "\"";
    }
    throw_bad_value(field, "one of " + names, v);
  }
};

}  // namespace spillarena_python
