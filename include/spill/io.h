// Asynchronous I/O on arena regions: a write or read that returns before the bytes moved, and the
// handle that says when they did.
//
//   #include <spill/arena.h>                       // SpillArena, Region
//   spill::ArenaOptions options;
//   options.capacity_bytes = 1ull << 30;
//   options.io = spill::IoMode::direct;             // O_DIRECT through a staging pool
//   spill::SpillArena arena(options);
//   spill::Region r = arena.allocate(bytes);
//   spill::Pending w = r.write_async(src, bytes);   // src stays valid until w completes
//   // ... compute ...
//   w.wait();  // throws spill::IoError {op, offset, bytes, errno}
//   spill::Pending rd = r.read_async(dst, bytes);
//   if (!rd.ready()) rd.wait();
//   std::cout << spill::to_string(arena.stats().io_backend);  // "io_uring" or "thread_pool"
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace spill {

// How spilled bytes travel. See Note [Direct I/O and the staging pool] in src/core/io/io_engine.cc.
enum class IoMode {
  buffered,   // through the page cache; restores copy out of the mapping (guarded, verified)
  direct,     // O_DIRECT through a preallocated staging pool: spilled bytes never sit in RAM
  automatic,  // direct when the arena is larger than the memory this process may use
  // GPUDirect Storage through cuFile: device memory straight to the file (libcufile, loaded at
  // run time; see Note [GPUDirect Storage] in src/core/io/gds.cc). Never chosen by automatic.
  // Host-side I/O of such an arena runs as direct.
  gds,
};

// What executes the queued operations. See Note [The I/O queue] in src/core/io/io_queue.cc.
enum class IoBackend {
  automatic,    // io_uring where io_uring_setup works, else the thread pool
  io_uring,     // liburing; asked for explicitly, failure to set it up is an error
  thread_pool,  // a few worker threads doing pread/pwrite
};

enum class IoOp { write, read, writeback, drop };

// The names the library, the CLI and Python use; "?" past the last value.
const char* to_string(IoMode mode);
const char* to_string(IoBackend backend);
const char* to_string(IoOp op);

namespace detail {
class Completion;
class IoEngine;
}  // namespace detail

// A readiness handle for an asynchronous write or read: one or more queued operations. A
// default-constructed Pending is complete. Copies share the same operations.
class Pending {
 public:
  Pending() = default;

  bool ready() const;  // every operation finished (successfully or not); never blocks
  // Blocks until every operation finished; throws spill::IoError naming the op, offset, bytes
  // and errno of the first that failed, or the spill::IntegrityError of a read whose bytes
  // failed their check (ArenaOptions::verify_integrity).
  void wait() const;
  // Blocks until every operation finished, without reporting failures (for destructors).
  void settle() const noexcept;
  // This handle then also covers `other`'s operations; finished ones are forgotten.
  void add(const Pending& other);

 private:
  friend class detail::IoEngine;  // makes them from its queue's completions
  explicit Pending(std::vector<std::shared_ptr<detail::Completion>> parts);

  std::vector<std::shared_ptr<detail::Completion>> parts_;
};

}  // namespace spill
