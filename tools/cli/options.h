// CLI11 options whose text goes through numbers.h: a bad value becomes a CLI::ValidationError
// (exit 2) carrying the one-line message that names the option, the value and what to pass.
//
//   CLI::App* train = app.add_subcommand("train");
//   add_count(*train, "--layers", r.layers, {1, 4096}, "Transformer blocks");
//   add_size(*train, "--capacity", r.capacity, {0, spill::kMaxCapacityBytes}, "Arena bytes");
//   add_real(*train, "--dropout", r.dropout, {0.0, 1.0, true, false}, "Dropout probability");
#pragma once

#include <CLI/CLI.hpp>

#include <limits>
#include <sstream>
#include <string>
#include <type_traits>

#include "numbers.h"
#include "spill/units.h"

namespace spill::cli {

namespace detail {

template <class T>
T take(Parsed<T> parsed) {
  if (!parsed.ok()) throw CLI::ValidationError(parsed.error);
  return parsed.value;
}

template <class T>
std::string default_text(const T& value) {
  if constexpr (std::is_floating_point_v<T>) {
    return format_real(value);  // --help's defaults as short as they read back exactly
  } else {
    std::ostringstream s;
    s << value;
    return s.str();
  }
}

}  // namespace detail

// One kind of number option: its parser from numbers.h, the bounds that parser takes and the
// type name --help shows. The option's text is parsed when CLI11 sees it; the value is stored
// into `target` (an integer type for counts and sizes; bounds must fit it).
template <auto Parse, class Bounds>
struct NumberOption {
  const char* type_name;

  template <class T>
  CLI::Option* operator()(CLI::App& app, const std::string& name, T& target, Bounds bounds,
                          const std::string& help) const {
    auto store = [&target, name, bounds](const std::string& text) {
      target = static_cast<T>(detail::take(Parse(name, text, bounds)));
    };
    return app.add_option_function<std::string>(name, store, help)
        ->default_str(detail::default_text(target))
        ->type_name(type_name);
  }
};

inline constexpr NumberOption<parse_count, CountBounds> add_count{"UINT"};
inline constexpr NumberOption<parse_size, CountBounds> add_size{"SIZE"};
inline constexpr NumberOption<parse_real, RealBounds> add_real{"FLOAT"};

}  // namespace spill::cli
