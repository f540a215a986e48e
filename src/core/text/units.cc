#include "spill/units.h"

#include <cstdio>
#include <cstdlib>

namespace spill {

std::string human_bytes(std::uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes);
  int unit = 0;
  // Compared after rounding to two decimals: 1 MiB - 1 is "1.00 MiB", not "1024.00 KiB".
  while (value >= 1024.0 - 0.005 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.2f %s", value, kUnits[unit]);
  return text;
}

// The fewest significant digits that read back exactly (17 always do), so 1.0000001 is not
// printed as "1" and 1e308 is not printed as 309 digits.
std::string format_real(double value) {
  char text[32];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  return text;
}

std::string bytes_with_units(std::uint64_t bytes) {
  return std::to_string(bytes) + " bytes (" + human_bytes(bytes) + ")";
}

}  // namespace spill
