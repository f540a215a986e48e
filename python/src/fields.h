// Options and stats structs as Python dicts by field name, through spill::detail::visit_fields:
// the library's one list of each struct's fields (core/arena/arena_fields.h,
// core/stash/stash_fields.h, core/os/memory_limits_fields.h, all included here so every overload
// is seen).
//
//   spill::ArenaOptions options;
//   set_field(options, "capacity_bytes", value);  // checked, typed errors
//   Ref d = to_dict(options);                     // {"directory": "", ...}
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include "binding.h"
#include "core/arena/arena_fields.h"
#include "core/os/memory_limits_fields.h"
#include "core/stash/stash_fields.h"
#include "core/text/quote.h"
#include "spill/error.h"

namespace spillarena_python {

template <class Struct>
Ref to_dict(const Struct& s) {
  Ref out = Ref::steal(PyDict_New());
  spill::detail::visit_fields(s, [&](const char* name, const auto& value) {
    const Ref v = Convert<std::decay_t<decltype(value)>>::to_python(value);
    if (PyDict_SetItemString(out.get(), name, v.get()) != 0) throw PythonError();
  });
  return out;
}

// The names of a struct's fields, in order.
template <class Struct>
std::vector<std::string> field_names() {
  std::vector<std::string> out;
  Struct s;
  spill::detail::visit_fields(s, [&](const char* name, const auto&) { out.push_back(name); });
  return out;
}

// A tuple of strings.
Ref tuple_of(const std::vector<std::string>& names);

// Throws spill::InvalidArgumentError for an unknown name (listing `names`, or the struct's
// fields when empty) or a value of the wrong kind.
template <class Struct>
void set_field(Struct& s, const std::string& name, PyObject* value,
               const std::vector<std::string>& names = {}) {
  bool found = false;
  std::string known;
  for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
  spill::detail::visit_fields(s, [&](const char* field, auto& target) {
    if (names.empty()) known += (known.empty() ? "" : ", ") + std::string(field);
    if (name != field) return;
    target = Convert<std::decay_t<decltype(target)>>::from_python(value, field);
    found = true;
  });
  if (!found) {
    throw spill::InvalidArgumentError("spillarena: unknown option " + spill::detail::quote(name) +
                                      "; the options are: " + known);
  }
}

// Each (key, value) of a dict, in order; keys must be str (InvalidArgumentError naming `what`).
template <class Visit>
void for_each_item(PyObject* dict, const char* what, Visit&& visit) {
  if (!PyDict_Check(dict)) throw_bad_value(what, "a dict", dict);
  PyObject* key = nullptr;
  PyObject* value = nullptr;
  Py_ssize_t at = 0;
  while (PyDict_Next(dict, &at, &key, &value)) visit(utf8(key, what), value);
}

}  // namespace spillarena_python
