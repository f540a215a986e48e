// Options and stats structs as Python dicts by field name, through spill::detail::visit_fields:
// the library's one list of each struct's fields (core/arena/arena_fields.h,
// core/stash/stash_fields.h, both included here so every overload is seen).
//
//   spill::ArenaOptions options;
//   set_field(options, "capacity_bytes", py::int_(1 << 30));  // checked, typed errors
//   py::dict d = to_dict(options);                            // {"directory": "", ...}
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <type_traits>
#include <vector>

#include "binding.h"
#include "core/arena/arena_fields.h"
#include "core/stash/stash_fields.h"
#include "core/text/quote.h"
#include "spill/error.h"

namespace spillarena_python {

template <class Struct>
py::dict to_dict(const Struct& s) {
  py::dict out;
  spill::detail::visit_fields(s, [&](const char* name, const auto& value) {
    out[name] = Convert<std::decay_t<decltype(value)>>::to_python(value);
  });
  return out;
}

// Throws spill::InvalidArgumentError for an unknown name (listing `names`, or the struct's
// fields when empty) or a value of the wrong kind.
template <class Struct>
void set_field(Struct& s, const std::string& name, py::handle value,
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

}  // namespace spillarena_python
