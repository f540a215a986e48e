#include "buffer.h"

#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

namespace spill::detail {

// Note [The stash moves bytes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The stash (this folder) sees a layer input as a Buffer: an address, a length, a device and an
// owner that keeps the memory alive. Everything a tensor has beyond that — shape, dtype,
// strides, the version counter that catches in-place changes, how to speak of it in a message —
// stays with the front end that stored it, which wraps the bytes it gets back. There are two
// front ends over this one stash: LibTorch's C++ API (src/torch_layer/arena_stash.cc) and the
// Python extension (python/src/stash_binding.cc), which receives torch's tensors as DLPack
// capsules and so never links torch's C++ ABI: one wheel works beside every torch release that
// speaks DLPack (issue 38). Memory the stash fills for a restore on the host is its own
// (Buffer::host), handed to the front end with its owner; device memory comes from the front
// end's CopyEngine::empty, so a device's caching allocator still makes it.

Buffer::Buffer(void* data, std::uint64_t bytes, Device device, std::shared_ptr<void> owner)
    : data_(data), bytes_(bytes), device_(device), owner_(std::move(owner)) {
  if (!owner_) throw std::invalid_argument("spill: a Buffer needs an owner");
}

Buffer Buffer::host(std::uint64_t bytes, std::uint64_t alignment) {
  if (alignment < sizeof(void*)) alignment = sizeof(void*);
  void* memory = nullptr;
  const std::uint64_t asked = bytes > 0 ? bytes : 1;
  if (posix_memalign(&memory, static_cast<std::size_t>(alignment),
                     static_cast<std::size_t>(asked)) != 0) {
    throw std::bad_alloc();
  }
  std::shared_ptr<void> owner(memory, [](void* m) { std::free(m); });
  return Buffer(memory, bytes, Device{}, std::move(owner));
}

Buffer Buffer::slice(std::uint64_t offset, std::uint64_t bytes) const {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    throw std::out_of_range("spill: Buffer::slice of " + std::to_string(bytes) + " bytes at " +
                            std::to_string(offset) + " past the buffer's " +
                            std::to_string(bytes_));
  }
  return Buffer(static_cast<char*>(data_) + offset, bytes, device_, owner_);
}

}  // namespace spill::detail
