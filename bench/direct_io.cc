#include "direct_io.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "spill/sizing.h"

namespace spill_bench {
namespace {

// One block, one call. A disk file's pread/pwrite is not interrupted by signals (and the
// benchmark installs no handlers); a short count (end of file, full disk) is reported as EIO, not
// resumed: this measures whole-block requests, as the spill paths make them.
int move_block(int fd, char* p, std::uint64_t bytes, std::uint64_t offset, bool write) {
  const auto at = static_cast<off_t>(offset);
  const ssize_t n = write ? pwrite(fd, p, bytes, at) : pread(fd, p, bytes, at);
  if (n < 0) return errno;
  return static_cast<std::uint64_t>(n) == bytes ? 0 : EIO;
}

}  // namespace

DirectFile::DirectFile(const std::string& directory, std::uint64_t bytes) {
  const int flags = O_TMPFILE | O_EXCL | O_RDWR | O_CLOEXEC | O_DIRECT;
  const int fd = open(directory.c_str(), flags, 0600);
  if (fd < 0) return;
  if (fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0) {
    close(fd);
    return;
  }
  fd_ = fd;
}

DirectFile::~DirectFile() {
  if (fd_ >= 0) close(fd_);
}

namespace {
std::uint64_t whole_pages(std::uint64_t bytes) {
  const std::uint64_t page = spill::page_size_bytes();
  return (bytes + page - 1) / page * page;
}
}  // namespace

AlignedBuffer::AlignedBuffer(std::uint64_t bytes)
    : data_(static_cast<char*>(std::aligned_alloc(spill::page_size_bytes(), whole_pages(bytes)))) {
  if (data_ == nullptr) throw std::bad_alloc();
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

int direct_transfer(int fd, char* buffer, std::uint64_t bytes, bool write) {
  std::vector<std::thread> workers;
  std::vector<int> errors(kDirectQueueDepth, 0);
  for (int q = 0; q < kDirectQueueDepth; ++q) {
    workers.emplace_back([&, q] {
      for (std::uint64_t off = q * kDirectBlock; off < bytes;
           off += kDirectQueueDepth * kDirectBlock) {
        const std::uint64_t n = std::min(kDirectBlock, bytes - off);
        const int e = move_block(fd, buffer + off, n, off, write);
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
  DirectFile file(directory, bytes);
  if (!file.ok()) {
    s.error = "O_DIRECT is not supported in " + directory;
    return s;
  }
  AlignedBuffer buffer(bytes);
  std::memset(buffer.data(), 7, bytes);
  Stopwatch w;
  int e = direct_transfer(file.fd(), buffer.data(), bytes, true);
  const double write_s = w.seconds();
  Stopwatch r;
  e = e != 0 ? e : direct_transfer(file.fd(), buffer.data(), bytes, false);
  const double read_s = r.seconds();
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
