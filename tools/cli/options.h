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

namespace spill::cli {

namespace detail {

template <class T>
T take(Parsed<T> parsed) {
  if (!parsed.ok()) throw CLI::ValidationError(parsed.error);
  return parsed.value;
}

template <class T>
std::string default_text(const T& value) {
  std::ostringstream s;
  s << value;
  return s.str();
}

}  // namespace detail

// A whole-number option stored in any integer type (bounds must fit the type).
template <class T>
CLI::Option* add_count(CLI::App& app, const std::string& name, T& target, CountBounds bounds,
                       const std::string& help) {
  static_assert(std::is_integral_v<T>, "add_count stores into an integer");
  return app
      .add_option_function<std::string>(
          name,
          [&target, name, bounds](const std::string& text) {
            target = static_cast<T>(detail::take(parse_count(name, text, bounds)));
          },
          help)
      ->default_str(detail::default_text(target))
      ->type_name("UINT");
}

inline CLI::Option* add_size(CLI::App& app, const std::string& name, std::uint64_t& target,
                             CountBounds bounds, const std::string& help) {
  return app
      .add_option_function<std::string>(
          name,
          [&target, name, bounds](const std::string& text) {
            target = detail::take(parse_size(name, text, bounds));
          },
          help)
      ->default_str(detail::default_text(target))
      ->type_name("SIZE");
}

inline CLI::Option* add_real(CLI::App& app, const std::string& name, double& target,
                             RealBounds bounds, const std::string& help) {
  return app
      .add_option_function<std::string>(
          name,
          [&target, name, bounds](const std::string& text) {
            target = detail::take(parse_real(name, text, bounds));
          },
          help)
      ->default_str(detail::default_text(target))
      ->type_name("FLOAT");
}

}  // namespace spill::cli
