// The seam for copies between an accelerator and host memory. The library's engine queues them
// on a side stream of the tensor's device through c10's device-generic stream/event interfaces
// (nothing here names CUDA). A test installs another in its place (set_copy_engine_override):
// the emulated engine of tests/support/accelerator_emulation.cc copies CPU tensors on a thread
// of its own after random delays, so CI exercises the stash's accelerator path — budget,
// back-pressure, release timing, lifetimes — without a GPU.
// See Note [Accelerator copies] in src/torch_layer/device_copy.cc.
//
//   std::shared_ptr<spill::detail::CopyEngine> engine = spill::detail::CopyEngine::for_inputs();
//   spill::detail::CopyPtr c = engine->to_host(input, 0, bytes, lease.host());
//   c->synchronize();                 // the host waits; or poll c->done()
//   c = engine->to_device(lease.host(), output, 0);
//   c->order_current_stream();        // compute waits for the copy; the host does not
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>

namespace spill::detail {

// One queued copy. It keeps the tensors it reads and writes alive until it completed.
class Copy {
 public:
  virtual ~Copy() = default;
  virtual bool done() const = 0;            // never blocks
  virtual void synchronize() const = 0;     // blocks the host until done
  virtual void order_current_stream() = 0;  // later work on the current stream waits for it
};
using CopyPtr = std::shared_ptr<Copy>;

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  // Bytes [offset, offset + bytes) of contiguous `source` into `host` (uint8, `bytes` long),
  // ordered after the work already queued on the current stream.
  virtual CopyPtr to_host(const torch::Tensor& source, std::uint64_t offset, std::uint64_t bytes,
                          const torch::Tensor& host) = 0;
  // `host` (uint8) into bytes [offset, offset + host.numel()) of contiguous `dest`.
  virtual CopyPtr to_device(const torch::Tensor& host, const torch::Tensor& dest,
                            std::uint64_t offset) = 0;

  // Completes when the work queued so far on `device`'s current stream has (for transfers that
  // bypass streams, such as cuFile's).
  virtual CopyPtr marker(const torch::Device& device) = 0;

  // A tensor to restore an input into (torch::empty); throws c10::OutOfMemoryError when the
  // device has no room.
  virtual torch::Tensor empty(at::IntArrayRef sizes, const torch::TensorOptions& options) {
    return torch::empty(sizes, options);
  }

  // The engine for the stash's accelerator inputs: the override while a test installed one.
  // Held by whoever still has copies to make with it.
  static std::shared_ptr<CopyEngine> for_inputs();
  // True when `t` takes the accelerator path: on a device, or on the CPU under an override.
  static bool is_accelerator_input(const torch::Tensor& t);
};

// The host memory the host pool gets under an override: not emulated (off: the device's own
// host allocator decides), pinned as a device's host allocator would pin it (page-aligned host
// memory standing in for it), pinning refused (pageable memory still had), or none at all.
enum class EmulatedHostMemory { off, pinned, pinning_refused, refused };
EmulatedHostMemory emulated_host_memory();

// Test-only (the one seam tests/support/accelerator_emulation.cc needs): from now on `engine`
// makes the stash's accelerator inputs' copies, CPU inputs become accelerator inputs, and the
// host pool gets `host_memory`; nullptr (with EmulatedHostMemory::off) goes back to the
// device's own engine. Entries stored meanwhile keep the engine they took until restored.
// Process-wide, any thread.
void set_copy_engine_override(std::shared_ptr<CopyEngine> engine, EmulatedHostMemory host_memory);

// Bumped by every set_copy_engine_override: what is done once per process (the host pool's
// pageable warning) is done once per emulated device, as if each were a fresh process.
std::uint64_t emulation_epoch();

}  // namespace spill::detail
