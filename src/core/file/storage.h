// Storage: the bytes under an arena. Two kinds: SpillFile (an unnamed, preallocated, mapped file
// on disk) and HostMemory (anonymous memory, the "offload to RAM" mode). The allocator and the
// arena see only this interface.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

namespace spill::detail {

// memcpy in 512 KiB slices, for copies of host memory and of resident pages of the mapping:
// glibc 2.36 copies a block larger than about 3/4 of the L3 cache with non-temporal stores,
// which moved 64 MiB at 19-20 GB/s on the test VM against 22-24 GB/s in 512 KiB slices (the
// size the hashed copies use too; docs/benchmarks_archive.md, "Copying and hashing in one pass").
constexpr std::uint64_t kCopySliceBytes = 512ull << 10;
inline void copy_in_slices(char* dst, const char* src, std::uint64_t bytes) {
  for (std::uint64_t done = 0; done < bytes; done += kCopySliceBytes) {
    std::memcpy(dst + done, src + done, std::min(kCopySliceBytes, bytes - done));
  }
}

struct StorageInfo {
  std::string directory;         // where the file lives ("" for host memory)
  std::string file_system_type;  // "ext4", ... ("ram" for host memory)
  std::uint64_t capacity_bytes = 0;
  std::uint64_t free_bytes_before = 0;  // free space of the file system when the arena was made
  bool opened_without_name = false;     // never named; false: created then unlinked, or host memory
};

class Storage {
 public:
  virtual ~Storage() = default;
  virtual char* base() const = 0;
  virtual const StorageInfo& info() const = 0;
  // A synchronous bulk write; throws spill::IoError on failure. (Reads go through the I/O engine,
  // or are copied from base() where resident: ArenaCore decides, in one place. A hashed write
  // into host memory (fd() < 0) is copied into base() by ArenaCore, with its hash.)
  virtual void write(std::uint64_t offset, const void* src, std::uint64_t bytes) = 0;
  // Page-cache hints; no-ops where meaningless (host memory). Never throw.
  virtual void start_writeback(std::uint64_t offset, std::uint64_t bytes) = 0;
  virtual void drop_cached_pages(std::uint64_t offset, std::uint64_t bytes) = 0;
  virtual void read_ahead(std::uint64_t offset, std::uint64_t bytes) = 0;
  // Removes this process's page-table entries for the range (the data stays in the file).
  virtual void drop_page_mappings(std::uint64_t offset, std::uint64_t bytes) = 0;
  // Bytes of the range whose pages are in memory (all of it for host memory).
  virtual std::uint64_t resident_bytes(std::uint64_t offset, std::uint64_t bytes) const = 0;
  bool resident(std::uint64_t offset, std::uint64_t bytes) const {
    return resident_bytes(offset, bytes) >= bytes;
  }
  // Descriptors for the I/O engine: buffered, and O_DIRECT (-1 unless direct I/O was asked for
  // and is supported), with the alignment O_DIRECT needs (0 when unknown: the page size does).
  virtual int fd() const { return -1; }
  // Makes the storage `capacity_bytes` long (more than now): the file re-preallocated after a
  // check for free space, or new host memory, mapped anew, so base() changes. Only while no
  // region is live: ArenaCore calls it so (Note [Growing the arena] in
  // src/core/arena/arena_growth.cc). Returns "" when it grew; else why not, in words for a warning,
  // with nothing changed (the old size and mapping stay, nothing is left allocated). Never throws.
  virtual std::string grow(std::uint64_t capacity_bytes) = 0;
  virtual int direct_fd() const { return -1; }
  virtual std::uint64_t direct_alignment() const { return 0; }
};

// HostMemory (host_memory.cc): anonymous, private memory as arena storage (the RAM arena). Pages
// are touched only when written, so capacity costs address space, not RAM, until used. Throws
// spill::InsufficientSpaceError when capacity exceeds physical memory.
std::unique_ptr<Storage> make_host_memory(std::uint64_t capacity_bytes);

}  // namespace spill::detail
