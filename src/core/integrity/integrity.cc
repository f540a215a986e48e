#include "core/integrity/integrity.h"

// The header alone, inlined here: the AVX2 variant of XXH3's inner loop is compiled next to the
// baseline one and chosen at run time (Debian's libxxhash is built for baseline x86-64, SSE2).
#define XXH_INLINE_ALL
#if defined(__GNUC__) && defined(__x86_64__)
#define SPILLARENA_XXH3_AVX2 1
#define XXH_DISPATCH_AVX2 1
#define XXH_TARGET_AVX2 __attribute__((__target__("avx2")))
#define XXH_ACC_ALIGN 64  // the AVX2 stripe loop loads its accumulators 32-byte aligned
#include <immintrin.h>
#else
#define SPILLARENA_XXH3_AVX2 0
#endif
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

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
// of during it. Chunks split between two pieces (a queued write at an offset off the grid, a
// direct read's unaligned tail) are hashed after the last piece.
//
// When, and on which thread (each in the pass that moves the bytes: see Note [Hashing while the
// bytes are in cache]):
//  - a buffered write hashes its source on one of the I/O queue's threads (io_uring's reaper or
//    a pool worker) while the kernel copies it into the page cache: a synchronous write's
//    pwrite on the caller's thread, write_async's pieces on the queue's (Note [Hashing beside
//    the kernel's copy]); the caller keeps the source unchanged until the write completes
//    anyway, and the training thread, which queued the write to go on computing, does not pay
//    for the hash. A synchronous write, or a write_async, of at most a slice hashes on the
//    caller's thread, after its pwrite (Note [A small write is made at once] in
//    src/core/arena/arena_core.cc); a write into host memory copies and hashes in one pass;
//  - a direct-mode write hashes its staging copy on the caller's thread as it copies it into the
//    slot (an aligned source, written from where it is: each slice of the source before it is
//    queued), and keeps the hashes once every piece is on the file;
//  - a read of resident pages of a buffered file, synchronous or read_async, copies and hashes
//    each chunk in one pass on the caller's thread, and compares it as it lands (Note [Copying
//    and hashing in one pass]); a read from the disk (and any read in direct mode) checks each
//    piece's destination when it landed, after a staging slot's copy, before the Pending is
//    ready. read_async hands the IntegrityError to Pending::wait, which throws it on the
//    waiting (training) thread.
// The checked bytes are those the caller gets, never a copy of them. A mismatch does not poison
// the arena: other regions stay readable, and rewriting the region replaces its hashes.

// ---------------------------------------------------------------------------------------------
// XXH3, with AVX2 where the CPU has it
// ---------------------------------------------------------------------------------------------

namespace {

// The same hashes either way: only XXH3's stripe loop changes (what XXH3's own
// xxh_x86dispatch.c does). On the 2-core test VM (AMD EPYC) AVX2 hashes 2.6x faster from the
// CPU cache and 1.6x faster streaming from RAM than the baseline build; see
// docs/benchmarks_archive.md, "Hashing at memory speed".
#if SPILLARENA_XXH3_AVX2
bool have_avx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2") != 0;
  return avx2;
}

XXH_NO_INLINE XXH_TARGET_AVX2 XXH64_hash_t hash_long_avx2(const void* data, std::size_t bytes) {
  return XXH3_hashLong_64b_internal(data, bytes, XXH3_kSecret, sizeof(XXH3_kSecret),
                                    XXH3_accumulate_512_avx2, XXH3_scrambleAcc_avx2);
}

XXH_NO_INLINE XXH_TARGET_AVX2 void update_avx2(XXH3_state_t* state, const void* data,
                                               std::size_t bytes) {
  XXH3_update(state, static_cast<const xxh_u8*>(data), bytes, XXH3_accumulate_512_avx2,
              XXH3_scrambleAcc_avx2);
}
#endif

void stream(XXH3_state_t* state, const void* data, std::size_t bytes) {
#if SPILLARENA_XXH3_AVX2
  if (have_avx2()) return update_avx2(state, data, bytes);
#endif
  XXH3_64bits_update(state, data, bytes);
}

}  // namespace

std::uint64_t hash_bytes(const void* data, std::uint64_t bytes) {
  const auto n = static_cast<std::size_t>(bytes);
#if SPILLARENA_XXH3_AVX2
  if (n > XXH3_MIDSIZE_MAX && have_avx2()) return hash_long_avx2(data, n);
#endif
  return XXH3_64bits(data, n);
}

