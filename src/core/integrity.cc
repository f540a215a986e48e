#include "integrity.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "spill/error.h"

#if XXH_VERSION_NUMBER < 800
#error "spillarena needs xxHash 0.8 or newer (XXH3 with a stable output)"
#endif

namespace spill::detail {

// Note [Integrity hashing]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A spill file lives outside the process for a whole step: a failing disk or controller, a
// file system bug, or anyone writing to it through /proc/<pid>/fd can change its bytes, and
// backward would turn them into wrong gradients without a trace. With
// ArenaOptions::verify_integrity (the default) every write records XXH3-64 hashes of the bytes
// it wrote, and every read compares the bytes it returns against them before the caller sees
// them. XXH3 on one core hashes faster than the disks spilled to deliver, from the CPU cache and
// streaming from RAM alike (measured in docs/benchmarks.md, "Figures behind design notes"); 64
// bits miss a random corruption with odds 2^-64. It is not a cryptographic hash: it catches
// accidents, not an adversary who can write the file and knows the data.
//
// What a hash covers: one write's bytes inside one 4 MiB chunk of the region (kHashChunkBytes;
// chunks start at the region's start), so a write of a whole tensor has one hash per 4 MiB. A
// write forgets the hashes of earlier writes it overlaps (their other bytes are unverified from
// then on: hashing them again would mean reading them back). A read checks every hash whose
// bytes it covers whole; one it covers only in part is not checked (that would mean reading
// bytes the caller did not ask for), and ArenaStats::bytes_verified shows what was. The stash
// writes and reads whole tensors, so every restore is checked in full. Hashes die with their
// region.
//
// Why chunks: the I/O engine cuts transfers into 4 MiB pieces too, and each piece hashes (write)
// or checks (read) the chunks it holds whole on the thread that completed it, right after its
// bytes moved (still in the CPU cache after a buffered read) and while later pieces are still
// on the disk; the pool's workers do so in parallel. One hash over a whole region would have to
// wait for its last piece and then read it all again on one thread, after the transfer instead
// of during it. Chunks split between two pieces (a write at an offset off the grid, a direct
// read's unaligned tail) are hashed after the last piece.
//
// When, and on which thread:
//  - a synchronous buffered write hashes its source on the caller's thread, after the copy;
//  - write_async (and a direct-mode write) hashes each piece's source once that piece is on the
//    file, on the thread that completed it (io_uring's reaper or a pool worker): the caller keeps
//    the source unchanged until the Pending completes anyway, and the training thread, which
//    queued the write to go on computing, does not pay for the hash;
//  - a synchronous read of resident pages checks the destination on the caller's thread;
//    read_async (and a synchronous read from the disk) checks each piece's destination when it
//    landed, after a staging slot's copy, before the Pending is ready, and hands the
//    IntegrityError to Pending::wait, which throws it on the waiting (training) thread;
//  - read_in_place checks the mapping on the caller's thread before returning the pointer. The
//    pointer is the shared mapping itself, so a change after the check is not caught.
// The checked bytes are those the caller gets, never a copy of them. A mismatch does not poison
// the arena: other regions stay readable, and rewriting the region replaces its hashes.

std::uint64_t hash_bytes(const void* data, std::uint64_t bytes) {
  return XXH3_64bits(data, static_cast<std::size_t>(bytes));
}

namespace {

std::string hex(std::uint64_t hash) {
  char text[19];
  std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(hash));
  return text;
}

IntegrityError mismatch(std::uint64_t region, std::uint64_t offset_in_region, std::uint64_t bytes,
                        std::uint64_t expected, std::uint64_t found) {
  const std::string where = offset_in_region == 0
                                ? "the " + std::to_string(bytes) +
                                      " bytes of the region at offset " + std::to_string(region)
                                : "the " + std::to_string(bytes) + " bytes at offset " +
                                      std::to_string(offset_in_region) +
                                      " of the region at offset " + std::to_string(region);
  return IntegrityError(
      region, offset_in_region, bytes, expected, found,
      "spill: integrity check failed: " + where + " of the spill file read back with XXH3 hash " +
          hex(found) + ", not " + hex(expected) + " as written; the file or the disk under it " +
          "changed behind the arena's back (a failing disk or controller: check dmesg and the "
          "drive's SMART log; or another process writing to it through /proc/<pid>/fd). Do not "
          "use the bytes read (spill::checkpoint stops before computing from them); rerun the "
          "step, and move the spill directory to a healthy disk if it happens again");
}

// The chunks of `write`: its bytes split at the region's multiples of kHashChunkBytes.
std::vector<Span> chunks_of(const Span& write) {
  std::vector<Span> chunks;
  for (std::uint64_t at = write.offset; at < write.offset + write.bytes;) {
    const std::uint64_t end =
        std::min(write.offset + write.bytes, (at / kHashChunkBytes + 1) * kHashChunkBytes);
    chunks.push_back(Span{at, end - at});
    at = end;
  }
  return chunks;
}

bool inside_any(const Span& span, const std::vector<Span>* spans) {
  if (spans == nullptr) return false;
  return std::any_of(spans->begin(), spans->end(), [&](const Span& s) { return span.inside(s); });
}

}  // namespace

