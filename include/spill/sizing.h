// Sizing an arena to a model: the bytes the spilled layer inputs of one step need, with the
// allocator's page alignment and size-class rounding included.
//
//   #include <spill/arena.h>
//   // 32 transformer blocks, batch 1, 8192 tokens, hidden 4096, bf16 (2 bytes):
//   spill::ArenaOptions options;
//   options.capacity_bytes =
//       spill::bytes_for_layer_inputs(32, spill::ActivationShape{1, 8192, 4096}, 2);
//   spill::SpillArena arena(options);   // exactly 32 regions of 64 MiB fit
//
// With LibTorch, spill::bytes_for_layer_inputs(layers, shape, torch::kBFloat16) in
// <spill/checkpoint.h> takes the dtype instead of its size.
#pragma once

#include <cstdint>

namespace spill {

struct ActivationShape {
  std::uint64_t batch = 0;
  std::uint64_t seq = 0;
  std::uint64_t hidden = 0;
};

// The OS page size in bytes: every region starts on a page and reserves whole pages.
std::uint64_t page_size_bytes();

// Bytes of one layer input of `shape`, as the arena reserves it (rounded). Throws
// spill::InvalidArgumentError for a zero dimension or element size, or on overflow.
std::uint64_t bytes_for_layer_input(const ActivationShape& shape, std::uint64_t element_size_bytes);

// layers x bytes_for_layer_input(...): the capacity for one step of `layers` checkpointed layers.
std::uint64_t bytes_for_layer_inputs(std::uint64_t layers, const ActivationShape& shape,
                                     std::uint64_t element_size_bytes);

// The capacity that holds `needed_bytes` with `growth_margin` (ArenaOptions) to spare: needed x
// margin, in whole pages, at most kMaxCapacityBytes. The one figure a grow aims at, the overflow
// warning asks for, and the CLI's summary gives.
// Throws InvalidArgumentError for a margin outside 1 to 16 (NaN included).
std::uint64_t capacity_with_margin(std::uint64_t needed_bytes, double growth_margin);

}  // namespace spill