// Note [Copying and hashing in one pass]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A copy is memory-bound and XXH3 compute-bound: run one after the other, even slice by slice from
// the cache (Note [Hashing while the bytes are in cache]), the core waits on memory while it copies
// and the memory idles while it hashes. So where the CPU has AVX2 a copy that is hashed (a resident
// read, a write into host memory, a direct write's staging copy) moves 64 bytes (one XXH3 stripe)
// at a time and feeds the stripe to XXH3's accumulators right after storing it, reading it back
// from the destination (the bytes it holds, which is what a check must see; the compiler may reuse
// the registers just stored, the same bytes): the hash runs in the cycles the copy spends waiting.
// The loop is XXH3's own long-input loop (blocks of 16 stripes, a scramble after each, the last
// stripe of the input, the merge), with the header's AVX2 stripe and scramble functions, so the
// hash is the one hash_bytes gives for the copied bytes (tests/integrity_test.cc holds it to that
// for every length class and alignment). On the 2-core test VM one core copied and hashed 64 MiB at
// 0.80-0.85 of the speed of memcpy in 512 KiB slices, against 0.70-0.77 copying and hashing slice
// by slice, and a RAM arena's hashed round trip went from 0.71-0.88 to 0.83-1.0 of its unhashed one
// (docs/benchmarks_archive.md, "Copying and hashing in one pass"). Inputs of XXH3's short and mid
// sizes (240 bytes or less) and CPUs without AVX2 copy, then hash.

namespace {
#if SPILLARENA_XXH3_AVX2
XXH_FORCE_INLINE XXH_TARGET_AVX2 void copy_stripe(char* dst, const char* src) {
  const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), low);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32), high);
}

// `stripes` stripes from `src` to `dst`, each accumulated from `dst` with the secret's stripe key.
XXH_FORCE_INLINE XXH_TARGET_AVX2 void copy_accumulate(xxh_u64* acc, char* dst, const char* src,
                                                      std::size_t stripes) {
  for (std::size_t k = 0; k < stripes; ++k) {
    copy_stripe(dst + k * XXH_STRIPE_LEN, src + k * XXH_STRIPE_LEN);
    XXH3_accumulate_512_avx2(acc, dst + k * XXH_STRIPE_LEN,
                             XXH3_kSecret + k * XXH_SECRET_CONSUME_RATE);
  }
}

// bytes > XXH3_MIDSIZE_MAX: XXH3's long-input hash, over the bytes as they are copied.
XXH_NO_INLINE XXH_TARGET_AVX2 XXH64_hash_t copy_hash_long_avx2(char* dst, const char* src,
                                                               std::size_t bytes) {
  alignas(32) xxh_u64 acc[XXH_ACC_NB] = XXH3_INIT_ACC;
  constexpr std::size_t kSecret = sizeof(XXH3_kSecret);
  constexpr std::size_t kStripesPerBlock = (kSecret - XXH_STRIPE_LEN) / XXH_SECRET_CONSUME_RATE;
  constexpr std::size_t kBlock = kStripesPerBlock * XXH_STRIPE_LEN;
  const std::size_t blocks = (bytes - 1) / kBlock;
  for (std::size_t b = 0; b < blocks; ++b) {
    copy_accumulate(acc, dst + b * kBlock, src + b * kBlock, kStripesPerBlock);
    XXH3_scrambleAcc_avx2(acc, XXH3_kSecret + kSecret - XXH_STRIPE_LEN);
  }
  const std::size_t done = blocks * kBlock;
  const std::size_t stripes = (bytes - 1 - done) / XXH_STRIPE_LEN;
  copy_accumulate(acc, dst + done, src + done, stripes);
  const std::size_t tail = done + stripes * XXH_STRIPE_LEN;
  std::memcpy(dst + tail, src + tail, bytes - tail);  // 1 to 64 bytes
  XXH3_accumulate_512_avx2(acc, dst + bytes - XXH_STRIPE_LEN,
                           XXH3_kSecret + kSecret - XXH_STRIPE_LEN - XXH_SECRET_LASTACC_START);
  return XXH3_mergeAccs(acc, XXH3_kSecret + XXH_SECRET_MERGEACCS_START,
                        static_cast<xxh_u64>(bytes) * XXH_PRIME64_1);
}
#endif
}  // namespace

