// The spill file's protection: mode 0600 whatever the umask, no name (O_TMPFILE | O_EXCL, or the
// mkostemp + unlink fallback), no link can give it one, planted symlinks are never followed, and
// another user can open it neither through /proc/<pid>/fd nor by a name. With LibTorch, the
// per-file stash's named files too. See Note [Unnamed spill file] in src/core/os/platform_posix.cc.
#ifdef SPILLARENA_TEST_WITH_TORCH
#include <torch/torch.h>  // before doctest: c10 defines a CHECK of its own, doctest's must win
#endif
#include <doctest/doctest.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/os/fault_injection.h"
#include "core/os/platform.h"
#include "io_test_support.h"
#include "spill/core.h"
#include "test_support.h"

#ifdef SPILLARENA_TEST_WITH_TORCH
#include "spill/tensor_stash.h"
#endif

using spill_test::FaultScope;
using spill_test::list_dir;
using spill_test::ScratchDir;

namespace {

// The unprivileged user another process runs as in the cross-user checks.
constexpr uid_t kNobody = 65534;

// Forces open_unnamed_file's fallback: O_TMPFILE answers EOPNOTSUPP, as on some FUSE and network
// file systems.
spill::testing::FaultHook no_unnamed_open() {
  using spill::testing::FaultSite;
  return [](FaultSite site, std::uint64_t bytes, std::uint64_t) -> std::int64_t {
    return site == FaultSite::open_unnamed ? -EOPNOTSUPP : static_cast<std::int64_t>(bytes);
  };
}

struct UmaskScope {
  explicit UmaskScope(mode_t mask) : previous(umask(mask)) {}
  ~UmaskScope() { umask(previous); }
  mode_t previous;
};

struct SpillFd {
  int fd;
  std::string target;  // what /proc/self/fd/<fd> points at: "<dir>/#123 (deleted)", ...
};

// This process's descriptors of files in `dir`: the spill file's.
std::vector<SpillFd> spill_fds(const std::string& dir) {
  const std::string prefix = spill_test::fs::canonical(dir).string() + "/";
  std::vector<SpillFd> found;
  for (const auto& entry : spill_test::fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = spill_test::fs::read_symlink(entry.path(), ec).string();
    if (!ec && target.compare(0, prefix.size(), prefix) == 0) {
      found.push_back({std::stoi(entry.path().filename().string()), target});
    }
  }
  return found;
}

// 4 MiB through the thread pool; a 1 MiB staging pool in direct mode.
spill::ArenaOptions small_arena_in(const std::string& dir, spill::IoMode io) {
  return spill_test::options_in(dir, 4 * spill::MiB, io, spill::IoBackend::thread_pool, spill::MiB);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The /proc/self/maps range of the spill file's mapping, as /proc/<pid>/map_files names it.
std::string mapping_range(const std::string& dir) {
  const std::string prefix = spill_test::fs::canonical(dir).string() + "/";
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(prefix) != std::string::npos) return line.substr(0, line.find(' '));
  }
  return "";
}

// Forks a child that becomes uid/gid 65534 and tries to open every path, read-only and
// read-write. Returns "" when every open failed with one of `allowed`, else what happened.
std::string open_as_nobody(const std::vector<std::string>& paths) {
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // only async-signal-safe calls from here: the parent has threads
    if (setgroups(0, nullptr) != 0 || setgid(kNobody) != 0 || setuid(kNobody) != 0) _exit(3);
    for (std::size_t i = 0; i < paths.size() && i < 50; ++i) {
      for (int flags : {O_RDONLY, O_RDWR}) {
        const int fd = open(paths[i].c_str(), flags | O_CLOEXEC);
        if (fd >= 0) _exit(static_cast<int>(10 + i));
        if (errno != EACCES && errno != ENOENT && errno != EPERM) _exit(static_cast<int>(100 + i));
      }
    }
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  const int code = WEXITSTATUS(status);
  if (code == 0) return "";
  if (code == 3) return "skipped: cannot become uid 65534 here (a user namespace without it?)";
  if (code >= 100) return "unexpected errno opening " + paths[static_cast<std::size_t>(code - 100)];
  return "uid 65534 opened " + paths[static_cast<std::size_t>(code - 10)];
}

}  // namespace

