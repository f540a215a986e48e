// IntegrityLedger: the XXH3-64 hashes of the bytes written into live regions, and the check of
// bytes read back against them (ArenaOptions::verify_integrity). Owned by ArenaCore;
// thread-safe. See Note [Integrity hashing] in src/core/integrity.cc.
//
//   spill::detail::IntegrityLedger ledger;
//   const spill::detail::Span all{0, bytes};           // region: the region's file offset
//   const char* src = ...;                             // the bytes written
//   ledger.forget(region, all);                        // a write of these bytes is under way
//   ledger.record(region, all, all, src);              // ... and completed: its hashes are kept
//   const char* dst = ...;                             // the same bytes, read back
//   if (std::exception_ptr e = ledger.check(region, all, dst)) std::rethrow_exception(e);
//   ledger.drop(region);                               // the region is freed
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <map>
#include <vector>

#include "mutex.h"

namespace spill::detail {

// One hash covers at most this much of one write: the write's bytes inside one chunk of the
// region, chunks starting at multiples of it. The I/O engine's pieces have the same size, so a
// piece holds its chunks whole and hashes them on the thread that completed it.
constexpr std::uint64_t kHashChunkBytes = 4ull << 20;

// Bytes [offset, offset + bytes) of a region.
struct Span {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  bool inside(const Span& outer) const {
    return offset >= outer.offset && offset + bytes <= outer.offset + outer.bytes;
  }
  bool overlaps(const Span& other) const {
    return offset < other.offset + other.bytes && other.offset < offset + bytes;
  }
};

// XXH3-64 of `bytes` bytes at `data` (Debian's libxxhash).
std::uint64_t hash_bytes(const void* data, std::uint64_t bytes);

class IntegrityLedger {
 public:
  // A write of `write` in the region at file offset `region` is under way: the hashes of earlier
  // writes it overlaps no longer describe the file.
  void forget(std::uint64_t region, const Span& write);
  // That write's bytes in `within` reached the file; `memory` holds them (from within.offset).
  // Hashes and keeps its chunks inside `within`, except those inside a span of `skip`.
  void record(std::uint64_t region, const Span& write, const Span& within, const char* memory,
              const std::vector<Span>* skip = nullptr);
  // `memory` holds the bytes `within` of the region as read. Hashes every recorded chunk inside
  // `within` (except those inside a span of `skip`) and compares: a spill::IntegrityError for
  // the first that differs, nullptr when all match.
  std::exception_ptr check(std::uint64_t region, const Span& within, const char* memory,
                           const std::vector<Span>* skip = nullptr);
  // The region was freed: its hashes go with it.
  void drop(std::uint64_t region);

  std::uint64_t bytes_hashed() const { return bytes_hashed_.load(std::memory_order_relaxed); }
  std::uint64_t bytes_verified() const { return bytes_verified_.load(std::memory_order_relaxed); }
  std::uint64_t failures() const { return failures_.load(std::memory_order_relaxed); }

 private:
  struct Hashed {  // one chunk of one write
    Span span;
    std::uint64_t hash;
  };
  std::vector<Hashed> hashed_inside(std::uint64_t region, const Span& within,
                                    const std::vector<Span>* skip) const;

  mutable Mutex mutex_;
  std::map<std::uint64_t, std::vector<Hashed>> regions_ GUARDED_BY(mutex_);  // by file offset
  std::atomic<std::uint64_t> bytes_hashed_{0};
  std::atomic<std::uint64_t> bytes_verified_{0};
  std::atomic<std::uint64_t> failures_{0};
};

}  // namespace spill::detail
