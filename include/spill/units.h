// Byte counts (and reals) for people: spill::human_bytes(3ull << 30) == "3.00 GiB".
//
//   const std::uint64_t capacity = 3ull << 30;
//   std::cout << "capacity " << capacity << " bytes (" << spill::human_bytes(capacity) << ")\n";
#pragma once

#include <cstdint>
#include <string>

namespace spill {

constexpr std::uint64_t KiB = 1ull << 10;
constexpr std::uint64_t MiB = 1ull << 20;
constexpr std::uint64_t GiB = 1ull << 30;

// "512 B", "4.00 KiB", "1.50 GiB", ... (binary units, two decimals above bytes).
std::string human_bytes(std::uint64_t bytes);

// A real number for people, as short as it can be and still read back as the same double:
// format_real(1.25) == "1.25", format_real(1.0000001) == "1.0000001", format_real(1e308) ==
// "1e+308". Every message and the CLI print options such as growth_margin through it.
std::string format_real(double value);

// The exact count and the readable one, as error messages give them:
// "1610612736 bytes (1.50 GiB)".
std::string bytes_with_units(std::uint64_t bytes);

}  // namespace spill
