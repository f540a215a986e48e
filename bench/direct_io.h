// O_DIRECT transfers with plain synchronous calls: the disk's own limit, which the spill paths
// are measured against (BM_RoundTrip/direct_io, BM_Regime's direct_io counters).
//
//   spill_bench::AlignedBuffer buf(bytes);
//   spill_bench::DirectIoSpeed s = spill_bench::measure_direct_io(spill_dir(), bytes);
//   if (s.error.empty()) std::cout << s.write_Bps << " " << s.read_Bps;
#pragma once

#include <cstdint>
#include <string>

namespace spill_bench {

constexpr std::uint64_t kDirectBlock = 4ull << 20;
constexpr int kDirectQueueDepth = 4;

// Page-aligned heap memory, as O_DIRECT needs.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(std::uint64_t bytes);
  ~AlignedBuffer();
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data() const { return data_; }

 private:
  char* data_;
};

// Moves [0, bytes) between `buffer` and `fd` in kDirectBlock pieces, kDirectQueueDepth threads
// each taking every kDirectQueueDepth-th block: that many requests in flight. 0 or an errno.
int direct_transfer(int fd, char* buffer, std::uint64_t bytes, bool write);

struct DirectIoSpeed {
  double write_Bps = 0;
  double read_Bps = 0;
  double round_trip_Bps = 0;  // 2 * bytes / (write + read time)
  std::string error;          // non-empty when O_DIRECT is unavailable or a transfer failed
};

// Writes then reads `bytes` through a fresh unnamed O_DIRECT file in `directory`.
DirectIoSpeed measure_direct_io(const std::string& directory, std::uint64_t bytes);

}  // namespace spill_bench
