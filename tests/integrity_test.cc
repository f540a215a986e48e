// ArenaOptions::verify_integrity: bytes changed in the spill file behind the arena's back become
// a spill::IntegrityError naming the region, on every path bytes come back through: Region::read,
// read_async (buffered and direct, thread pool and io_uring), and the backward of
// spill::checkpoint. See Note [Integrity hashing] in src/core/integrity/integrity.cc.
// clang-format off
#include <torch/torch.h>  // first: its CHECK macro (c10 logging) must not replace doctest's
// clang-format on
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/arena/arena_core.h"
#include "core/arena/arena_internals.h"
#include "core/integrity/integrity.h"
#include "gpt_test_support.h"
#include "test_support.h"

using spill_test::pattern;
using spill_test::ScratchDir;
using spill_test::truncate_spill_file;

namespace {

// 64 MiB with a 4 MiB staging pool.
spill::ArenaOptions arena_options(const std::string& dir,
                                  spill::IoMode io = spill::IoMode::buffered,
                                  spill::IoBackend backend = spill::IoBackend::thread_pool) {
  return spill_test::options_in(dir, 64 * spill::MiB, io, backend, 4 * spill::MiB);
}

// The arena's spill file, opened once more: its name is gone, but a descriptor of this process
// still refers to it, and /proc/self/fd/<n> reopens it ("<dir>/#<inode> (deleted)"). What a
// stray process, or a disk returning wrong bytes, would do.
class FileBehindTheArena {
 public:
  explicit FileBehindTheArena(const std::string& dir) : fd_(spill_test::reopen_spill_file(dir)) {
    if (fd_ < 0) FAIL("no descriptor of this process refers to a file in " << dir);
  }
  ~FileBehindTheArena() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileBehindTheArena(const FileBehindTheArena&) = delete;
  FileBehindTheArena& operator=(const FileBehindTheArena&) = delete;

  // Inverts the byte at `offset` and writes it back to the disk, so direct reads see it too.
  void flip(std::uint64_t offset) {
    unsigned char byte = 0;
    REQUIRE(::pread(fd_, &byte, 1, static_cast<off_t>(offset)) == 1);
    byte = static_cast<unsigned char>(~byte);
    REQUIRE(::pwrite(fd_, &byte, 1, static_cast<off_t>(offset)) == 1);
    REQUIRE(::fdatasync(fd_) == 0);
  }

 private:
  int fd_ = -1;
};

// A buffer aligned for direct reads that land without staging.
struct AlignedBuffer {
  explicit AlignedBuffer(std::size_t n) {
    const std::uint64_t page = spill::page_size_bytes();
    data = static_cast<unsigned char*>(std::aligned_alloc(page, (n + page - 1) / page * page));
  }
  ~AlignedBuffer() { std::free(data); }
  unsigned char* data = nullptr;
};

// The error names the region, the hashed bytes holding `changed` (one write's bytes in one
// 4 MiB chunk of the region) and two different hashes.
void check_names_region(const spill::IntegrityError& e, const spill::Region& r,
                        std::uint64_t changed) {
  CHECK(e.region_offset() == r.offset());
  CHECK(e.offset_in_region() <= changed);
  CHECK(changed < e.offset_in_region() + e.bytes());
  CHECK(e.bytes() <= 4 * spill::MiB);
  CHECK(e.expected_hash() != e.found_hash());
  const std::string message = e.what();
  CHECK(message.find("region at offset " + std::to_string(r.offset())) != std::string::npos);
  CHECK(message.find(std::to_string(e.bytes()) + " bytes") != std::string::npos);
  CHECK(message.find("behind the arena's back") != std::string::npos);
}

// A region written whole, then one byte of it changed in the file (`changed`, from its start).
// A second region first, so the one tested does not sit at offset 0.
struct CorruptedRegion {
  CorruptedRegion(spill::SpillArena& arena, const std::string& dir, std::size_t bytes)
      : CorruptedRegion(arena, dir, bytes, bytes / 2) {}
  CorruptedRegion(spill::SpillArena& arena, const std::string& dir, std::size_t bytes,
                  std::uint64_t changed_at)
      : before(arena.allocate(spill::MiB)),
        region(arena.allocate(bytes)),
        src(pattern(bytes, 3)),
        changed(changed_at) {
    region.write(src.data(), bytes);
    FileBehindTheArena(dir).flip(region.offset() + changed);
  }
  spill::Region before;
  spill::Region region;
  std::vector<unsigned char> src;
  std::uint64_t changed;
};

std::vector<spill::IoBackend> backends() {
  return {spill::IoBackend::thread_pool, spill::IoBackend::io_uring};
}

// io_uring asked for explicitly throws where it cannot be set up (containers often forbid it).
std::unique_ptr<spill::SpillArena> arena_or_skip(const spill::ArenaOptions& o) {
  try {
    return std::make_unique<spill::SpillArena>(o);
  } catch (const spill::IoError& e) {
    MESSAGE("skipped, io_uring unavailable here: " << e.what());
    return nullptr;
  }
}

}  // namespace