std::uint64_t copy_and_hash(char* dst, const char* src, std::uint64_t bytes) {
  const auto n = static_cast<std::size_t>(bytes);
#if SPILLARENA_XXH3_AVX2
  if (n > XXH3_MIDSIZE_MAX && have_avx2()) return copy_hash_long_avx2(dst, src, n);
#endif
  std::memcpy(dst, src, n);
  return hash_bytes(dst, n);
}

// ---------------------------------------------------------------------------------------------
// Hashing spans of a range slice by slice
// ---------------------------------------------------------------------------------------------

// Note [Hashing while the bytes are in cache]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Hashing a write after its copy, or a read after it landed, is one more pass over the bytes, and
// for a region larger than the CPU cache that pass streams them from RAM once more: it made a
// resident round trip ~40 % slower. So a path that copies hashes each piece in the pass that
// copies it, while the piece is in the cache:
//  - a synchronous buffered write of at most kHashSliceBytes hashes its source right after the
//    pwrite read it (ArenaCore::write_hashed; longer ones are hashed beside the pwrite: Note
//    [Hashing beside the kernel's copy]);
//  - an aligned source of a direct write (a host pool block just filled by the device -> host
//    copy) is written without a copy and hashed slice by slice as its pieces are queued
//    (IoEngine::Hooks::staged; Note [Writing from an aligned source] in io_engine.cc);
//  - a copy the arena does itself (a resident synchronous read, a write into host memory, a
//    direct write's staging copy: IoEngine::Hooks::copy_staged) is fused with its hash
//    instead: Note [Copying and hashing in one pass]; a chunk cut by a staging slot's edge is
//    copied and hashed slice by slice.
// A 4 MiB chunk spans 8 slices: XXH3's streaming state carries it from one slice to the next
// (SpanHasher), so its hash is the one hash_bytes gives for the chunk whole, and the ledger, the
// per-piece checks and the error messages do not change. 512 KiB slices: a slice of the source
// and its copy together fit a core's L2 (1 MiB on the test VM) until the hash has read them, and
// glibc 2.36 copies a block that large with its vector loop; below about 512 KiB it uses
// `rep movsb`, which ran at 2.4-2.7 GB/s on the test VM's AMD EPYC against 7 GB/s for larger
// copies, so 256 KiB slices made the copy itself 2.5x slower. The extra pwrite calls cost about a
// microsecond each.
// Queued reads from the disk still check per 4 MiB piece, on the completing thread, right after
// the piece's pread (the backends move a piece in one call; the piece is still in L2 or L3).
// For every path the hash itself is XXH3's AVX2 loop where the CPU has it, 2-3x the baseline
// SSE2 build from the cache. On one core this reached 0.7-0.8 of the unhashed round trip, not
// 0.9: a hash that follows its copy on the same core still adds a quarter to a third of the
// copy's time. So the copies the arena makes itself fuse the hash into the copy (Note [Copying
// and hashing in one pass]); this slice-by-slice path is what is left: a chunk cut by a staging
// slot's edge, and the span hashing of queued reads. A thread of the arena's own that hashed a
// synchronous write's chunks beside its pwrite was removed (2026-12-03): it held a second CPU and
// a thread per arena, and with the reads fused the one-thread write left BM_Integrity's `copy`
// round trip (write + resident read) at 0.90 of unhashed at 16 MiB and 1.16-1.23 at 64 and 256
// MiB, medians of 5 on the 2-core test VM. On a later host (2026-12-04) the same write measured
// 0.78-0.82, and a write's hash went beside its copy again, on the I/O queue's own thread: Note
// [Hashing beside the kernel's copy].
// Figures: docs/benchmarks_archive.md, "Hashing at memory speed" and "Copying and hashing in one
// pass".

