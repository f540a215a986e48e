// The per-file baseline fails like everything else: a full disk, a quota, a file size limit or an
// I/O error is a typed error naming the file, the bytes and the errno, never an abort from inside
// torch::save, and nothing is left in the directory (issue 19).
#include <torch/torch.h>  // before doctest: c10 defines a CHECK of its own, doctest's must win

#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "io_test_support.h"
#include "spill/spill.h"
#include "test_support.h"

using spill_test::FaultScope;
using spill_test::list_dir;
using spill_test::ScratchDir;

namespace {

// A float tensor of `bytes` (a multiple of 4), values that show a mix-up.
torch::Tensor tensor_of(std::uint64_t bytes) {
  return torch::arange(static_cast<std::int64_t>(bytes / 4), torch::kFloat);
}

// After a failed store the stash still works where there is room.
void check_still_usable(spill::TensorStash& stash) {
  const torch::Tensor small = tensor_of(4096);
  auto stashed = stash.store(small);
  CHECK(torch::equal(stashed->restore(), small));
}

// Every write of the file fails with `error` once `after_bytes` of it were written.
spill::testing::FaultHook failing_writes(int error, std::uint64_t after_bytes) {
  return [error, after_bytes](spill::testing::FaultSite site, std::uint64_t bytes,
                              std::uint64_t offset) -> std::int64_t {
    if (site != spill::testing::FaultSite::pwrite || offset + bytes <= after_bytes) {
      return static_cast<std::int64_t>(bytes);
    }
    return -error;
  };
}

// RLIMIT_FSIZE lowered for a scope, SIGXFSZ ignored meanwhile (EFBIG instead of a kill).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    REQUIRE(getrlimit(RLIMIT_FSIZE, &saved_) == 0);
    previous_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit lowered = saved_;
    lowered.rlim_cur = bytes;
    REQUIRE(setrlimit(RLIMIT_FSIZE, &lowered) == 0);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, previous_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit saved_{};
  void (*previous_handler_)(int) = SIG_DFL;
};

}  // namespace

TEST_CASE(
    "per-file stash: a full disk is InsufficientSpaceError naming the file, bytes and errno") {
  spill_test::LoopMount disk(16);
  if (!disk.ok()) {
    MESSAGE("skipped: " << disk.reason());
    return;
  }
  const auto before = list_dir(disk.path());
  auto stash = spill::make_per_file_stash(disk.path());
  const std::uint64_t bytes = 24 * spill::MiB;  // more than the whole file system
  try {
    stash->store(tensor_of(bytes));
    FAIL("a 24 MiB tensor was stored on a 16 MiB file system");
  } catch (const spill::InsufficientSpaceError& e) {
    const std::string message = e.what();
    CAPTURE(message);
    CHECK(e.path() == disk.path());
    CHECK(e.needed_bytes() >= bytes);
    CHECK(e.available_bytes() < bytes);
    CHECK(message.find(disk.path() + "/spillarena-per-file-") != std::string::npos);
    CHECK(message.find(std::strerror(ENOSPC)) != std::string::npos);
    CHECK(message.find("errno " + std::to_string(ENOSPC)) != std::string::npos);
    CHECK(message.find("Free space there") != std::string::npos);
  }
  CHECK(list_dir(disk.path()) == before);
  check_still_usable(*stash);
  CHECK(list_dir(disk.path()) == before);
}

TEST_CASE("per-file stash: a checkpointed layer on a full disk fails typed, leaving no file") {
  spill_test::LoopMount disk(16);
  if (!disk.ok()) {
    MESSAGE("skipped: " << disk.reason());
    return;
  }
  const auto before = list_dir(disk.path());
  auto stash = spill::make_per_file_stash(disk.path());
  torch::Tensor x = tensor_of(4 * spill::MiB).view({1024, 1024}).requires_grad_(true);
  std::vector<torch::Tensor> kept;  // the graph keeps each layer's file until backward
  auto forward = [&] {
    torch::Tensor h = x;
    for (int layer = 0; layer < 8; ++layer) {
      h = spill::checkpoint(*stash, [](const torch::Tensor& in) { return in * 1.5; }, h);
      kept.push_back(h);
    }
  };
  CHECK_THROWS_AS(forward(), spill::InsufficientSpaceError);
  CHECK(list_dir(disk.path()).size() > before.size());  // the layers stored before the failure
  kept.clear();
  CHECK(list_dir(disk.path()) == before);
}

TEST_CASE("per-file stash: every failed write is typed and removes the partial file") {
  ScratchDir dir;
  auto stash = spill::make_per_file_stash(dir.path());
  const torch::Tensor t = tensor_of(spill::MiB);
  for (int error : {ENOSPC, EDQUOT, EIO, EFBIG}) {
    for (std::uint64_t after : {std::uint64_t{0}, std::uint64_t{64 * 1024}}) {
      const std::string fails_after = "after " + std::to_string(after) + " bytes";
      SUBCASE(spill_test::subcase_name(spill_test::errno_name(error), fails_after).c_str()) {
        {
          FaultScope faults(failing_writes(error, after));
          try {
            stash->store(t);
            FAIL("the store succeeded although every write failed");
          } catch (const spill::InsufficientSpaceError& e) {
            CHECK((error == ENOSPC || error == EDQUOT));
            CHECK(e.needed_bytes() >= spill::MiB);
            CHECK(std::string(e.what()).find("errno " + std::to_string(error)) !=
                  std::string::npos);
          } catch (const spill::IoError& e) {
            CHECK(e.error_number() == error);
            CHECK(e.op() == spill::IoOp::write);
            CHECK(e.offset() <= after);  // the write that reached `after`
            CHECK(e.bytes() >= spill::MiB);
            CHECK(std::string(e.what()).find(dir.path() + "/spillarena-per-file-") !=
                  std::string::npos);
          }
        }
        CHECK(list_dir(dir.path()).empty());
      }
    }
  }
  check_still_usable(*stash);
  CHECK(list_dir(dir.path()).empty());
}

TEST_CASE("per-file stash: a file size limit is IoError EFBIG, not a kill or an abort") {
  ScratchDir dir;
  auto stash = spill::make_per_file_stash(dir.path());
  {
    FileSizeLimit limit(256 * 1024);
    CHECK_THROWS_WITH_AS(stash->store(tensor_of(spill::MiB)), doctest::Contains("ulimit -f"),
                         spill::IoError);
    CHECK(list_dir(dir.path()).empty());
  }
  check_still_usable(*stash);
}

TEST_CASE("per-file stash: a directory that is no directory is DirectoryError naming the errno") {
  ScratchDir dir;
  const std::string fifo = dir.path() + "/fifo";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  for (const std::string& path : {fifo, std::string("/dev/null"), dir.path() + "/missing"}) {
    CAPTURE(path);
    CHECK_THROWS_WITH_AS(spill::make_per_file_stash(path), doctest::Contains("errno"),
                         spill::DirectoryError);
  }
  CHECK_THROWS_AS(spill::make_per_file_stash(dir.path() + std::string("\0/etc", 5)),
                  spill::InvalidArgumentError);
}
