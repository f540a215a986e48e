// IntegrityLedger: the XXH3-64 hashes of the bytes written into live regions, and the check of
// bytes read back against them (ArenaOptions::verify_integrity). Owned by ArenaCore;
// thread-safe. See Note [Integrity hashing] in src/core/integrity/integrity.cc.
//
//   spill::detail::IntegrityLedger ledger;
//   const spill::detail::Span all{0, bytes};           // start: the region's file offset
//   const char* src = ...;                             // the bytes written
//   ledger.forget(start, all);                         // a write of these bytes is under way
//   ledger.record(start, all, all, src);               // ... and completed: its hashes are kept
//   const char* dst = ...;                             // the same bytes, read back
//   if (std::exception_ptr e = ledger.check(start, all, dst)) std::rethrow_exception(e);
//   ledger.drop(start);                                // the region is freed
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <vector>

#include "core/os/mutex.h"

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

// XXH3-64 of `bytes` bytes at `data` (Debian's libxxhash header; AVX2 where the CPU has it).
std::uint64_t hash_bytes(const void* data, std::uint64_t bytes);

// Copies `bytes` bytes from `src` to `dst` (not overlapping) and returns hash_bytes(dst, bytes),
// in one pass over the bytes (Note [Copying and hashing in one pass] in
// src/core/integrity/integrity.cc).
std::uint64_t copy_and_hash(char* dst, const char* src, std::uint64_t bytes);

// Slices in which a copy and its hash take turns, so the hash reads bytes the copy left in the
// CPU cache. See Note [Hashing while the bytes are in cache] in src/core/integrity/integrity.cc.
constexpr std::uint64_t kHashSliceBytes = 512ull << 10;

// The chunks a write of `write` hashes: its bytes split at the region's multiples of
// kHashChunkBytes.
std::vector<Span> hash_chunks(const Span& write);

// XXH3-64 of some spans (sorted, disjoint) of a range, fed with the range's bytes in order and
// in slices of any size: bytes outside the spans are skipped, a span cut between slices is
// hashed with XXH3's streaming state, and each finished span is handed to `done`. The hashes are
// those hash_bytes gives for each span whole.
class SpanHasher {
 public:
  SpanHasher(const Span& range, std::vector<Span> spans);
  ~SpanHasher();
  SpanHasher(SpanHasher&&) noexcept;
  SpanHasher(const SpanHasher&) = delete;
  SpanHasher& operator=(const SpanHasher&) = delete;

  // The range's next `bytes` bytes are at `memory`. `done(index, hash)` for each span finished.
  template <class Done>
  void update(const char* memory, std::uint64_t bytes, Done&& done) {
    while (bytes > 0) {
      std::uint64_t hash = 0;
      const std::uint64_t used = step(memory, bytes, &hash);
      if (finished_) done(next_ - 1, hash);
      memory += used;
      bytes -= used;
    }
  }
  // The same for bytes being copied: copies the range's next `bytes` bytes from `src` to `dst`
  // and hashes them as they land, a span that lies whole in this call in one pass with its copy
  // (copy_and_hash), the rest in kHashSliceBytes slices, each copied then hashed.
  template <class Done>
  void copy(char* dst, const char* src, std::uint64_t bytes, Done&& done) {
    while (bytes > 0) {
      std::uint64_t hash = 0;
      const std::uint64_t used = copy_step(dst, src, bytes, &hash);
      if (finished_) done(next_ - 1, hash);
      dst += used;
      src += used;
      bytes -= used;
    }
  }
  const std::vector<Span>& spans() const { return spans_; }
  bool complete() const { return at_ == range_.offset + range_.bytes; }

 private:
  std::uint64_t step(const char* memory, std::uint64_t bytes, std::uint64_t* hash);
  std::uint64_t copy_step(char* dst, const char* src, std::uint64_t bytes, std::uint64_t* hash);

  struct State;
  const Span range_;
  const std::vector<Span> spans_;
  std::uint64_t at_;              // range offset of the next byte
  std::size_t next_ = 0;          // the span at or after at_
  bool finished_ = false;         // the last step finished span next_ - 1
  std::unique_ptr<State> state_;  // XXH3's streaming state for a span cut between slices
};

// The hash of one chunk of one write.
struct HashedSpan {
  Span span;
  std::uint64_t hash = 0;
};

