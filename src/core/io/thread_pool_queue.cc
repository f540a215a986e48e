// The thread-pool backend of IoQueue: a fixed set of workers doing pread/pwrite/hints, for
// machines and containers where io_uring is not available. See Note [The I/O queue] in
// src/core/io/io_queue.cc; in a fork() child it is inert, see Note [Arenas across fork] in
// src/core/os/fork_guard.cc.
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "core/io/io_queue.h"

namespace spill::detail {
namespace {

class ThreadPoolQueue final : public IoQueue {
 public:
  explicit ThreadPoolQueue(int threads) {
    for (int i = 0; i < threads; ++i) workers_->emplace_back([this] { run(); });
  }

  // A fork() child has none of the workers: nothing to stop, and the members they used are
  // ParentOnly.
  ~ThreadPoolQueue() override {
    if (owner().forked()) return;
    {
      MutexLock lock(mutex_);
      stopping_ = true;
    }
    work_->notify_all();
    for (auto& t : *workers_) t.join();  // workers finish the queue before they stop
  }

  Ticket submit(IoRequest request) override {
    owner().check("a queued transfer");
    auto ticket = std::make_shared<Completion>();
    {
      MutexLock lock(mutex_);
      queue_->push_back(Job{std::move(request), ticket});
      ++in_flight_;
    }
    work_->notify_one();
    return ticket;
  }

  IoBackend backend() const override { return IoBackend::thread_pool; }

  void drain() override {
    if (owner().forked()) return;
    MutexLock lock(mutex_);
    idle_->wait(lock, [this]() REQUIRES(mutex_) { return in_flight_ == 0; });
  }

 private:
  struct Job {
    IoRequest request;
    Ticket ticket;
  };

  void run() {
    MutexLock lock(mutex_);
    for (;;) {
      work_->wait(lock, [this]() REQUIRES(mutex_) { return stopping_ || !queue_->empty(); });
      if (queue_->empty()) return;
      Job job = std::move(queue_->front());
      queue_->pop_front();
      lock.unlock();
      execute(job);
      lock.lock();
      if (--in_flight_ == 0) idle_->notify_all();
    }
  }

  void execute(Job& job) {
    const IoRequest& r = job.request;
    IoStatus status{0, r.op, r.offset, r.bytes};
    if (!r.work_only) {
      const bool data = r.op == IoOp::write || r.op == IoOp::read;
      const int injected = data ? test_hook(r.op) : 0;
      status = injected != 0 ? IoStatus{injected, r.op, r.offset, r.bytes} : run_request(r);
    }
    if (job.request.on_complete) job.request.on_complete(status);
    job.ticket->finish(status);
  }

  Mutex mutex_;
  ParentOnly<std::condition_variable> work_;
  ParentOnly<std::condition_variable> idle_;
  ParentOnly<std::deque<Job>> queue_ GUARDED_BY(mutex_);
  std::uint64_t in_flight_ GUARDED_BY(mutex_) = 0;
  bool stopping_ GUARDED_BY(mutex_) = false;
  ParentOnly<std::vector<std::thread>> workers_;  // last: started after the state above exists
};

}  // namespace

std::unique_ptr<IoQueue> make_thread_pool_queue(int threads) {
  return std::make_unique<ThreadPoolQueue>(threads);
}

}  // namespace spill::detail
