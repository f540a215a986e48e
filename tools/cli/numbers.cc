#include "numbers.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "spill/units.h"

namespace spill::cli {
namespace {

// What the user typed, shortened: a 5000-digit argument must not become a 5000-character error.
std::string shown(std::string_view text) {
  constexpr std::size_t kMaxShown = 40;
  if (text.size() <= kMaxShown) return "'" + std::string(text) + "'";
  return "'" + std::string(text.substr(0, kMaxShown)) + "...' (" + std::to_string(text.size()) +
         " characters)";
}

std::string count_range(CountBounds b) {
  return "a whole number from " + std::to_string(b.min) + " to " + std::to_string(b.max);
}

std::string size_range(CountBounds b) {
  return "a size from " + std::to_string(b.min) + " to " + bytes_with_units(b.max) +
         ", such as 4096 or 512MiB";
}

std::string real_range(RealBounds b) {
  std::ostringstream s;
  s << "a finite number in " << (b.min_inclusive ? "[" : "(") << b.min << ", " << b.max
    << (b.max_inclusive ? "]" : ")");
  return s.str();
}

template <class T>
Parsed<T> failure(std::string_view option, const std::string& problem) {
  Parsed<T> p;
  p.error = std::string(option) + " " + problem;
  return p;
}

bool all_digits(std::string_view text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

std::size_t count_digits(std::string_view text, std::size_t from) {
  std::size_t n = 0;
  while (from + n < text.size() && std::isdigit(static_cast<unsigned char>(text[from + n]))) ++n;
  return n;
}

// Note [What a number on the command line looks like]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// strtod also takes leading white space, hexadecimal ("0x10" is 16), "inf", "nan" and the
// locale's decimal point: a value the user did not mean to type would pass. A real number here is
// only [+-]digits[.digits][e[+-]digits] (digits on at least one side of the point), checked
// before strtod sees it.
bool is_decimal_number(std::string_view text) {
  std::size_t i = (!text.empty() && (text[0] == '+' || text[0] == '-')) ? 1 : 0;
  const std::size_t whole = count_digits(text, i);
  i += whole;
  std::size_t fraction = 0;
  if (i < text.size() && text[i] == '.') {
    fraction = count_digits(text, i + 1);
    i += 1 + fraction;
  }
  if (whole + fraction == 0) return false;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    const std::size_t exponent = count_digits(text, i);
    if (exponent == 0) return false;
    i += exponent;
  }
  return i == text.size();
}

// Decimal digits to uint64 without std::stoull (which throws out_of_range): false on overflow.
bool digits_to_u64(std::string_view digits, std::uint64_t* out) {
  std::uint64_t v = 0;
  for (char c : digits) {
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

// Multiplier of a size unit ("", "b", "k", "kb", "kib", ...), 0 when unknown.
std::uint64_t unit_multiplier(std::string unit) {
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (unit.empty() || unit == "b") return 1;
  const std::string letters = "kmgt";
  const std::size_t power = letters.find(unit[0]);
  if (power == std::string::npos) return 0;
  const std::string rest = unit.substr(1);
  if (!rest.empty() && rest != "b" && rest != "ib") return 0;
  return 1ull << (10 * (power + 1));
}

// Shared by counts and sizes: the sign and digit checks, then the bounds.
Parsed<std::uint64_t> whole_number(std::string_view option, std::string_view text,
                                   std::uint64_t multiplier, const std::string& range) {
  if (!text.empty() && text[0] == '-') {
    return failure<std::uint64_t>(option, "cannot be negative, got " + shown(text) + "; pass " +
                                              range);
  }
  if (!all_digits(text)) {
    return failure<std::uint64_t>(option, "must be " + range + ", got " + shown(text));
  }
  std::uint64_t v = 0;
  if (!digits_to_u64(text, &v) || (multiplier > 1 && v > UINT64_MAX / multiplier)) {
    return failure<std::uint64_t>(option, "is too large to count, got " + shown(text) +
                                              "; pass " + range);
  }
  Parsed<std::uint64_t> p;
  p.value = v * multiplier;
  return p;
}

Parsed<std::uint64_t> bounded(std::string_view option, std::string_view text,
                              Parsed<std::uint64_t> p, CountBounds b, const std::string& range) {
  if (p.ok() && (p.value < b.min || p.value > b.max)) {
    return failure<std::uint64_t>(option, "must be " + range + ", got " + shown(text));
  }
  return p;
}

}  // namespace

Parsed<std::uint64_t> parse_count(std::string_view option, std::string_view text,
                                  CountBounds bounds) {
  const std::string range = count_range(bounds);
  return bounded(option, text, whole_number(option, text, 1, range), bounds, range);
}

Parsed<std::uint64_t> parse_size(std::string_view option, std::string_view text,
                                 CountBounds bounds) {
  const std::string range = size_range(bounds);
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  const std::uint64_t multiplier = unit_multiplier(std::string(text.substr(digits)));
  if (digits == 0 || multiplier == 0) {
    if (!text.empty() && text[0] == '-') return whole_number(option, text, 1, range);
    return failure<std::uint64_t>(option, "must be " + range + ", got " + shown(text));
  }
  return bounded(option, text, whole_number(option, text.substr(0, digits), multiplier, range),
                 bounds, range);
}

Parsed<double> parse_real(std::string_view option, std::string_view text, RealBounds b) {
  const std::string range = real_range(b);
  if (!is_decimal_number(text)) {
    return failure<double>(option, "must be " + range + ", got " + shown(text));
  }
  const std::string copy(text);  // strtod needs a terminated string
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(copy.c_str(), &end);
  const bool whole = end == copy.c_str() + copy.size();
  if (!whole || !std::isfinite(v) || errno == ERANGE) {
    return failure<double>(option, "must be " + range + ", got " + shown(text));
  }
  const bool above_min = b.min_inclusive ? v >= b.min : v > b.min;
  const bool below_max = b.max_inclusive ? v <= b.max : v < b.max;
  if (!above_min || !below_max) {
    return failure<double>(option, "must be " + range + ", got " + shown(text));
  }
  Parsed<double> p;
  p.value = v;
  return p;
}

}  // namespace spill::cli