TEST_CASE("security: the spill file is mode 0600 and nameless, by O_TMPFILE and by the fallback") {
  for (bool fallback : {false, true}) {
    for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
      for (mode_t mask : {mode_t{0}, mode_t{0277}}) {
        const char* opened = fallback ? "fallback" : "O_TMPFILE";
        const char* mask_name = mask == 0 ? "umask 000" : "umask 277";
        SUBCASE(spill_test::subcase_name(opened, io, mask_name).c_str()) {
          ScratchDir dir;
          UmaskScope umask_scope(mask);
          std::optional<FaultScope> forced;
          if (fallback) forced.emplace(no_unnamed_open());
          spill::SpillArena arena(small_arena_in(dir.path(), io));
          CHECK(arena.opened_without_name() == !fallback);
          const auto fds = spill_fds(dir.path());
          CHECK(fds.size() == (io == spill::IoMode::direct ? 2u : 1u));  // direct: a second one
          for (const SpillFd& f : fds) {
            CAPTURE(f.target);
            struct stat s;
            REQUIRE(fstat(f.fd, &s) == 0);
            CHECK(S_ISREG(s.st_mode));
            CHECK((s.st_mode & 07777) == 0600);
            CHECK(s.st_uid == geteuid());
            CHECK(s.st_nlink == 0);
          }
          CHECK(list_dir(dir.path()).empty());
        }
      }
    }
  }
}

TEST_CASE("security: no link can give the spill file a name, not even root's") {
  for (bool fallback : {false, true}) {
    SUBCASE(fallback ? "fallback" : "O_TMPFILE") {
      ScratchDir dir;
      std::optional<FaultScope> forced;
      if (fallback) forced.emplace(no_unnamed_open());
      spill::SpillArena arena(small_arena_in(dir.path(), spill::IoMode::buffered));
      const auto fds = spill_fds(dir.path());
      REQUIRE(fds.size() == 1);
      const std::string proc_path = "/proc/self/fd/" + std::to_string(fds[0].fd);
      const std::string name = dir.path() + "/named";
      // An O_TMPFILE opened without O_EXCL could be linked here; an unlinked file never can.
      CHECK(linkat(AT_FDCWD, proc_path.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) != 0);
      CHECK(linkat(fds[0].fd, "", AT_FDCWD, name.c_str(), AT_EMPTY_PATH) != 0);
      CHECK(list_dir(dir.path()).empty());
    }
  }
}

TEST_CASE("security: a symlink planted in the spill directory is never followed") {
  ScratchDir dir;
  ScratchDir elsewhere;
  const std::string victim = elsewhere.path() + "/victim";
  const std::string absent = elsewhere.path() + "/absent";
  std::ofstream(victim) << "victim";
  spill_test::fs::create_symlink(victim, dir.path() + "/link-to-victim");
  spill_test::fs::create_symlink(absent, dir.path() + "/dangling");
  const auto planted = list_dir(dir.path());
  for (bool fallback : {false, true}) {
    for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
      std::optional<FaultScope> forced;
      if (fallback) forced.emplace(no_unnamed_open());
      spill::SpillArena arena(small_arena_in(dir.path(), io));
      spill::Region r = arena.allocate(spill::MiB);
      std::vector<char> bytes(spill::MiB, 'x');
      r.write(bytes.data(), bytes.size());
    }
  }
  // The per-file stash's own files pass planted symlinks by: the cases under
  // SPILLARENA_TEST_WITH_TORCH below.
  CHECK(read_file(victim) == "victim");
  CHECK_FALSE(spill_test::fs::exists(absent));
  CHECK(list_dir(dir.path()) == planted);
  CHECK(spill_test::fs::is_symlink(dir.path() + "/link-to-victim"));
}

