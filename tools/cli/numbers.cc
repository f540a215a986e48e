#include "numbers.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "core/text/quote.h"
#include "spill/units.h"

namespace spill::cli {
namespace {

// What the user typed, shortened: a 5000-digit argument must not become a 5000-character error.
std::string shown(std::string_view text) {
  constexpr std::size_t kMaxShown = 40;
  if (text.size() <= kMaxShown) return detail::quote(text);
  return detail::quote(text.substr(0, kMaxShown)) + "... (" + std::to_string(text.size()) +
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
  return std::string("a finite number in ") + (b.min_inclusive ? "[" : "(") + format_real(b.min) +
         ", " + format_real(b.max) + (b.max_inclusive ? "]" : ")");
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

// Multiplier of a size unit ("", "b", "k", "kb", "kib", ... "pib"), 0 when unknown.
std::uint64_t unit_multiplier(std::string unit) {
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (unit.empty() || unit == "b") return 1;
  const std::string letters = "kmgtp";
  const std::size_t power = letters.find(unit[0]);
  if (power == std::string::npos) return 0;
  const std::string rest = unit.substr(1);
  if (!rest.empty() && rest != "b" && rest != "ib") return 0;
  return 1ull << (10 * (power + 1));
}

// Shared by counts and sizes: the sign and digit checks, then the bounds.
Parsed<std::uint64_t> whole_number(std::string_view option, std::string_view text,
                                   std::uint64_t multiplier, const std::string& range) {
  const bool nonzero = text.find_first_of("123456789") != std::string_view::npos;
  if (!text.empty() && text[0] == '-' && nonzero) {
    return failure<std::uint64_t>(option,
                                  "cannot be negative, got " + shown(text) + "; pass " + range);
  }
  if (!all_digits(text)) {
    return failure<std::uint64_t>(option, "must be " + range + ", got " + shown(text));
  }
  std::uint64_t v = 0;
  if (!digits_to_u64(text, &v) || (multiplier > 1 && v > UINT64_MAX / multiplier)) {
    return failure<std::uint64_t>(option,
                                  "is too large to count, got " + shown(text) + "; pass " + range);
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

// Note [Fractional sizes]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// "1.5GiB" is a whole number of bytes and people type it; "1.5B" or "0.1KiB" is not, and
// rounding it would size an arena the user did not ask for. The fraction is added exactly (in
// 128 bits: up to 19 fraction digits times 2^50 cannot overflow) and refused unless it comes to
// whole bytes.
Parsed<std::uint64_t> add_fraction(std::string_view option, std::string_view text,
                                   std::uint64_t whole_bytes, std::string_view digits,
                                   std::uint64_t multiplier) {
  constexpr std::size_t kMaxFractionDigits = 19;
  while (digits.size() > 1 && digits.back() == '0') digits.remove_suffix(1);
  std::uint64_t numerator = 0;
  if (digits.size() > kMaxFractionDigits || !digits_to_u64(digits, &numerator)) {
    return failure<std::uint64_t>(
        option, "has more fraction digits than any size needs, got " + shown(text));
  }
  __extension__ typedef unsigned __int128 Wide;
  Wide scale = 1;
  for (std::size_t i = 0; i < digits.size(); ++i) scale *= 10;
  const Wide scaled = static_cast<Wide>(numerator) * multiplier;
  if (scaled % scale != 0) {
    return failure<std::uint64_t>(option, "must come to a whole number of bytes, got " +
                                              shown(text) + "; write it in a smaller unit");
  }
  const auto extra = static_cast<std::uint64_t>(scaled / scale);  // < multiplier
  if (whole_bytes > UINT64_MAX - extra) {
    return failure<std::uint64_t>(option, "is too large to count, got " + shown(text));
  }
  Parsed<std::uint64_t> p;
  p.value = whole_bytes + extra;
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
  if (!text.empty() && text[0] == '-') return whole_number(option, text, 1, range);
  const std::size_t whole = count_digits(text, 0);
  const bool point = whole < text.size() && text[whole] == '.';
  const std::size_t fraction = point ? count_digits(text, whole + 1) : 0;
  const std::size_t number = whole + (point ? 1 + fraction : 0);
  const std::string unit(text.substr(number));
  const std::uint64_t multiplier = unit_multiplier(unit);
  if (whole + fraction == 0 || (point && fraction == 0)) {
    return failure<std::uint64_t>(option, "must be " + range + ", got " + shown(text));
  }
  if (multiplier == 0) {
    return failure<std::uint64_t>(option, "has an unknown unit " + shown(unit) + " in " +
                                              shown(text) +
                                              "; use B, KiB, MiB, GiB, TiB or PiB "
                                              "(K, KB, M, ... mean the same binary units)");
  }
  Parsed<std::uint64_t> p = whole == 0
                                ? Parsed<std::uint64_t>{}
                                : whole_number(option, text.substr(0, whole), multiplier, range);
  if (!p.ok()) {  // the message names all that was typed, the unit included
    return failure<std::uint64_t>(
        option, "is more bytes than can be counted, got " + shown(text) + "; pass " + range);
  }
  if (p.ok() && fraction > 0)
    p = add_fraction(option, text, p.value, text.substr(whole + 1, fraction), multiplier);
  return bounded(option, text, p, bounds, range);
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