void IntegrityLedger::forget(std::uint64_t region, const Span& write) {
  MutexLock lock(mutex_);
  auto it = regions_.find(region);
  if (it == regions_.end()) return;
  auto& hashed = it->second;
  hashed.erase(std::remove_if(hashed.begin(), hashed.end(),
                              [&](const Hashed& h) { return h.span.overlaps(write); }),
               hashed.end());
  if (hashed.empty()) regions_.erase(it);
}

// Hashes outside the lock: other regions' writes and reads go on meanwhile.
void IntegrityLedger::record(std::uint64_t region, const Span& write, const Span& within,
                             const char* memory, const std::vector<Span>* skip) {
  std::vector<Hashed> fresh;
  for (const Span& c : chunks_of(write)) {
    if (!c.inside(within) || inside_any(c, skip)) continue;
    fresh.push_back(Hashed{c, hash_bytes(memory + (c.offset - within.offset), c.bytes)});
    bytes_hashed_.fetch_add(c.bytes, std::memory_order_relaxed);
  }
  if (fresh.empty()) return;
  MutexLock lock(mutex_);
  auto& hashed = regions_[region];
  hashed.insert(hashed.end(), fresh.begin(), fresh.end());
}

std::vector<IntegrityLedger::Hashed> IntegrityLedger::hashed_inside(
    std::uint64_t region, const Span& within, const std::vector<Span>* skip) const {
  std::vector<Hashed> inside;
  MutexLock lock(mutex_);
  auto it = regions_.find(region);
  if (it == regions_.end()) return inside;
  for (const Hashed& h : it->second) {
    if (h.span.inside(within) && !inside_any(h.span, skip)) inside.push_back(h);
  }
  return inside;
}

std::exception_ptr IntegrityLedger::check(std::uint64_t region, const Span& within,
                                          const char* memory, const std::vector<Span>* skip) {
  for (const Hashed& h : hashed_inside(region, within, skip)) {
    const std::uint64_t found = hash_bytes(memory + (h.span.offset - within.offset), h.span.bytes);
    bytes_hashed_.fetch_add(h.span.bytes, std::memory_order_relaxed);
    if (found != h.hash) {
      failures_.fetch_add(1, std::memory_order_relaxed);
      return std::make_exception_ptr(mismatch(region, h.span.offset, h.span.bytes, h.hash, found));
    }
    bytes_verified_.fetch_add(h.span.bytes, std::memory_order_relaxed);
  }
  return nullptr;
}

void IntegrityLedger::drop(std::uint64_t region) {
  MutexLock lock(mutex_);
  regions_.erase(region);
}

}  // namespace spill::detail
