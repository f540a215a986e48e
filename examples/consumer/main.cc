// The README's snippet, built as an outside client would build it.
#include <spill/spill.h>

#include <iostream>
#include <vector>

int main(int argc, char** argv) {
  spill::ArenaOptions options;
  options.directory = argc > 1 ? argv[1] : "";  // default: $SPILL_DIR, else the temp dir
  options.capacity_bytes = 256ull << 20;
  spill::SpillArena arena(options);
  spill::Region r = arena.allocate(64ull << 20);
  std::vector<float> src(1024, 1.5f);
  spill::Pending w = r.write_async(src.data(), src.size() * sizeof(float));  // may return at once
  w.wait();
  std::cout << "region at " << r.offset() << ", " << r.size() << " bytes, "
            << spill::to_string(arena.stats().io_backend) << "\n";

  torch::nn::Sequential layers(torch::nn::Linear(64, 64), torch::nn::Linear(64, 64));
  torch::Tensor h = torch::randn({8, 64}, torch::requires_grad());
  for (auto& layer : *layers) {
    h = spill::checkpoint(
        arena, [&layer](const torch::Tensor& in) mutable { return layer.forward(in); }, h);
  }
  h.sum().backward();
  spill::ArenaStats s = arena.stats();
  std::cout << "capacity " << s.capacity_bytes << ", in use " << s.bytes_in_use << ", peak "
            << s.peak_bytes_in_use << ", written " << s.bytes_written << "\n";
  return s.bytes_written > 0 && s.bytes_in_use == 64ull << 20 ? 0 : 1;
}
