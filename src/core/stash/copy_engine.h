// The seam for copies between an accelerator and host memory, and for the memory on each side.
// Each front end brings its own engine (src/torch_layer/stream_engine.cc queues copies on a side
// stream through c10's device-generic interfaces); the stash calls only this interface. A test
// installs another in its place (set_copy_engine_override): the emulated engine of
// tests/support/accelerator_emulation.cc copies host memory on a thread of its own after random
// delays, so CI exercises the stash's accelerator path — budget, back-pressure, release timing,
// lifetimes — without a GPU.
//
//   spill::detail::CopyPtr c = engine->to_host(input, 0, bytes, lease.host());
//   c->synchronize();                 // the host waits; or poll c->done()
//   c = engine->to_device(lease.host(), output, 0);
//   c->order_current_stream();        // compute waits for the copy; the host does not
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "buffer.h"

namespace spill::detail {

// One queued copy. It keeps the buffers it reads and writes alive until it completed.
class Copy {
 public:
  virtual ~Copy() = default;
  virtual bool done() const = 0;            // never blocks
  virtual void synchronize() const = 0;     // blocks the host until done
  virtual void order_current_stream() = 0;  // later work on the current stream waits for it
};
using CopyPtr = std::shared_ptr<Copy>;

// Waits for `copy`, if any, without reporting a failure (for destructors): a device error is
// reported by whatever uses the device next.
void settle_copy(const CopyPtr& copy) noexcept;

// Says why device memory was wanted, given the allocator's own words: the out-of-memory
// error's message names the input and the fix.
using ExplainOutOfMemory = std::function<std::string(const std::string& cause)>;

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  // Bytes [offset, offset + bytes) of `source` into `host` (`bytes` long), ordered after the
  // work already queued on the current stream.
  virtual CopyPtr to_host(const Buffer& source, std::uint64_t offset, std::uint64_t bytes,
                          const Buffer& host) = 0;
  // `host` into bytes [offset, offset + host.bytes()) of `dest`.
  virtual CopyPtr to_device(const Buffer& host, const Buffer& dest, std::uint64_t offset) = 0;

  // Completes when the work queued so far on `device`'s current stream has (for transfers that
  // bypass streams, such as cuFile's).
  virtual CopyPtr marker(const Device& device) = 0;

  // `bytes` of `device` memory to restore into. Out of memory, the front end's own error type
  // (trainers catch it to lower the batch size) with explain(its message) as the message.
  virtual Buffer empty(const Device& device, std::uint64_t bytes,
                       const ExplainOutOfMemory& explain) = 0;

  // Page-locked host memory for the host pool, or an undefined Buffer where pinning is refused
  // (over RLIMIT_MEMLOCK, no driver) or the device has nothing to pin for.
  virtual Buffer pinned_host(std::uint64_t bytes) = 0;

  // The override while a test installed one (set_copy_engine_override), else nullptr.
  static std::shared_ptr<CopyEngine> override_engine();
  // True while an override is installed: every input takes the accelerator path.
  static bool overridden();
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