TEST_CASE("security: another user can open the spill file neither through /proc nor by a name") {
  if (geteuid() != 0) {
    MESSAGE("skipped: not root, so this process cannot become another user to try");
    return;
  }
  for (bool fallback : {false, true}) {
    for (auto io : {spill::IoMode::buffered, spill::IoMode::direct}) {
      SUBCASE(spill_test::subcase_name(fallback ? "fallback" : "O_TMPFILE", io).c_str()) {
        ScratchDir dir;
        REQUIRE(chmod(dir.path().c_str(), 01777) == 0);  // like /tmp: anyone may look for names
        std::optional<FaultScope> forced;
        if (fallback) forced.emplace(no_unnamed_open());
        spill::SpillArena arena(small_arena_in(dir.path(), io));
        const auto fds = spill_fds(dir.path());
        REQUIRE_FALSE(fds.empty());
        const std::string pid = std::to_string(getpid());
        std::vector<std::string> paths;
        for (const SpillFd& f : fds) {
          paths.push_back("/proc/" + pid + "/fd/" + std::to_string(f.fd));
          const std::string deleted = " (deleted)";
          CHECK(f.target.size() > deleted.size());
          paths.push_back(f.target.substr(0, f.target.size() - deleted.size()));  // its old name
          paths.push_back(f.target);
        }
        const std::string range = mapping_range(dir.path());
        CHECK_FALSE(range.empty());
        paths.push_back("/proc/" + pid + "/map_files/" + range);
        for (const std::string& name : list_dir(dir.path())) {
          paths.push_back(dir.path() + "/" + name);
        }
        const int own = open(paths[0].c_str(), O_RDONLY | O_CLOEXEC);  // the paths are right
        CHECK(own >= 0);
        if (own >= 0) close(own);
        const std::string outcome = open_as_nobody(paths);
        if (outcome.rfind("skipped:", 0) == 0) {
          MESSAGE(outcome);
          return;
        }
        CHECK_MESSAGE(outcome.empty(), outcome);
      }
    }
  }
}