// One write's chunk hashes, computed as its bytes pass (in order, in slices of any size).
//
//   WriteHasher hasher(Span{at, bytes});
//   for (each slice of the write, in order) { copy it; hasher.update(slice, slice_bytes); }
//   // or, where the copy is ours to make: hasher.copy(to, slice, slice_bytes);
//   ledger.record(start, hasher);  // once every byte is on the file
class WriteHasher {
 public:
  explicit WriteHasher(const Span& write);
  void update(const char* memory, std::uint64_t bytes) {
    hasher_.update(memory, bytes, [&](std::size_t i, std::uint64_t hash) { keep(i, hash); });
  }
  // The next `bytes` bytes are copied from `src` to `dst` and hashed as they land.
  void copy(char* dst, const char* src, std::uint64_t bytes) {
    hasher_.copy(dst, src, bytes, [&](std::size_t i, std::uint64_t hash) { keep(i, hash); });
  }
  const Span& write() const { return write_; }
  const std::vector<HashedSpan>& hashed() const { return hashed_; }

 private:
  void keep(std::size_t i, std::uint64_t hash) {
    hashed_.push_back(HashedSpan{hasher_.spans()[i], hash});
  }
  const Span write_;
  SpanHasher hasher_;
  std::vector<HashedSpan> hashed_;
};

class IntegrityLedger {
 public:
  using Hashed = HashedSpan;

  // A write of `write` in the region at file offset `start` is under way: the hashes of earlier
  // writes it overlaps no longer describe the file.
  void forget(std::uint64_t start, const Span& write);
  // That write's bytes in `within` reached the file; `memory` holds them (from within.offset).
  // Hashes and keeps its chunks inside `within`, except those inside a span of `skip`.
  void record(std::uint64_t start, const Span& write, const Span& within, const char* memory,
              const std::vector<Span>* skip = nullptr);
  // `memory` holds the bytes `within` of the region as read. Hashes every recorded chunk inside
  // `within` (except those inside a span of `skip`) and compares: a spill::IntegrityError for
  // the first that differs, nullptr when all match.
  std::exception_ptr check(std::uint64_t start, const Span& within, const char* memory,
                           const std::vector<Span>* skip = nullptr);
  // The region was freed: its hashes go with it.
  void drop(std::uint64_t start);

  // A write that hashed its bytes as they passed (see Note [Hashing while the bytes are in
  // cache]) reached the file: its hashes are kept.
  void record(std::uint64_t start, const WriteHasher& written);

  // For a read that checks its bytes as they pass: copy the read's bytes in order through
  // ReadCheck::copy, which compares each recorded chunk inside it once its last byte landed. A
  // read is one failure however many of its chunks differ.
  class ReadCheck {
   public:
    // The read's next `bytes` bytes are copied from `src` to `dst` and hashed as they land
    // (SpanHasher::copy): a spill::IntegrityError for the first recorded chunk that differed
    // (here or in an earlier copy), nullptr while all match.
    std::exception_ptr copy(char* dst, const char* src, std::uint64_t bytes);

   private:
    friend class IntegrityLedger;
    ReadCheck(IntegrityLedger* ledger, std::uint64_t start, const Span& read,
              std::vector<Hashed> expected);
    void compare(std::size_t i, std::uint64_t found);
    IntegrityLedger* ledger_;
    std::uint64_t start_;
    std::vector<Hashed> expected_;
    SpanHasher hasher_;
    std::exception_ptr error_;
  };
  ReadCheck checker(std::uint64_t start, const Span& read);

  std::uint64_t bytes_hashed() const { return bytes_hashed_.load(std::memory_order_relaxed); }
  std::uint64_t bytes_verified() const { return bytes_verified_.load(std::memory_order_relaxed); }
  std::uint64_t failures() const { return failures_.load(std::memory_order_relaxed); }

 private:
  std::vector<Hashed> hashed_inside(std::uint64_t start, const Span& within,
                                    const std::vector<Span>* skip) const;

  mutable Mutex mutex_;
  std::map<std::uint64_t, std::vector<Hashed>> regions_ GUARDED_BY(mutex_);  // by file offset
  std::atomic<std::uint64_t> bytes_hashed_{0};
  std::atomic<std::uint64_t> bytes_verified_{0};
  std::atomic<std::uint64_t> failures_{0};
};

}  // namespace spill::detail
