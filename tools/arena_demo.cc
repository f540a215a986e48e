// spillarena_demo: exercises a SpillArena the way a training loop does (forward stashes layer
// inputs, backward reads them back newest first and frees them) and prints the arena's stats.
//
//   ./build/tools/spillarena_demo [directory] [layers] [MiB per layer] [steps]
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <vector>

#include "spill/core.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void print_stats(const spill::ArenaStats& s) {
  std::cout << "  capacity          " << spill::human_bytes(s.capacity_bytes) << "\n"
            << "  in use / peak     " << spill::human_bytes(s.bytes_in_use) << " / "
            << spill::human_bytes(s.peak_bytes_in_use) << "\n"
            << "  allocations/frees " << s.allocations << " / " << s.frees << " (reuse hits "
            << s.reuse_hits << ")\n"
            << "  largest free      " << spill::human_bytes(s.largest_free_block) << "\n"
            << "  written / read    " << spill::human_bytes(s.bytes_written) << " / "
            << spill::human_bytes(s.bytes_read) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "";
  const std::uint64_t layers = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 8;
  const std::uint64_t mib = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 32;
  const int steps = argc > 4 ? std::atoi(argv[4]) : 3;
  try {
    spill::ArenaOptions options;
    options.directory = dir;
    options.capacity_bytes = spill::bytes_for_layer_inputs(layers, {1, mib, spill::MiB}, 1);
    spill::SpillArena arena(options);
    std::cout << "spill file in " << arena.directory() << " (" << arena.file_system_type() << ", "
              << (arena.opened_without_name() ? "never named" : "named, then unlinked") << "), "
              << layers << " layers x " << mib << " MiB\n";
    const std::uint64_t bytes = mib * spill::MiB;
    std::vector<unsigned char> src(bytes), dst(bytes);
    for (int step = 0; step < steps; ++step) {
      auto t0 = std::chrono::steady_clock::now();
      std::vector<spill::Region> stash;
      for (std::uint64_t l = 0; l < layers; ++l) {
        std::memset(src.data(), static_cast<int>(step * 31 + l), bytes);
        stash.push_back(arena.allocate(bytes));
        stash.back().write(src.data(), bytes);
      }
      const double write_s = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      for (std::uint64_t l = layers; l-- > 0;) {
        stash[l].read(dst.data(), bytes);
        if (dst[bytes / 2] != static_cast<unsigned char>(step * 31 + l)) {
          std::cerr << "data mismatch in layer " << l << "\n";
          return 1;
        }
        stash.pop_back();  // LIFO: the region is freed
      }
      const double read_s = seconds_since(t0);
      const double gb = static_cast<double>(layers * bytes) / 1e9;
      std::cout << "step " << step << ": write " << gb / write_s << " GB/s, read " << gb / read_s
                << " GB/s\n";
    }
    print_stats(arena.stats());
  } catch (const spill::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
