// The names of an enum's values, listed in declaration order, for the public to_string functions:
//
//   const char* to_string(IoMode m) { return name_in({"buffered", "direct", "automatic"}, m); }
//
// A value past the list is "?", which the Python binding takes as the end of the enum.
#pragma once

#include <cstddef>

namespace spill {

template <class E, std::size_t N>
const char* name_in(const char* const (&names)[N], E value) {
  const auto index = static_cast<std::size_t>(value);
  return index < N ? names[index] : "?";
}

}  // namespace spill
