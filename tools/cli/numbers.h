// Numbers from the command line, parsed and bounded in one place. Every numeric option of
// `spillarena` goes through these three functions, so each class of bad input is answered once:
// signs on unsigned values, more digits than fit, NaN/inf/huge doubles, trailing junk, values
// outside the option's bounds. Nothing here throws; a failure says what was wrong and what to
// pass instead.
//
//   using namespace spill::cli;
//   Parsed<std::uint64_t> layers = parse_count("--layers", "64", {1, 4096});
//   Parsed<std::uint64_t> bytes = parse_size("--capacity", "512MiB", {0, 1ull << 50});
//   Parsed<double> p = parse_real("--dropout", "nan", {0.0, 1.0, true, false});
//   if (!p.ok()) std::cerr << p.error << "\n";
//   // "--dropout must be a finite number in [0, 1), got 'nan'"
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace spill::cli {

template <class T>
struct Parsed {
  T value{};
  std::string error;  // "" on success
  bool ok() const { return error.empty(); }
};

struct CountBounds {
  std::uint64_t min = 0;
  std::uint64_t max = UINT64_MAX;
};

struct RealBounds {
  double min = 0;
  double max = 0;
  bool min_inclusive = true;
  bool max_inclusive = true;
};

// A whole number written in decimal digits only ("64"): no sign, no spaces, no exponent.
Parsed<std::uint64_t> parse_count(std::string_view option, std::string_view text,
                                  CountBounds bounds);

// A byte count: digits with an optional unit, B, K, M, G, T (also KB/KiB, ...; all powers of
// 1024, as the CLI always read them), case-insensitive: "4096", "512MiB", "2g".
Parsed<std::uint64_t> parse_size(std::string_view option, std::string_view text,
                                 CountBounds bounds);

// A finite decimal number ("3e-3", "0.1") inside the bounds.
Parsed<double> parse_real(std::string_view option, std::string_view text, RealBounds bounds);

}  // namespace spill::cli
