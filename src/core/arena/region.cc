#include <string>

#include "core/arena/arena_core.h"
#include "spill/arena.h"

namespace spill {

Region::Region(std::shared_ptr<detail::ArenaCore> core, std::uint64_t offset, std::uint64_t size,
               std::uint64_t requested)
    : core_(std::move(core)), offset_(offset), size_(size), requested_(requested) {}

Region::Region(Region&& other) noexcept
    : core_(std::move(other.core_)),
      offset_(other.offset_),
      size_(other.size_),
      requested_(other.requested_),
      in_flight_(std::move(other.in_flight_)),
      ahead_destination_(other.ahead_destination_),
      ahead_(std::move(other.ahead_)),
      overflow_hold_(std::move(other.overflow_hold_)) {
  other.core_ = nullptr;
}

Region& Region::operator=(Region&& other) noexcept {
  if (this != &other) {
    free();
    core_ = std::move(other.core_);
    other.core_ = nullptr;
    offset_ = other.offset_;
    size_ = other.size_;
    requested_ = other.requested_;
    in_flight_ = std::move(other.in_flight_);
    ahead_destination_ = other.ahead_destination_;
    ahead_ = std::move(other.ahead_);
    overflow_hold_ = std::move(other.overflow_hold_);
  }
  return *this;
}

Region::~Region() { free(); }

// A queued write or read still targets this region's bytes: the block goes back to the
// allocator (and to the next layer's forward) only after it completed. Its failure, if any, is
// reported by its own Pending and by every write or read of the arena while this region lives;
// once freed here it is forgotten (see Note [Failures last until freed] in
// src/core/io/io_engine.cc).
void Region::free() {
  overflow_hold_.reset();
  if (!core_) return;
  in_flight_.settle();
  in_flight_ = Pending();
  ahead_destination_ = nullptr;
  ahead_ = Pending();
  core_->free(Block{offset_, size_});
  core_ = nullptr;
}

detail::ArenaCore& Region::core_or_throw() const {
  if (!core_) throw MovedFromRegionError("spill: use of a moved-from or freed Region");
  return *core_;
}

std::uint64_t Region::offset() const {
  core_or_throw();
  return offset_;
}

std::uint64_t Region::size() const {
  core_or_throw();
  return size_;
}

std::uint64_t Region::requested_bytes() const {
  core_or_throw();
  return requested_;
}

namespace {
void check_range(std::uint64_t size, std::uint64_t bytes, std::uint64_t offset_in_region) {
  if (offset_in_region > size || bytes > size - offset_in_region) {
    throw InvalidArgumentError("spill: access of " + std::to_string(bytes) + " bytes at offset " +
                               std::to_string(offset_in_region) + " overruns a region of " +
                               std::to_string(size) + " bytes; allocate a larger region");
  }
}
}  // namespace

void Region::write(const void* src, std::uint64_t bytes, std::uint64_t offset_in_region) {
  core_or_throw();
  check_range(size_, bytes, offset_in_region);
  core_->write(offset_, offset_in_region, src, bytes);
}

void Region::read(void* dst, std::uint64_t bytes, std::uint64_t offset_in_region) const {
  core_or_throw();
  check_range(size_, bytes, offset_in_region);
  core_->read(offset_, offset_in_region, dst, bytes);
}

Pending Region::write_async(const void* src, std::uint64_t bytes, std::uint64_t offset_in_region) {
  core_or_throw();
  check_range(size_, bytes, offset_in_region);
  Pending p = core_->write_async(offset_, offset_in_region, src, bytes);
  in_flight_.add(p);
  return p;
}

Pending Region::read_async(void* dst, std::uint64_t bytes, std::uint64_t offset_in_region) {
  core_or_throw();
  check_range(size_, bytes, offset_in_region);
  Pending p = core_->read_async(offset_, offset_in_region, dst, bytes);
  in_flight_.add(p);
  return p;
}

void Region::write_from_device(const void* device_ptr, std::uint64_t bytes,
                               std::uint64_t offset_in_region) {
  core_or_throw();
  check_range(size_, bytes, offset_in_region);
  core_->write_from_device(offset_, offset_in_region, device_ptr, bytes);
}

void Region::read_to_device(void* device_ptr, std::uint64_t bytes, std::uint64_t offset_in_region) {
  core_or_throw();
  check_range(size_, bytes, offset_in_region);
  core_->read_to_device(offset_, offset_in_region, device_ptr, bytes);
}

}  // namespace spill

namespace spill {

// Note [One call each way]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// The stash (src/core/stash/cpu_path.cc) calls the arena once per input going forward
// (SpillArena::spill_from: allocate, queue the write) and once coming back (take_into: wait for
// the write, read — through the mapping when the pages are resident, else the I/O engine —
// check the hash, free). What a read involves (the I/O mode, residency, integrity, the order of
// a write and a read of the same region) stays in the core, and the stash's restore is one line.
// The one hint besides is read_ahead, which a restore gives its own region and then its
// predecessors' (prefetch_depth) before it waits: a direct arena reads them into the tensors
// they will become, take_into then only waits.

Pending Region::pending() const {
  core_or_throw();
  return in_flight_;
}

bool Region::take_into(void* dst, std::uint64_t bytes) {
  detail::ArenaCore& core = core_or_throw();
  check_range(size_, bytes, 0);
  const bool read_ahead_here = dst != nullptr && dst == ahead_destination_ && bytes == requested_;
  bool ready = read_ahead_here && ahead_.ready();
  in_flight_.wait();  // its write before its bytes are read; the read ahead, if any
  if (!read_ahead_here) {
    ready = core.options().io == IoMode::buffered &&
            core.storage().resident_bytes(offset_, bytes) >= bytes;
    core.read(offset_, 0, dst, bytes);
  }
  free();
  return ready;
}

void Region::read_ahead(void* dst) {
  detail::ArenaCore& core = core_or_throw();
  if (dst == nullptr) return core.read_ahead(offset_, size_);
  ahead_ = read_async(dst, requested_);
  ahead_destination_ = dst;
}

}  // namespace spill
