// The io_uring backend of IoQueue (liburing). Reads and writes go to the kernel's ring; one
// completion thread reaps them. Page-cache hints (writeback, drop, readahead) block in ways the
// ring cannot chain cheaply, so they run on one helper thread. See Note [The I/O queue] in
// src/core/io/io_queue.cc; a fork() child shares the ring but must not use it, see Note [Arenas
// across fork] in src/core/os/fork_guard.cc.
#include "core/io/io_queue.h"

#ifdef SPILLARENA_HAVE_LIBURING

#include <errno.h>
#include <liburing.h>

#include <algorithm>
#include <thread>
#include <utility>
#include <vector>

#include "core/os/platform.h"

namespace spill::detail {
namespace {

// io_uring lengths are 32-bit; larger transfers go in pieces of this size.
constexpr std::uint64_t kMaxPieceBytes = 1ull << 30;

// Completions the reaper takes from the ring at a time (one lock for all of them).
constexpr unsigned kReapBatch = 64;

struct Operation {
  IoRequest request;
  Ticket ticket;
  std::uint64_t done_bytes = 0;
  unsigned piece = 0;      // bytes of the entry in flight
  int injected_error = 0;  // the fault hook's errno for the piece in flight (a nop): tests only
};

class IoUringQueue final : public IoQueue {
 public:
  // init_error() != 0: the ring could not be set up and the object must be discarded.
  explicit IoUringQueue(unsigned entries) {
    const int r = io_uring_queue_init(entries, &ring_, 0);
    if (r < 0) {
      init_error_ = -r;
      return;
    }
    hints_ = make_thread_pool_queue(1);
    *reaper_ = std::thread([this] { reap(); });
  }
  int init_error() const { return init_error_; }

  ~IoUringQueue() override {
    if (init_error_ != 0) return;
    if (owner().forked()) {
      // The ring is the parent's: a stop message put on it would stop the parent's reaper, and
      // this process has no reaper to stop. Only the child's mapping and descriptor of the ring
      // are released; the hints' pool is inert in its own destructor.
      io_uring_queue_exit(&ring_);
      return;
    }
    drain();
    {
      MutexLock lock(submit_mutex_);
      io_uring_sqe* sqe = next_sqe();
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data(sqe, nullptr);  // the reaper's stop signal
      io_uring_submit(&ring_);
    }
    reaper_->join();
    io_uring_queue_exit(&ring_);
  }

  Ticket submit(IoRequest request) override {
    std::vector<IoRequest> one;
    one.push_back(std::move(request));
    return submit_all(std::move(one)).front();
  }

  std::vector<Ticket> submit_all(std::vector<IoRequest> requests) override {
    owner().check("a queued transfer");  // the child's submission would reach the parent's reaper
    std::vector<Ticket> tickets;
    std::vector<Operation*> ops;
    for (IoRequest& request : requests) {
      if (!request.work_only && request.op != IoOp::write && request.op != IoOp::read) {
        tickets.push_back(hints_->submit(std::move(request)));
        continue;
      }
      ops.push_back(new Operation{std::move(request), std::make_shared<Completion>()});
      tickets.push_back(ops.back()->ticket);
    }
    {
      MutexLock lock(count_mutex_);
      in_flight_ += ops.size();
    }
    enqueue(ops);
    return tickets;
  }

  IoBackend backend() const override { return IoBackend::io_uring; }

  void drain() override {
    if (owner().forked()) return;
    {
      MutexLock lock(count_mutex_);
      idle_->wait(lock, [this]() REQUIRES(count_mutex_) { return in_flight_ == 0; });
    }
    hints_->drain();
  }

 private:
  io_uring_sqe* next_sqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (sqe == nullptr) {  // submission ring full: hand what is there to the kernel
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
    }
    return sqe;
  }

  // Sizes the next piece of `op`: what is left, at most kMaxPieceBytes, and no more than the
  // fault hook lets through (see Note [Fault injection at the seam] in
  // src/core/os/fault_injection.cc).
  static void plan_piece(Operation* op) {
    const IoRequest& r = op->request;
    if (r.work_only) return;  // a nop: nothing to size, nothing to fail
    const std::uint64_t at = op->done_bytes;
    const auto site =
        r.op == IoOp::write ? testing::FaultSite::ring_write : testing::FaultSite::ring_read;
    const std::int64_t verdict =
        platform::fault_verdict(site, std::min(r.bytes - at, kMaxPieceBytes), r.offset + at);
    op->injected_error = verdict < 0 ? static_cast<int>(-verdict) : 0;
    op->piece = static_cast<unsigned>(std::max<std::int64_t>(verdict, 0));
  }

