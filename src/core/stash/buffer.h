// Bytes somewhere — host memory or a device's — kept alive by whoever made them: the stash's
// one view of a tensor. The stash moves bytes and never needs a tensor's shape, dtype or
// autograd state, so it works the same under LibTorch's C++ API (src/torch_layer/) and under
// Python's torch reached through DLPack (python/src/): Note [The stash moves bytes].
//
//   spill::detail::Buffer b = spill::detail::Buffer::host(1 << 20, 4096);  // aligned, owned
//   spill::detail::Buffer tail = b.slice(4096, 100);  // shares b's owner
//   std::memcpy(tail.data(), src, tail.bytes());
#pragma once

#include <cstdint>
#include <memory>

namespace spill::detail {

// Where a buffer's bytes live, in the front end's own words: the stash only hands it back to
// that front end's CopyEngine. The default is the host (Buffer::host).
struct Device {
  std::int32_t type = 0;  // the front end's device type (c10::DeviceType, or DLPack's code)
  std::int32_t index = -1;
};

class Buffer {
 public:
  Buffer() = default;
  // `bytes` at `data` on `device`, valid while `owner` is alive (never null for a buffer).
  Buffer(void* data, std::uint64_t bytes, Device device, std::shared_ptr<void> owner);
  // Host memory of its own, `alignment` (a power of two) aligned; throws std::bad_alloc.
  static Buffer host(std::uint64_t bytes, std::uint64_t alignment);

  bool defined() const { return owner_ != nullptr; }
  void* data() const { return data_; }
  std::uint64_t bytes() const { return bytes_; }
  const Device& device() const { return device_; }
  const std::shared_ptr<void>& owner() const { return owner_; }
  // Bytes [offset, offset + bytes) of this buffer, kept alive by the same owner.
  Buffer slice(std::uint64_t offset, std::uint64_t bytes) const;

 private:
  void* data_ = nullptr;
  std::uint64_t bytes_ = 0;
  Device device_;
  std::shared_ptr<void> owner_;
};

}  // namespace spill::detail
