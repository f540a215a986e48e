// IoQueue: the submit/complete split every spill transfer goes through. submit(request) returns
// a ticket at once; ticket->wait() blocks until the operation finished and returns its status.
// Two backends behind one interface: io_uring (io_uring_queue.cc) and a small thread pool
// (thread_pool_queue.cc). See Note [The I/O queue] in src/core/io/io_queue.cc.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "core/os/fork_guard.h"
#include "core/os/mutex.h"
#include "spill/io.h"

namespace spill::detail {

// The outcome of one queued operation.
struct IoStatus {
  int error_number = 0;  // 0: done; else the errno of the failure
  IoOp op = IoOp::write;
  std::uint64_t offset = 0;  // byte offset in the spill file
  std::uint64_t bytes = 0;
};

// One operation's completion, shared by the queue, the ticket and any Pending made from it.
// In a fork() child, a completion of the parent's is never waited for (see Note [Arenas across
// fork] in src/core/os/fork_guard.cc): Pending throws or skips it.
class Completion {
 public:
  void finish(const IoStatus& status);
  // Finishes with a failure that is no errno (a spill::IntegrityError): Pending::wait throws it.
  void fail(const IoStatus& status, std::exception_ptr error);
  bool done() const;
  IoStatus wait() const;
  std::exception_ptr error() const;  // what fail() was given; nullptr otherwise
  const ProcessOwner& owner() const { return owner_; }

 private:
  const ProcessOwner owner_;
  mutable Mutex mutex_;
  mutable ParentOnly<std::condition_variable> finished_;
  bool done_ GUARDED_BY(mutex_) = false;
  IoStatus status_ GUARDED_BY(mutex_);
  std::exception_ptr error_ GUARDED_BY(mutex_);
};
using Ticket = std::shared_ptr<Completion>;

struct IoRequest {
  IoOp op = IoOp::write;
  int fd = -1;
  void* buffer = nullptr;  // source for write, destination for read; unused by hints
  std::uint64_t bytes = 0;
  std::uint64_t offset = 0;
  // Runs on the completing thread before waiters wake (releases staging slots, copies out).
  std::function<void(const IoStatus&)> on_complete;
  // Nothing to move: only on_complete runs, on one of the queue's threads (work beside the
  // caller's, see IoEngine::beside); fd, buffer, bytes and offset are unused, no fault or test
  // hook sees it, and it completes without an error.
  bool work_only = false;
};

class IoQueue {
 public:
  virtual ~IoQueue() = default;
  virtual Ticket submit(IoRequest request) = 0;
  // The pieces of one transfer at once, tickets in the same order. The thread pool queues them
  // one by one; io_uring fills an entry for each, then makes one system call.
  virtual std::vector<Ticket> submit_all(std::vector<IoRequest> requests);
  virtual IoBackend backend() const = 0;
  // Blocks until every submitted operation has completed.
  virtual void drain() = 0;

  // Whether a test hook was set when this queue was made: the operations it is meant to shape
  // then all go through the queue (Note [A small write is made at once] in
  // src/core/arena/arena_core.cc).
  bool has_test_hook() const { return static_cast<bool>(hook_); }

 protected:
  IoQueue();
  // The process this queue serves. In a fork() child, submit throws spill::ForkedProcessError
  // and drain and the destructor return at once: see Note [Arenas across fork] in
  // src/core/os/fork_guard.cc.
  const ProcessOwner& owner() const { return owner_; }
  // The test hook's verdict for an operation about to run (thread pool) or complete (io_uring):
  // 0, or an errno to fail it with. See spill::testing::set_io_test_hook below.
  int test_hook(IoOp op) const { return hook_ ? hook_(op) : 0; }

 private:
  const ProcessOwner owner_;
  std::function<int(IoOp)> hook_;
};

// Throws the spill::IoError for a failed operation: op, offset, bytes, errno and the fix.
[[noreturn]] void throw_io_error(const IoStatus& status);

// Runs a request synchronously with pread/pwrite/... and returns its status (thread-pool body,
// and the io_uring backend's fallback for hint operations).
IoStatus run_request(const IoRequest& request);

// IoBackend::automatic: io_uring where it can be set up, else the thread pool. *why says why
// io_uring was not used ("" when it was). Throws spill::IoError when io_uring was asked for
// explicitly and cannot be set up.
std::unique_ptr<IoQueue> make_io_queue(IoBackend backend, std::string* why);

std::unique_ptr<IoQueue> make_thread_pool_queue(int threads);
// nullptr with *error_number set when io_uring cannot be set up (ENOSYS, EPERM in containers).
std::unique_ptr<IoQueue> make_io_uring_queue(unsigned entries, int* error_number);

}  // namespace spill::detail

// For tests: queued operations that run late or fail, without a failing disk.
//
//   spill::testing::set_io_test_hook([](spill::IoOp op) {
//     return op == spill::IoOp::write ? ENOSPC : 0;  // every queued write fails whole
//   });
//   // ... arenas made now: their queues call the hook ...
//   spill::testing::set_io_test_hook({});  // gone
namespace spill::testing {

// I/O queues created afterwards call `hook` on their worker thread for every read and write,
// before it runs (thread pool) or before its completion is delivered (io_uring). The hook may
// sleep (to shuffle timings) and returns 0, or an errno that fails the whole operation. An empty
// function removes it. Process-wide, callable on any thread; the hook must not throw. See
// Note [The I/O queue] in src/core/io/io_queue.cc. Platform calls have a hook of their own:
// set_fault_hook in core/os/fault_injection.h.
void set_io_test_hook(std::function<int(IoOp op)> hook);

}  // namespace spill::testing