// Note [Hashing beside the kernel's copy]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A buffered write has no copy of ours to fuse its hash with: the kernel copies the source into
// the page cache. Hashed on the copying thread, slice by slice after each pwrite (a synchronous
// write) or after each 4 MiB piece (write_async, on the thread that completed it), the hash added
// its own time to the copy's: on the 2-core test VM of 2026-12-04 (Intel Xeon, 2 MiB L2 per core)
// XXH3-AVX2 hashes about 25 GB/s and pwrite into resident pages copies about 11, so a synchronous
// write ran at 0.70-0.78 of an unhashed one; and io_uring's one reaper hashed write_async's
// pieces one after another, its last piece after the last copy. So a write's hash runs from the
// start on another thread than the copy, one of the I/O queue's own (no thread is added):
//  - write_async of more than a slice (Note [A small write is made at once] in
//    src/core/arena/arena_core.cc): the hash of the whole source is queued with the pieces as a
//    request that moves nothing (IoEngine::Hooks::beside; IoRequest::work_only): io_uring
//    completes it at once and its reaper hashes while the kernel's worker copies the pieces, a
//    pool worker likewise beside the others; the transfer's `after`, which records the hashes,
//    waits for it;
//  - a synchronous write of more than a slice: the caller pwrites the whole range (its fastest
//    copy) while such a request hashes on a queue thread (IoEngine::beside), and waits for it.
// The hash reads the source, which the caller keeps unchanged until the write completes (the
// engine's contract; a synchronous write's own call), so it is the hash of the bytes the copy
// took, as before; it is recorded only once every piece is on the file. Where both cores are
// busy the hash waits for one, as it did on the copying thread. Measured
// (docs/benchmarks_archive.md, "Hashing beside the kernel's copy"): BM_Integrity's `copy` round
// trip (synchronous write + resident read) went from 0.78-0.82 to 0.91-0.98 of unhashed at 16-256
// MiB, and a buffered write_async + wait alone to 0.93-1.0. Hashing write_async's source on the
// submitting thread instead, as direct mode does, measured the same within the noise (0.83-0.93
// against 0.81-0.90 at 16 MiB), with a tighter tail, but puts the hash on the training thread. A
// pool's workers take requests in order, so the hash goes ahead of the pieces there; with io_uring
// it goes after them (the kernel's worker starts first: fewer slow outliers).
//
// Reads: io_uring completes a read of cached pages inline, in the submitting call, so a
// read_async of resident pages was a copy on the calling thread already, and its check ran on
// the reaper after the last piece, one more pass over the bytes: BM_Integrity's `async` round
// trip (write_async + read_async) measured 0.69-0.74 of unhashed. A buffered read_async of
// resident pages is now copied from the mapping on the calling thread, as read() copies them,
// with the check fused into the copy (Note [Copying and hashing in one pass]); the Pending it
// returns is ready, holding any IntegrityError (or IoError: a file shrunk under the mapping) for
// wait() to throw. With a thread pool, such a read_async is then no longer queued either. The
// `async` round trip went to 0.84-0.95 of unhashed (16-256 MiB).

struct SpanHasher::State {
  XXH3_state_t xxh3;
};

SpanHasher::SpanHasher(const Span& range, std::vector<Span> spans)
    : range_(range), spans_(std::move(spans)), at_(range.offset) {}

SpanHasher::~SpanHasher() = default;
SpanHasher::SpanHasher(SpanHasher&&) noexcept = default;

// One step: the bytes before the next span skipped, or the next span's bytes in this slice
// hashed (whole in one call when the slice holds all of it, else through the streaming state).
std::uint64_t SpanHasher::step(const char* memory, std::uint64_t bytes, std::uint64_t* hash) {
  finished_ = false;
  if (next_ == spans_.size()) {
    at_ += bytes;
    return bytes;
  }
  const Span& s = spans_[next_];
  if (at_ < s.offset) {
    const std::uint64_t skip = std::min(bytes, s.offset - at_);
    at_ += skip;
    return skip;
  }
  const std::uint64_t n = std::min(bytes, s.offset + s.bytes - at_);
  if (at_ == s.offset && n == s.bytes) {
    *hash = hash_bytes(memory, n);
    finished_ = true;
  } else {
    if (!state_) state_ = std::make_unique<State>();
    if (at_ == s.offset) XXH3_64bits_reset(&state_->xxh3);
    stream(&state_->xxh3, memory, static_cast<std::size_t>(n));
    if (at_ + n == s.offset + s.bytes) {
      *hash = XXH3_64bits_digest(&state_->xxh3);
      finished_ = true;
    }
  }
  at_ += n;
  if (finished_) ++next_;
  return n;
}

