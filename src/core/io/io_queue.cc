#include "core/io/io_queue.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "core/file/io_advice.h"
#include "core/os/platform.h"
#include "core/text/enum_names.h"
#include "spill/error.h"

namespace spill {

// Note [The I/O queue]
// ~~~~~~~~~~~~~~~~~~~~
// Every transfer between memory and the spill file is a queued operation with a completion:
// the training thread submits and goes on computing; a worker (io_uring's kernel side, or one
// of a few pool threads) moves the bytes; whoever needs the result waits on its ticket. The
// pool exists because containers often forbid io_uring (seccomp, io_uring_disabled); the
// automatic choice probes io_uring_setup once per arena and says which one runs
// (ArenaStats::io_backend). No thread is ever created per operation.

const char* to_string(IoMode mode) {
  return name_in({"buffered", "direct", "automatic", "gds"}, mode);
}
const char* to_string(IoOp op) { return name_in({"write", "read", "writeback", "drop"}, op); }
const char* to_string(IoBackend backend) {
  return name_in({"automatic", "io_uring", "thread_pool"}, backend);
}

using detail::IoStatus;

Pending::Pending(std::vector<std::shared_ptr<detail::Completion>> parts)
    : parts_(std::move(parts)) {}

bool Pending::ready() const {
  for (const auto& p : parts_) {
    p->owner().check("Pending::ready");
    if (!p->done()) return false;
  }
  return true;
}

// Every part is waited for before the first failure is thrown: the caller may free the buffer
// as soon as wait() returns or throws, so no later part may still be moving bytes into it.
void Pending::wait() const {
  for (const auto& p : parts_) p->owner().check("Pending::wait");
  for (const auto& p : parts_) p->wait();
  for (const auto& p : parts_) {
    const IoStatus s = p->wait();
    if (std::exception_ptr e = p->error()) std::rethrow_exception(e);
    if (s.error_number != 0) detail::throw_io_error(s);
  }
}

// A fork() child never waits for the parent's operations: nothing there would finish them.
void Pending::settle() const noexcept {
  for (const auto& p : parts_) {
    if (!p->owner().forked()) p->wait();
  }
}

void Pending::add(const Pending& other) {
  parts_.erase(std::remove_if(parts_.begin(), parts_.end(),
                              [](const auto& p) { return !p->owner().forked() && p->done(); }),
               parts_.end());
  parts_.insert(parts_.end(), other.parts_.begin(), other.parts_.end());
}

namespace detail {

void Completion::finish(const IoStatus& status) {
  {
    MutexLock lock(mutex_);
    status_ = status;
    done_ = true;
  }
  finished_->notify_all();
}

void Completion::fail(const IoStatus& status, std::exception_ptr error) {
  {
    MutexLock lock(mutex_);
    error_ = std::move(error);
  }
  finish(status);
}

std::exception_ptr Completion::error() const {
  MutexLock lock(mutex_);
  return error_;
}

bool Completion::done() const {
  MutexLock lock(mutex_);
  return done_;
}

IoStatus Completion::wait() const {
  MutexLock lock(mutex_);
  finished_->wait(lock, [this]() REQUIRES(mutex_) { return done_; });
  return status_;
}

// See Note [EFBIG is a size limit, not a disk] in src/core/file/io_advice.h.
void throw_io_error(const IoStatus& s) {
  throw transfer_error(to_string(s.op), s.op, s.error_number, s.bytes, s.offset);
}

namespace {
Mutex hook_mutex;
std::function<int(IoOp)> hook_for_new_queues GUARDED_BY(hook_mutex);
}  // namespace

IoQueue::IoQueue() {
  MutexLock lock(hook_mutex);
  hook_ = hook_for_new_queues;
}

std::vector<Ticket> IoQueue::submit_all(std::vector<IoRequest> requests) {
  std::vector<Ticket> tickets;
  tickets.reserve(requests.size());
  for (IoRequest& r : requests) tickets.push_back(submit(std::move(r)));
  return tickets;
}

IoStatus run_request(const IoRequest& r) {
  IoStatus s{0, r.op, r.offset, r.bytes};
  switch (r.op) {
    case IoOp::write:
      s.error_number = platform::write_at(r.fd, r.buffer, r.bytes, r.offset);
      break;
    case IoOp::read:
      s.error_number = platform::read_at(r.fd, r.buffer, r.bytes, r.offset);
      break;
    case IoOp::writeback:
      s.error_number = platform::start_writeback(r.fd, r.offset, r.bytes);
      break;
    case IoOp::drop:
      s.error_number = platform::drop_cached_pages(r.fd, r.offset, r.bytes);
      break;
  }
  return s;
}

std::unique_ptr<IoQueue> make_io_queue(IoBackend backend, std::string* why) {
  constexpr unsigned kRingEntries = 128;
  constexpr int kPoolThreads = 4;
  why->clear();
  if (backend == IoBackend::thread_pool) return make_thread_pool_queue(kPoolThreads);
  int e = 0;
  if (auto ring = make_io_uring_queue(kRingEntries, &e)) return ring;
  if (backend == IoBackend::io_uring) {
    throw IoError(e, std::string("spill: ArenaOptions::io_backend = io_uring, but io_uring cannot "
                                 "be set up here: ") +
                         std::strerror(e) +
                         " (containers often forbid it); use IoBackend::automatic or thread_pool");
  }
  *why = std::string("io_uring unavailable: ") + std::strerror(e);
  return make_thread_pool_queue(kPoolThreads);
}

}  // namespace detail

void testing::set_io_test_hook(std::function<int(IoOp)> hook) {
  detail::MutexLock lock(detail::hook_mutex);
  detail::hook_for_new_queues = std::move(hook);
}

}  // namespace spill
