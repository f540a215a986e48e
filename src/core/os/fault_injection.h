// The fault hook at the platform seam, for tests: it makes the library's system calls misbehave
// on purpose, so a test can prove what happens when a disk does: pwrite/pread, io_uring pieces,
// the unnamed open and fallocate return short counts or errors. Internal (not installed); tests
// reach it with src/ on their include path. Queued operations have a hook of their own,
// spill::testing::set_io_test_hook in core/io/io_queue.h.
//
//   #include "core/os/fault_injection.h"
//   spill::testing::set_fault_hook([](spill::testing::FaultSite site, std::uint64_t bytes,
//                                     std::uint64_t /*offset*/) -> std::int64_t {
//     if (site == spill::testing::FaultSite::pread) return -EIO;  // every pread fails
//     return static_cast<std::int64_t>(std::max<std::uint64_t>(bytes / 2, 1));  // others: half
//   });
//   // ... arena.allocate(...), write, read: the hook decides ...
//   spill::testing::set_fault_hook({});  // gone
//
// The hook is process-wide and may be called on any thread, concurrently; it must not throw.
#pragma once

#include <cstdint>
#include <functional>

namespace spill::testing {

// The calls the fault hook may shape: the pwrite/pread of synchronous and thread-pool transfers,
// a read or write piece submitted to io_uring, and the open of a spill file without a name
// (O_TMPFILE: the platform seam's open_unnamed, Note [Unnamed spill file]).
enum class FaultSite { pwrite, pread, ring_write, ring_read, open_unnamed, preallocate };

// Called before each such call with the bytes it asks for (0 for open_unnamed; the file's new
// size for preallocate, which fails with -errno or runs whole) and its file offset.
// Returns what the call may do: `bytes` (all of it), fewer (a real short count: only that many
// move), 0 (nothing moves: end of file), or -errno (it fails and moves nothing). May sleep.
// The sign is the call's own: one number that is either a count or a failure, as pwrite and
// io_uring's cqe->res return it. The I/O test hook (core/io/io_queue.h) only ever fails, so it
// returns a positive errno, as the platform seam (src/core/os/platform.h) does.
using FaultHook =
    std::function<std::int64_t(FaultSite site, std::uint64_t bytes, std::uint64_t offset)>;

// Installs `hook` for every call from now on (any thread); an empty function removes it. Not
// installed, each call pays one relaxed atomic load. See Note [Fault injection at the seam] in
// src/core/os/fault_injection.cc.
void set_fault_hook(FaultHook hook);

}  // namespace spill::testing