// One step of a copy: the next span whole in one pass with its copy, or up to the next span's
// start or end (at most a slice) copied and then hashed by step(), which takes all of it.
std::uint64_t SpanHasher::copy_step(char* dst, const char* src, std::uint64_t bytes,
                                    std::uint64_t* hash) {
  std::uint64_t n = std::min(bytes, kHashSliceBytes);
  if (next_ < spans_.size()) {
    const Span& s = spans_[next_];
    if (at_ == s.offset && s.bytes <= bytes) {
      *hash = copy_and_hash(dst, src, s.bytes);
      at_ += s.bytes;
      ++next_;
      finished_ = true;
      return s.bytes;
    }
    n = std::min(n, (at_ < s.offset ? s.offset : s.offset + s.bytes) - at_);
  }
  std::memcpy(dst, src, static_cast<std::size_t>(n));
  return step(dst, n, hash);
}

// The chunks of `write`: its bytes split at the region's multiples of kHashChunkBytes.
std::vector<Span> hash_chunks(const Span& write) {
  std::vector<Span> chunks;
  for (std::uint64_t at = write.offset; at < write.offset + write.bytes;) {
    const std::uint64_t end =
        std::min(write.offset + write.bytes, (at / kHashChunkBytes + 1) * kHashChunkBytes);
    chunks.push_back(Span{at, end - at});
    at = end;
  }
  return chunks;
}

namespace {

std::string hex(std::uint64_t hash) {
  char text[19];
  std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(hash));
  return text;
}

IntegrityError mismatch(std::uint64_t start, std::uint64_t offset_in_region, std::uint64_t bytes,
                        std::uint64_t expected, std::uint64_t found) {
  const std::string where = offset_in_region == 0
                                ? "the " + std::to_string(bytes) +
                                      " bytes of the region at offset " + std::to_string(start)
                                : "the " + std::to_string(bytes) + " bytes at offset " +
                                      std::to_string(offset_in_region) +
                                      " of the region at offset " + std::to_string(start);
  return IntegrityError(
      start, offset_in_region, bytes, expected, found,
      "spill: integrity check failed: " + where + " of the spill file read back with XXH3 hash " +
          hex(found) + ", not " + hex(expected) + " as written; the file or the disk under it " +
          "changed behind the arena's back (a failing disk or controller: check dmesg and the "
          "drive's SMART log; another process writing to it through /proc/<pid>/fd; or, if the "
          "program changed a stored tensor's bytes where autograd cannot see it, through .data "
          "or a copy in another thread while its write was in flight). Do not "
          "use the bytes read (spill::checkpoint stops before computing from them); rerun the "
          "step, and move the spill directory to a healthy disk if it happens again");
}

bool inside_any(const Span& span, const std::vector<Span>* spans) {
  if (spans == nullptr) return false;
  return std::any_of(spans->begin(), spans->end(), [&](const Span& s) { return span.inside(s); });
}

}  // namespace

void IntegrityLedger::forget(std::uint64_t start, const Span& write) {
  MutexLock lock(mutex_);
  auto it = regions_.find(start);
  if (it == regions_.end()) return;
  auto& hashed = it->second;
  hashed.erase(std::remove_if(hashed.begin(), hashed.end(),
                              [&](const Hashed& h) { return h.span.overlaps(write); }),
               hashed.end());
  if (hashed.empty()) regions_.erase(it);
}

// Hashes outside the lock: other regions' writes and reads go on meanwhile.
void IntegrityLedger::record(std::uint64_t start, const Span& write, const Span& within,
                             const char* memory, const std::vector<Span>* skip) {
  std::vector<Hashed> fresh;
  for (const Span& c : hash_chunks(write)) {
    if (!c.inside(within) || inside_any(c, skip)) continue;
    fresh.push_back(Hashed{c, hash_bytes(memory + (c.offset - within.offset), c.bytes)});
    bytes_hashed_.fetch_add(c.bytes, std::memory_order_relaxed);
  }
  if (fresh.empty()) return;
  MutexLock lock(mutex_);
  auto& hashed = regions_[start];
  hashed.insert(hashed.end(), fresh.begin(), fresh.end());
}

std::vector<IntegrityLedger::Hashed> IntegrityLedger::hashed_inside(
    std::uint64_t start, const Span& within, const std::vector<Span>* skip) const {
  std::vector<Hashed> inside;
  MutexLock lock(mutex_);
  auto it = regions_.find(start);
  if (it == regions_.end()) return inside;
  for (const Hashed& h : it->second) {
    if (h.span.inside(within) && !inside_any(h.span, skip)) inside.push_back(h);
  }
  return inside;
}

