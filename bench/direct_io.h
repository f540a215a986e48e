// O_DIRECT transfers with plain synchronous calls: the disk's own limit, which the spill paths
// are measured against (BM_RoundTrip/direct_io, BM_Regime's direct_io counters). The benchmark
// makes its own calls (direct_io.cc); the library exports no O_DIRECT file of its own.
//
//   spill_bench::DirectIoSpeed s = spill_bench::measure_direct_io(spill_dir(), bytes);
//   if (s.error.empty()) std::cout << s.write_Bps << " " << s.read_Bps;
//   spill_bench::DirectFile file(spill_dir(), bytes);   // or by hand:
//   spill_bench::AlignedBuffer buf(bytes);
//   if (file.ok()) direct_transfer(file.fd(), buf.data(), bytes, /*write=*/true);
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

// A new unnamed file of `bytes` in `directory`, opened O_TMPFILE | O_EXCL | O_DIRECT (mode 0600)
// and preallocated; closed when it dies. ok() is false where the file system refuses any of it.
class DirectFile {
 public:
  DirectFile(const std::string& directory, std::uint64_t bytes);
  ~DirectFile();
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;
  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
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