TEST_CASE("integrity: is on by default") { CHECK(spill::ArenaOptions{}.verify_integrity); }

// Note [Copying and hashing in one pass]: the fused loop is XXH3's long-input loop written out
// again, so every boundary of it is tried (240/241: where the long loop starts; multiples of the
// 1024-byte block and of the 64-byte stripe, one either side; a whole 4 MiB chunk), from every
// alignment of source and destination, against hash_bytes of the source (what the ledger
// records), with the bytes around the destination untouched. (A CPU without AVX2 takes
// memcpy + hash_bytes, which this holds too.)
TEST_CASE("integrity: copying and hashing in one pass gives hash_bytes of the copy") {
  // clang-format off: a table; one element a line would hide the boundaries it lists
  std::vector<std::uint64_t> lengths = {0, 1, 64, 200, 240, 241, 255, 256, 1023, 1024, 1025,
                                        1087, 1088, 1089, 2047, 2048, 2049, 16 * 1024 + 63,
                                        4 * spill::MiB - 1, 4 * spill::MiB, 4 * spill::MiB + 1};
  // clang-format on
  for (std::uint64_t n = 3000; n < 3000 + 64; ++n) lengths.push_back(n);
  const auto src = pattern(4 * spill::MiB + 256, 11);
  std::vector<char> dst(4 * spill::MiB + 256);
  for (const std::uint64_t n : lengths) {
    for (std::size_t from = 0; from < 64; from += (n > spill::MiB ? 21 : 1)) {
      const std::size_t to = (from * 7 + 3) % 64;
      std::fill(dst.begin(), dst.end(), '\x5a');
      const char* s = reinterpret_cast<const char*>(src.data()) + from;
      const std::uint64_t hash = spill::detail::copy_and_hash(dst.data() + to, s, n);
      INFO("bytes " << n << ", source at +" << from << ", destination at +" << to);
      REQUIRE(hash == spill::detail::hash_bytes(s, n));
      REQUIRE(std::memcmp(dst.data() + to, s, n) == 0);
      auto untouched = [](char c) { return c == '\x5a'; };
      REQUIRE(std::all_of(dst.begin(), dst.begin() + static_cast<std::ptrdiff_t>(to), untouched));
      REQUIRE(std::all_of(dst.begin() + static_cast<std::ptrdiff_t>(to + n), dst.end(), untouched));
    }
  }
}