#ifdef SPILLARENA_TEST_WITH_TORCH
namespace {

// The one per-file stash file in `dir`.
std::string only_file(const std::string& dir) {
  const auto names = list_dir(dir);
  REQUIRE(names.size() == 1);
  return dir + "/" + *names.begin();
}

// The names the per-file stash chose before issue 19: the process id and a counter, which anyone
// who can write the directory could plant in advance.
std::string predictable_name(const std::string& dir, std::uint64_t n) {
  return dir + "/spillarena-per-file-" + std::to_string(getpid()) + "-" + std::to_string(n) + ".pt";
}

// "spillarena-per-file-" + 32 lower-case hex digits + ".pt".
bool has_random_name(const std::string& name) {
  const std::string prefix = "spillarena-per-file-";
  if (name.size() != prefix.size() + 32 + 3 || name.rfind(prefix, 0) != 0) return false;
  if (name.substr(name.size() - 3) != ".pt") return false;
  const std::string hex = name.substr(prefix.size(), 32);
  return hex.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

TEST_CASE("security: the per-file stash writes 0600 files under names nobody can predict") {
  ScratchDir dir;
  std::set<std::string> seen;
  std::vector<std::unique_ptr<spill::StashedTensor>> kept;
  auto stash = spill::make_per_file_stash(dir.path());
  for (int i = 0; i < 8; ++i) {
    const auto before = list_dir(dir.path());
    kept.push_back(stash->store(torch::arange(16, torch::kFloat) * i));
    auto after = list_dir(dir.path());
    for (const auto& old : before) after.erase(old);
    REQUIRE(after.size() == 1);
    const std::string name = *after.begin();
    CAPTURE(name);
    CHECK(has_random_name(name));  // 32 random hex digits: no pid, no counter (the old names)
    struct stat s;
    REQUIRE(lstat((dir.path() + "/" + name).c_str(), &s) == 0);
    CHECK(S_ISREG(s.st_mode));
    CHECK((s.st_mode & 07777) == 0600);
    seen.insert(name);
  }
  CHECK(seen.size() == 8);
  for (int i = 7; i >= 0; --i) {
    CHECK(torch::equal(kept[static_cast<std::size_t>(i)]->restore(),
                       torch::arange(16, torch::kFloat) * i));
  }
  kept.clear();
  CHECK(list_dir(dir.path()).empty());
}

TEST_CASE(
    "security: names squatted in a shared directory neither stop nor redirect the per-file stash") {
  ScratchDir dir;
  ScratchDir elsewhere;
  const std::string victim = elsewhere.path() + "/victim";
  std::ofstream(victim) << "victim";
  // Another user of the directory plants symlinks at every name the old scheme would choose.
  for (std::uint64_t n = 0; n < 1000; ++n) {
    spill_test::fs::create_symlink(victim, predictable_name(dir.path(), n));
  }
  const auto planted = list_dir(dir.path());
  auto stash = spill::make_per_file_stash(dir.path());
  const torch::Tensor a = torch::arange(16, torch::kFloat);
  const torch::Tensor b = torch::arange(32, torch::kFloat) * 2;
  auto first = stash->store(a);
  auto second = stash->store(b);
  CHECK(read_file(victim) == "victim");
  CHECK(torch::equal(second->restore(), b));
  CHECK(torch::equal(first->restore(), a));
  first.reset();
  second.reset();
  CHECK(read_file(victim) == "victim");
  CHECK(list_dir(dir.path()) == planted);
}

// Names are random, so no test can plant a link at the next one; the creation they go through
// must still refuse any existing name, a symlink to another file included.
TEST_CASE("security: a per-file name that exists, even as a symlink, is never written through") {
  ScratchDir dir;
  ScratchDir elsewhere;
  const std::string victim = elsewhere.path() + "/victim";
  std::ofstream(victim) << "victim";
  const std::string link = dir.path() + "/planted";
  spill_test::fs::create_symlink(victim, link);
  const std::string plain = dir.path() + "/existing";
  std::ofstream(plain) << "existing";
  for (const std::string& path : {link, plain}) {
    CAPTURE(path);
    int fd = -1;
    CHECK(spill::platform::create_new_file(path, &fd) == EEXIST);
    CHECK(fd == -1);
  }
  CHECK(read_file(victim) == "victim");
  CHECK(read_file(plain) == "existing");
}

TEST_CASE("security: the per-file stash refuses a file swapped in after it wrote its own") {
  ScratchDir dir;
  ScratchDir elsewhere;
  const torch::Tensor theirs = torch::full({16}, 7.0);
  const std::string victim = elsewhere.path() + "/theirs.pt";
  torch::save(theirs, victim);  // a valid tensor file: loading it would "work"
  auto stash = spill::make_per_file_stash(dir.path());
  const torch::Tensor ours = torch::arange(16, torch::kFloat);
  {
    auto stashed = stash->store(ours);
    const std::string path = only_file(dir.path());
    spill_test::fs::remove(path);
    spill_test::fs::create_symlink(victim, path);
    CHECK_THROWS_WITH_AS(stashed->restore(), doctest::Contains("Too many levels of symbolic links"),
                         spill::IoError);
  }
  {
    auto stashed = stash->store(ours);
    const std::string path = only_file(dir.path());
    spill_test::fs::remove(path);
    spill_test::fs::copy_file(victim, path);  // very likely the freed inode number, reused
    CHECK_THROWS_WITH_AS(stashed->restore(), doctest::Contains("another file now has its name"),
                         spill::IoError);
  }
  CHECK(spill_test::fs::exists(victim));
  torch::Tensor still;
  torch::load(still, victim);
  CHECK(torch::equal(still, theirs));
}
#endif
