#include "direct_io.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "platform.h"

namespace spill_bench {

AlignedBuffer::AlignedBuffer(std::uint64_t bytes)
    : data_(static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096))) {
  if (data_ == nullptr) throw std::bad_alloc();
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

int direct_transfer(int fd, char* buffer, std::uint64_t bytes, bool write) {
  std::vector<std::thread> workers;
  std::vector<int> errors(kDirectQueueDepth, 0);
  for (int q = 0; q < kDirectQueueDepth; ++q) {
    workers.emplace_back([&, q] {
      for (std::uint64_t off = q * kDirectBlock; off < bytes; off += kDirectQueueDepth * kDirectBlock) {
        const std::uint64_t n = std::min(kDirectBlock, bytes - off);
        const int e = write ? spill::platform::write_at(fd, buffer + off, n, off)
                            : spill::platform::read_at(fd, buffer + off, n, off);
        if (e != 0) errors[q] = e;
      }
    });
  }
  for (auto& w : workers) w.join();
  for (int e : errors) {
    if (e != 0) return e;
  }
  return 0;
}

DirectIoSpeed measure_direct_io(const std::string& directory, std::uint64_t bytes) {
  DirectIoSpeed s;
  int fd = -1;
  if (spill::platform::open_unnamed_direct_file(directory, &fd) != 0 ||
      spill::platform::preallocate(fd, bytes) != 0) {
    if (fd >= 0) spill::platform::close_file(fd);
    s.error = "O_DIRECT is not supported in " + directory;
    return s;
  }
  AlignedBuffer buffer(bytes);
  std::memset(buffer.data(), 7, bytes);
  Stopwatch w;
  int e = direct_transfer(fd, buffer.data(), bytes, true);
  const double write_s = w.seconds();
  Stopwatch r;
  e = e != 0 ? e : direct_transfer(fd, buffer.data(), bytes, false);
  const double read_s = r.seconds();
  spill::platform::close_file(fd);
  if (e != 0) {
    s.error = std::strerror(e);
    return s;
  }
  s.write_Bps = static_cast<double>(bytes) / write_s;
  s.read_Bps = static_cast<double>(bytes) / read_s;
  s.round_trip_Bps = 2.0 * static_cast<double>(bytes) / (write_s + read_s);
  return s;
}

}  // namespace spill_bench