// A direct write's staging copy hashes as it copies (IoEngine::Hooks::copy_staged): chunks that
// lie whole in one slot in one pass, the others slice by slice. Either way the write's hashes
// are those of its bytes, whatever the cuts: writes on and off the chunk grid, fed in slots
// that hold chunks whole, cut them, or are smaller than a slice.
TEST_CASE("integrity: a write hashed as it is copied keeps the hashes of its bytes") {
  const auto src = pattern(10 * spill::MiB + 4321, 5);
  std::vector<char> dst(src.size());
  const std::uint64_t offsets[] = {0, 4 * spill::MiB, spill::MiB + 77};
  const std::uint64_t feeds[] = {4 * spill::MiB, 3 * spill::MiB + 5, 64 * 1024 + 1,
                                 10 * spill::MiB + 4321};
  // Bytes first fed in place (update: an aligned source's pieces), the rest copied: the
  // hand-off of a direct write with an aligned body and an unaligned tail, mid-chunk or not.
  const std::uint64_t fed_in_place[] = {0, 2 * spill::MiB + 3, 4 * spill::MiB};
  for (const std::uint64_t at : offsets) {
    for (const std::uint64_t feed : feeds) {
      for (const std::uint64_t in_place : fed_in_place) {
        INFO("write at " << at << ", fed " << feed << " bytes at a time after " << in_place
                         << " in place");
        const spill::detail::Span write{at, src.size()};
        spill::detail::WriteHasher copied(write);
        std::fill(dst.begin(), dst.end(), '\0');
        const char* from = reinterpret_cast<const char*>(src.data());
        copied.update(from, in_place);
        std::memcpy(dst.data(), from, in_place);
        for (std::uint64_t done = in_place; done < src.size(); done += feed) {
          copied.copy(dst.data() + done, from + done, std::min(feed, src.size() - done));
        }
        REQUIRE(std::memcmp(dst.data(), src.data(), src.size()) == 0);
        const auto chunks = spill::detail::hash_chunks(write);
        REQUIRE(copied.hashed().size() == chunks.size());
        for (std::size_t i = 0; i < chunks.size(); ++i) {
          CHECK(copied.hashed()[i].span.offset == chunks[i].offset);
          CHECK(copied.hashed()[i].hash ==
                spill::detail::hash_bytes(from + (chunks[i].offset - at), chunks[i].bytes));
        }
      }
    }
  }
}

TEST_CASE("integrity: an unmodified spill file verifies cleanly through every read path") {
  ScratchDir dir;
  for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
    for (auto backend : backends()) {
      SUBCASE(spill_test::subcase_name(io, backend).c_str()) {
        auto arena = arena_or_skip(arena_options(dir.path(), io, backend));
        if (!arena) continue;
        const std::size_t n = 9 * spill::MiB + 13;  // several pieces and an unaligned tail
        const auto src = pattern(n, 1);
        spill::Region a = arena->allocate(n);
        spill::Region b = arena->allocate(n);
        a.write(src.data(), n);
        b.write_async(src.data(), n).wait();
        std::vector<unsigned char> dst(n);
        AlignedBuffer aligned(n);
        a.read(dst.data(), n);
        CHECK(dst == src);
        b.read_async(dst.data(), n).wait();
        CHECK(dst == src);
        a.read_async(aligned.data, n).wait();
        CHECK(std::memcmp(aligned.data, src.data(), n) == 0);
        std::fill(dst.begin(), dst.end(), 0);
        b.read(dst.data(), n);  // the hashes a queued write kept, checked by a synchronous read
        CHECK(dst == src);
        const spill::ArenaStats s = arena->stats();
        CHECK(s.bytes_verified == 4 * n);
        CHECK(s.bytes_hashed == 6 * n);  // two writes, four reads
        CHECK(s.integrity_failures == 0);
      }
    }
  }
}

TEST_CASE(
    "integrity: a byte changed behind the arena fails a synchronous read, naming the region") {
  ScratchDir dir;
  for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
    for (bool evicted : {false, true}) {  // buffered: a resident copy, or a read from the disk
      SUBCASE(spill_test::subcase_name(io, evicted ? "evicted" : "resident").c_str()) {
        spill::SpillArena arena(arena_options(dir.path(), io));
        const std::size_t n = 3 * spill::MiB + 17;
        CorruptedRegion c(arena, dir.path(), n);
        if (evicted) spill::detail::drop_cached_pages(c.region);
        std::vector<unsigned char> dst(n);
        try {
          c.region.read(dst.data(), n);
          FAIL("the changed byte was read back without an error");
        } catch (const spill::IntegrityError& e) {
          check_names_region(e, c.region, c.changed);
        }
        CHECK(arena.stats().integrity_failures == 1);
        CHECK(arena.stats().bytes_verified == 0);
      }
    }
  }
}