  void prepare_entry(Operation* op) REQUIRES(submit_mutex_) {
    const IoRequest& r = op->request;
    const std::uint64_t at = op->done_bytes;
    char* buffer = static_cast<char*>(r.buffer) + at;
    io_uring_sqe* sqe = next_sqe();
    if (op->injected_error != 0 || r.work_only) {  // work only: the reaper runs it on completion
      io_uring_prep_nop(sqe);
    } else if (r.op == IoOp::write) {
      io_uring_prep_write(sqe, r.fd, buffer, op->piece, r.offset + at);
    } else {
      io_uring_prep_read(sqe, r.fd, buffer, op->piece, r.offset + at);
    }
    io_uring_sqe_set_data(sqe, op);
  }

  // Note [One submission per transfer]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A transfer is cut into pieces (Note [Parallel reads from disk] in src/core/io/io_engine.cc): a
  // 64 MiB input is 16 entries. Each entry is filled under the submission lock, and the ring is
  // handed to the kernel once for all of them (liburing's get-sqe / submit split); the reaper in
  // turn takes every completion the ring holds, up to kReapBatch, under one lock. A piece that
  // comes back short is resubmitted alone.
  void enqueue(const std::vector<Operation*>& ops) {
    if (ops.empty()) return;
    for (Operation* op : ops) plan_piece(op);
    MutexLock lock(submit_mutex_);
    for (Operation* op : ops) prepare_entry(op);
    io_uring_submit(&ring_);
  }

  void reap() {
    io_uring_cqe* batch[kReapBatch];
    std::pair<Operation*, int> taken[kReapBatch];
    for (;;) {
      io_uring_cqe* first = nullptr;
      if (io_uring_wait_cqe(&ring_, &first) != 0) continue;  // EINTR
      const unsigned n = io_uring_peek_batch_cqe(&ring_, batch, kReapBatch);
      for (unsigned i = 0; i < n; ++i) {
        taken[i] = {static_cast<Operation*>(io_uring_cqe_get_data(batch[i])), batch[i]->res};
      }
      io_uring_cq_advance(&ring_, n);
      // The submitter wrote each *op before handing it to the kernel under submit_mutex_; taking
      // the mutex here makes that ordering visible to the memory model (and ThreadSanitizer),
      // which cannot see through the ring.
      {
        MutexLock ordered(submit_mutex_);
      }
      bool stop = false;
      for (unsigned i = 0; i < n; ++i) {
        Operation* op = taken[i].first;
        if (op == nullptr) {
          stop = true;  // sent after drain(): nothing else is in flight
          continue;
        }
        advance(op, op->injected_error != 0 ? -op->injected_error : taken[i].second);
      }
      if (stop) return;
    }
  }

  // A completion: resubmit the rest after a short transfer or an interruption, else finish.
  void advance(Operation* op, int res) {
    const IoRequest& r = op->request;
    if (r.work_only) return finish(op, IoStatus{0, r.op, r.offset, r.bytes});
    if (res == -EINTR || res == -EAGAIN) return enqueue({op});
    int error = res < 0 ? -res : 0;
    if (res == 0 && op->request.bytes > op->done_bytes) error = EIO;  // no progress
    if (error == 0) {
      op->done_bytes += static_cast<std::uint64_t>(res);
      if (op->done_bytes < op->request.bytes) return enqueue({op});
    }
    finish(op, IoStatus{error, op->request.op, op->request.offset, op->request.bytes});
  }

  void finish(Operation* op, IoStatus status) {
    const int injected = op->request.work_only ? 0 : test_hook(status.op);
    if (injected != 0 && status.error_number == 0) {
      status.error_number = injected;
    }
    if (op->request.on_complete) op->request.on_complete(status);
    op->ticket->finish(status);
    delete op;
    MutexLock lock(count_mutex_);
    if (--in_flight_ == 0) idle_->notify_all();
  }

  io_uring ring_{};
  int init_error_ = 0;
  Mutex submit_mutex_;  // guards the submission side of ring_ (shared with the reaper)
  Mutex count_mutex_;
  ParentOnly<std::condition_variable> idle_;
  std::uint64_t in_flight_ GUARDED_BY(count_mutex_) = 0;
  std::unique_ptr<IoQueue> hints_;
  ParentOnly<std::thread> reaper_;  // the only reader of the completion side of ring_
};

}  // namespace

std::unique_ptr<IoQueue> make_io_uring_queue(unsigned entries, int* error_number) {
  auto queue = std::make_unique<IoUringQueue>(entries);
  *error_number = queue->init_error();
  if (*error_number != 0) return nullptr;
  return queue;
}

}  // namespace spill::detail

#else  // built without liburing

#include <errno.h>

namespace spill::detail {
std::unique_ptr<IoQueue> make_io_uring_queue(unsigned, int* error_number) {
  *error_number = ENOSYS;
  return nullptr;
}
}  // namespace spill::detail

#endif