std::exception_ptr IntegrityLedger::check(std::uint64_t start, const Span& within,
                                          const char* memory, const std::vector<Span>* skip) {
  for (const Hashed& h : hashed_inside(start, within, skip)) {
    const std::uint64_t found = hash_bytes(memory + (h.span.offset - within.offset), h.span.bytes);
    bytes_hashed_.fetch_add(h.span.bytes, std::memory_order_relaxed);
    if (found != h.hash) {
      failures_.fetch_add(1, std::memory_order_relaxed);
      return std::make_exception_ptr(mismatch(start, h.span.offset, h.span.bytes, h.hash, found));
    }
    bytes_verified_.fetch_add(h.span.bytes, std::memory_order_relaxed);
  }
  return nullptr;
}

void IntegrityLedger::drop(std::uint64_t start) {
  MutexLock lock(mutex_);
  regions_.erase(start);
}

// ---------------------------------------------------------------------------------------------
// Hashing and checking in the pass that copies
// ---------------------------------------------------------------------------------------------

WriteHasher::WriteHasher(const Span& write) : write_(write), hasher_(write, hash_chunks(write)) {}

void IntegrityLedger::record(std::uint64_t start, const WriteHasher& written) {
  const std::vector<Hashed>& fresh = written.hashed();
  if (fresh.empty()) return;
  std::uint64_t bytes = 0;
  for (const Hashed& h : fresh) bytes += h.span.bytes;
  bytes_hashed_.fetch_add(bytes, std::memory_order_relaxed);
  MutexLock lock(mutex_);
  auto& hashed = regions_[start];
  hashed.insert(hashed.end(), fresh.begin(), fresh.end());
}

namespace {
// The recorded chunks in offset order. Writes forget the chunks they overlap, so recorded chunks
// are disjoint unless two writes of the same bytes overlapped in time (whose bytes are then
// undefined anyway); a chunk overlapping an earlier one is left out rather than misread.
std::vector<HashedSpan> in_order(std::vector<HashedSpan> hashed) {
  std::sort(hashed.begin(), hashed.end(),
            [](const HashedSpan& a, const HashedSpan& b) { return a.span.offset < b.span.offset; });
  std::vector<HashedSpan> disjoint;
  for (const HashedSpan& h : hashed) {
    if (disjoint.empty() || !disjoint.back().span.overlaps(h.span)) disjoint.push_back(h);
  }
  return disjoint;
}

std::vector<Span> spans_of(const std::vector<HashedSpan>& hashed) {
  std::vector<Span> spans;
  spans.reserve(hashed.size());
  for (const HashedSpan& h : hashed) spans.push_back(h.span);
  return spans;
}
}  // namespace

IntegrityLedger::ReadCheck::ReadCheck(IntegrityLedger* ledger, std::uint64_t start,
                                      const Span& read, std::vector<Hashed> expected)
    : ledger_(ledger),
      start_(start),
      expected_(std::move(expected)),
      hasher_(read, spans_of(expected_)) {}

IntegrityLedger::ReadCheck IntegrityLedger::checker(std::uint64_t start, const Span& read) {
  return ReadCheck(this, start, read, in_order(hashed_inside(start, read, nullptr)));
}

// No local with a destructor: a SIGBUS while copying from a mapping leaves this frame by
// siglongjmp (see Note [SIGBUS on the mapping] in src/core/os/platform_posix.cc).
std::exception_ptr IntegrityLedger::ReadCheck::copy(char* dst, const char* src,
                                                    std::uint64_t bytes) {
  hasher_.copy(dst, src, bytes, [this](std::size_t i, std::uint64_t found) { compare(i, found); });
  return error_;
}

void IntegrityLedger::ReadCheck::compare(std::size_t i, std::uint64_t found) {
  const Hashed& h = expected_[i];
  ledger_->bytes_hashed_.fetch_add(h.span.bytes, std::memory_order_relaxed);
  if (error_) return;
  if (found != h.hash) {
    ledger_->failures_.fetch_add(1, std::memory_order_relaxed);
    error_ = std::make_exception_ptr(mismatch(start_, h.span.offset, h.span.bytes, h.hash, found));
    return;
  }
  ledger_->bytes_verified_.fetch_add(h.span.bytes, std::memory_order_relaxed);
}

}  // namespace spill::detail