TEST_CASE("integrity: an asynchronous read of changed bytes fails its Pending::wait") {
  ScratchDir dir;
  for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
    for (auto backend : backends()) {
      for (bool aligned_destination : {false, true}) {  // direct: staged, or straight to memory
        const char* destination = aligned_destination ? "aligned" : "unaligned";
        SUBCASE(spill_test::subcase_name(io, backend, destination).c_str()) {
          auto arena = arena_or_skip(arena_options(dir.path(), io, backend));
          if (!arena) continue;
          const std::size_t n = 9 * spill::MiB + 13;
          CorruptedRegion c(*arena, dir.path(), n);
          std::vector<unsigned char> unaligned(n);
          AlignedBuffer aligned(n);
          unsigned char* dst = aligned_destination ? aligned.data : unaligned.data();
          spill::Pending p;
          REQUIRE_NOTHROW(p = c.region.read_async(dst, n));  // queued: nothing known yet
          // The check ran before the Pending was ready; its error waits for this thread.
          try {
            p.wait();
            FAIL("the changed byte was read back without an error");
          } catch (const spill::IntegrityError& e) {
            check_names_region(e, c.region, c.changed);
          }
          CHECK(p.ready());
          CHECK_THROWS_AS(p.wait(), spill::IntegrityError);  // every wait says so
          CHECK(arena->stats().integrity_failures == 1);
        }
      }
    }
  }
}

TEST_CASE("integrity: the RAM backing checks its reads too") {
  spill::ArenaOptions o = arena_options("");
  o.backing = spill::Backing::ram;
  spill::SpillArena arena(o);
  const auto src = pattern(8192, 5);
  spill::Region r = arena.allocate(src.size());
  r.write(src.data(), src.size());
  spill::detail::ArenaAccess::core(r).storage().base()[r.offset() + 100] ^= 1;  // host memory
  std::vector<unsigned char> dst(src.size());
  CHECK_THROWS_AS(r.read(dst.data(), dst.size()), spill::IntegrityError);
  CHECK_THROWS_AS(r.read_async(dst.data(), dst.size()).wait(), spill::IntegrityError);
}

TEST_CASE(
    "integrity: spill::checkpoint's backward stops at a changed input, computing no gradient") {
  using namespace spill_test::gpt;
  ScratchDir dir;
  for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
    for (auto backend : {spill::IoBackend::thread_pool, spill::IoBackend::automatic}) {
      SUBCASE(spill_test::subcase_name(io, backend).c_str()) {
        spill::ArenaOptions o = arena_options(dir.path(), io, backend);
        spill::SpillArena arena(o);
        spill::StashOptions sync;
        sync.keep_last = 0;         // every input spilled
        sync.asynchronous = false;  // ... and written before forward returns
        spill::set_stash_options(arena, sync);
        auto blocks = gpt_blocks(3);
        for (auto& p : blocks->parameters()) p.mutable_grad() = torch::Tensor();
        torch::Tensor x = torch::randn({2, 16, 64}).requires_grad_(true);
        torch::Tensor loss =
            spill::models::run_blocks(blocks, spill::make_arena_stash(arena), x).square().mean();
        const std::uint64_t spilled = arena.stats().high_water_bytes;
        REQUIRE(spilled > 0);
        {
          FileBehindTheArena file(dir.path());
          const std::uint64_t page = spill::page_size_bytes();
          for (std::uint64_t at = 0; at < spilled; at += page) file.flip(at);  // every region
        }
        CHECK_THROWS_AS(loss.backward(), spill::IntegrityError);
        CHECK_FALSE(x.grad().defined());
        for (auto& p : blocks->parameters()) CHECK_FALSE(p.grad().defined());
        CHECK(arena.stats().integrity_failures >= 1);
      }
    }
  }
}

