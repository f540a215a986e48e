#include "core/file/storage.h"

#include <cstring>

#include "core/os/platform.h"
#include "spill/error.h"
#include "spill/units.h"

namespace spill::detail {
namespace {

class HostMemory final : public Storage {
 public:
  HostMemory(char* base, std::uint64_t capacity) : base_(base) {
    info_.file_system_type = "ram";
    info_.capacity_bytes = capacity;
    info_.free_bytes_before = platform::physical_memory_bytes();
  }
  ~HostMemory() override { platform::unmap(base_, info_.capacity_bytes); }

  char* base() const override { return base_; }
  const StorageInfo& info() const override { return info_; }
  void write(std::uint64_t offset, const void* src, std::uint64_t bytes) override {
    copy_in_slices(base_ + offset, static_cast<const char*>(src), bytes);
  }
  void start_writeback(std::uint64_t, std::uint64_t) override {}
  void drop_cached_pages(std::uint64_t, std::uint64_t) override {}
  void read_ahead(std::uint64_t, std::uint64_t) override {}
  void drop_page_mappings(std::uint64_t, std::uint64_t) override {}
  std::uint64_t resident_bytes(std::uint64_t, std::uint64_t bytes) const override { return bytes; }
  // Nothing is live, so nothing is copied: new memory, the old given back.
  std::string grow(std::uint64_t capacity_bytes) override {
    const std::uint64_t physical = platform::physical_memory_bytes();
    if (capacity_bytes > physical) {
      return "a RAM arena of " + bytes_with_units(capacity_bytes) +
             " would exceed this machine's " + bytes_with_units(physical) + " of physical memory";
    }
    void* base = nullptr;
    if (int e = platform::map_anonymous(capacity_bytes, &base); e != 0) {
      return "reserving " + bytes_with_units(capacity_bytes) +
             " of host memory failed: " + std::strerror(e);
    }
    platform::unmap(base_, info_.capacity_bytes);
    base_ = static_cast<char*>(base);
    info_.capacity_bytes = capacity_bytes;
    return "";
  }

 private:
  char* base_;
  StorageInfo info_;
};

}  // namespace

std::unique_ptr<Storage> make_host_memory(std::uint64_t capacity_bytes) {
  const std::uint64_t physical = platform::physical_memory_bytes();
  if (capacity_bytes > physical) {
    throw InsufficientSpaceError(
        "<host memory>", capacity_bytes, physical,
        "spill: a RAM arena of " + bytes_with_units(capacity_bytes) + " exceeds this machine's " +
            bytes_with_units(physical) +
            " of physical memory; use the disk backing or lower capacity_bytes");
  }
  void* base = nullptr;
  if (int e = platform::map_anonymous(capacity_bytes, &base); e != 0) {
    throw InsufficientSpaceError("<host memory>", capacity_bytes, physical,
                                 "spill: could not reserve " + std::to_string(capacity_bytes) +
                                     " bytes of host memory: " + std::strerror(e));
  }
  return std::make_unique<HostMemory>(static_cast<char*>(base), capacity_bytes);
}

}  // namespace spill::detail
