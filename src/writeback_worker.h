// WritebackWorker: one background thread per disk arena that starts writeback of freshly
// written ranges and drops old ones from the page cache, so the thread that wrote them (the
// training loop) never waits on the disk queue. See Note [Asynchronous writeback].
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>

#include "storage.h"

namespace spill::detail {

class WritebackWorker {
 public:
  // page_cache_limit_bytes == 0: start writeback only, never drop.
  WritebackWorker(Storage* storage, bool start_writeback, std::uint64_t page_cache_limit_bytes);
  ~WritebackWorker();  // finishes the queued work, then joins
  WritebackWorker(const WritebackWorker&) = delete;
  WritebackWorker& operator=(const WritebackWorker&) = delete;

  void written(std::uint64_t offset, std::uint64_t bytes);  // never blocks on I/O

 private:
  struct Range {
    std::uint64_t offset;
    std::uint64_t bytes;
  };
  void run();
  void process(const Range& r);

  Storage* storage_;
  const bool start_writeback_;
  const std::uint64_t limit_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Range> queue_;
  bool stopping_ = false;
  std::deque<Range> cached_;  // written ranges still counted against the limit, oldest first
  std::uint64_t cached_bytes_ = 0;
  std::thread thread_;
};

}  // namespace spill::detail