// The red-team pass's crash: a restored input that was a view of the mapping was read by
// LibTorch's kernels during the recomputation, and a file cut meanwhile killed the process with
// SIGBUS. Restores now copy out in a guarded pass: the cut is a spill::IoError at the next read.
TEST_CASE("integrity: a spill file cut during backward is spill::IoError, never SIGBUS") {
  using namespace spill_test::gpt;
  ScratchDir dir;
  for (bool verify : {true, false}) {
    SUBCASE(verify ? "verify_integrity" : "no verify_integrity") {
      spill::ArenaOptions o =
          arena_options(dir.path(), spill::IoMode::buffered, spill::IoBackend::thread_pool);
      o.verify_integrity = verify;
      spill::SpillArena arena(o);
      spill::StashOptions every_input;
      every_input.keep_last = 0;
      // Every write done in forward: a write still in flight at the cut would extend the file
      // again once it lands, and the earlier regions would then read back as zeros (a hole),
      // which only the hashes catch (ctest -j2 saw it once, in the unverified subcase).
      every_input.asynchronous = false;
      auto stash = spill::make_arena_stash(arena, every_input);
      bool cut = false;
      auto layer = [&](const torch::Tensor& h) {
        if (torch::GradMode::is_enabled() && !cut) {  // the first recomputation, in backward
          truncate_spill_file(dir.path(), 0);
          cut = true;
        }
        return torch::tanh(h) * 1.5;
      };
      torch::Tensor x = torch::randn({256, 256}).requires_grad_(true);
      torch::Tensor h = x;
      for (int i = 0; i < 4; ++i) h = spill::checkpoint(*stash, layer, h);
      CHECK_THROWS_AS(h.sum().backward(), spill::IoError);
      CHECK(cut);
    }
  }
}

TEST_CASE("integrity: with verify_integrity off nothing is hashed and changed bytes come back") {
  ScratchDir dir;
  spill::ArenaOptions o = arena_options(dir.path());
  o.verify_integrity = false;
  spill::SpillArena arena(o);
  const std::size_t n = spill::MiB;
  CorruptedRegion c(arena, dir.path(), n);
  std::vector<unsigned char> dst(n);
  c.region.read(dst.data(), n);
  c.region.read_async(dst.data(), n).wait();
  CHECK(dst != c.src);  // silently wrong: what the option is for
  const spill::ArenaStats s = arena.stats();
  CHECK(s.bytes_hashed == 0);
  CHECK(s.bytes_verified == 0);
  CHECK(s.integrity_failures == 0);
}

TEST_CASE("integrity: a hash covers one write; a read checks the writes it covers whole") {
  ScratchDir dir;
  spill::SpillArena arena(arena_options(dir.path()));
  const std::uint64_t page = spill::page_size_bytes();
  spill::Region r = arena.allocate(16 * page);
  const auto a = pattern(page, 1);  // a page written at 0
  const auto b = pattern(page, 2);  // and one at the third page
  const std::uint64_t at_b = 2 * page;
  r.write(a.data(), a.size(), 0);
  r.write(b.data(), b.size(), at_b);
  std::vector<unsigned char> dst(16 * page);
  r.read(dst.data(), dst.size());
  CHECK(arena.stats().bytes_verified == 2 * page);
  r.read(dst.data(), 100);  // part of a's bytes: not checked
  CHECK(arena.stats().bytes_verified == 2 * page);
  r.read(dst.data(), page, at_b);  // b's bytes exactly
  CHECK(arena.stats().bytes_verified == 3 * page);

  FileBehindTheArena file(dir.path());
  file.flip(r.offset() + at_b + 7);
  try {
    r.read(dst.data(), dst.size());
    FAIL("the changed byte in b was read back without an error");
  } catch (const spill::IntegrityError& e) {
    CHECK(e.region_offset() == r.offset());
    CHECK(e.offset_in_region() == at_b);
    CHECK(e.bytes() == page);
    const std::string where = "at offset " + std::to_string(at_b) + " of the region";
    CHECK(std::string(e.what()).find(where) != std::string::npos);
  }
  r.write(b.data(), b.size(), at_b);       // rewritten: the arena is usable again
  r.write(a.data(), page / 2, 0);          // overlaps a: a's hash is forgotten, this one kept
  file.flip(r.offset() + page / 2 + 952);  // in a's old bytes only
  CHECK_NOTHROW(r.read(dst.data(), dst.size()));
  file.flip(r.offset() + 100);  // in the new write's bytes
  CHECK_THROWS_AS(r.read(dst.data(), dst.size()), spill::IntegrityError);
}

TEST_CASE("integrity: a freed region's hashes go with it") {
  ScratchDir dir;
  spill::SpillArena arena(arena_options(dir.path()));
  const std::uint64_t page = spill::page_size_bytes();
  const auto src = pattern(2 * page, 9);
  std::uint64_t offset = 0;
  {
    spill::Region r = arena.allocate(src.size());
    r.write(src.data(), src.size());
    offset = r.offset();
  }
  spill::Region again = arena.allocate(src.size());
  REQUIRE(again.offset() == offset);  // LIFO reuse: the same bytes
  again.write(src.data(), 100, page);
  FileBehindTheArena(dir.path()).flip(offset + 10);  // covered only by the freed region's write
  std::vector<unsigned char> dst(src.size());
  CHECK_NOTHROW(again.read(dst.data(), dst.size()));
  CHECK(arena.stats().bytes_verified == 100);
}

TEST_CASE("integrity: a read covering whole 4 MiB chunks of a larger write checks them") {
  ScratchDir dir;
  spill::SpillArena arena(arena_options(dir.path()));
  const std::size_t n = 9 * spill::MiB + 13;
  const auto src = pattern(n, 4);
  spill::Region r = spill_test::written_region(arena, src);
  std::vector<unsigned char> dst(4 * spill::MiB);
  r.read(dst.data(), 4 * spill::MiB, 4 * spill::MiB);  // the second chunk exactly
  CHECK(arena.stats().bytes_verified == 4 * spill::MiB);
  r.read(dst.data(), 4 * spill::MiB, 2 * spill::MiB);  // halves of two chunks: none checked
  CHECK(arena.stats().bytes_verified == 4 * spill::MiB);
  FileBehindTheArena(dir.path()).flip(r.offset() + 5 * spill::MiB);
  try {
    r.read(dst.data(), 4 * spill::MiB, 4 * spill::MiB);
    FAIL("the changed byte was read back without an error");
  } catch (const spill::IntegrityError& e) {
    CHECK(e.offset_in_region() == 4 * spill::MiB);
    CHECK(e.bytes() == 4 * spill::MiB);
  }
}

// 12 MiB is three chunks, each copied and hashed in one pass and compared as it lands (Note
// [Copying and hashing in one pass] in src/core/integrity/integrity.cc): a byte changed in every
// chunk is still one failed read, and the error names the first.
TEST_CASE("integrity: a read with several changed chunks is one failure, naming the first") {
  ScratchDir dir;
  spill::SpillArena arena(arena_options(dir.path()));
  const std::size_t n = 12 * spill::MiB + 5;
  const auto src = pattern(n, 5);
  spill::Region r = spill_test::written_region(arena, src);
  {
    FileBehindTheArena file(dir.path());
    for (std::uint64_t chunk = 0; chunk < 3; ++chunk) {
      file.flip(r.offset() + chunk * 4 * spill::MiB + 1000);
    }
  }
  std::vector<unsigned char> dst(n);
  for (std::uint64_t attempt = 1; attempt <= 2; ++attempt) {
    try {
      r.read(dst.data(), n);
      FAIL("the changed bytes were read back without an error");
    } catch (const spill::IntegrityError& e) {
      CHECK(e.offset_in_region() == 0);
      CHECK(e.bytes() == 4 * spill::MiB);
    }
    CHECK(arena.stats().integrity_failures == attempt);
  }
}

TEST_CASE("integrity: chunks split between pieces are hashed and checked after the last piece") {
  ScratchDir dir;
  // Direct I/O through 1 MiB staging slots: no 4 MiB chunk of a write lies in one piece. An
  // aligned read of 9 MiB + 5000 bytes: its last chunk straddles an O_DIRECT piece and the
  // unaligned tail read through staging.
  for (auto backend : backends()) {
    SUBCASE(spill_test::subcase_name(backend).c_str()) {
      spill::ArenaOptions o = arena_options(dir.path(), spill::IoMode::direct, backend);
      o.staging_bytes = spill::MiB;
      auto arena = arena_or_skip(o);
      if (!arena) continue;
      const std::size_t n = 9 * spill::MiB + 5000;
      CorruptedRegion c(*arena, dir.path(), n, 8 * spill::MiB + 10);
      AlignedBuffer dst(n);
      try {
        c.region.read_async(dst.data, n).wait();
        FAIL("the changed byte was read back without an error");
      } catch (const spill::IntegrityError& e) {
        check_names_region(e, c.region, c.changed);
        CHECK(e.offset_in_region() == 8 * spill::MiB);
        CHECK(e.bytes() == spill::MiB + 5000);
      }
      c.region.write(c.src.data(), n);  // rewritten: its new hashes match
      const std::uint64_t verified = arena->stats().bytes_verified;
      c.region.read_async(dst.data, n).wait();
      CHECK(std::memcmp(dst.data, c.src.data(), n) == 0);
      CHECK(arena->stats().bytes_verified == verified + n);
    }
  }
}

TEST_CASE("integrity: a write off the chunk grid, hashed slice by slice, verifies on every path") {
  // A synchronous write hashes as it copies, 512 KiB at a time (buffered: after each pwrite;
  // direct: as each slice is copied into a staging slot), its chunks carried across slices. The
  // hashes must be those of each chunk whole, which reads compute in one call per piece.
  ScratchDir dir;
  for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
    for (std::uint64_t staging : {spill::MiB, 4 * spill::MiB}) {
      SUBCASE(spill_test::subcase_name(io, "staging " + std::to_string(staging)).c_str()) {
        spill::ArenaOptions o = arena_options(dir.path(), io);
        o.staging_bytes = staging;
        spill::SpillArena arena(o);
        spill::Region r = arena.allocate(12 * spill::MiB);
        const std::uint64_t at = 3 * spill::MiB + spill::page_size_bytes();  // chunks: 3 partial
        const std::size_t n = 6 * spill::MiB + 777;
        const auto src = pattern(n, 6);
        r.write(src.data(), n, at);
        CHECK(arena.stats().bytes_hashed == n);
        std::vector<unsigned char> dst(n);
        r.read(dst.data(), n, at);
        CHECK(dst == src);
        std::vector<unsigned char> prefix(at + n);  // from the region's start: covers the write
        r.read_async(prefix.data(), prefix.size()).wait();
        CHECK(std::memcmp(prefix.data() + at, src.data(), n) == 0);
        CHECK(arena.stats().bytes_verified == 2 * n);
        CHECK(arena.stats().integrity_failures == 0);

        FileBehindTheArena(dir.path()).flip(r.offset() + 4 * spill::MiB + 123456);
        try {
          r.read(dst.data(), n, at);
          FAIL("the changed byte was read back without an error");
        } catch (const spill::IntegrityError& e) {
          CHECK(e.offset_in_region() == 4 * spill::MiB);
          CHECK(e.bytes() == 4 * spill::MiB);
        }
      }
    }
  }
}
