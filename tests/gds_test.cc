// GPUDirect Storage (src/core/io/gds.h): loading libcufile at run time, its typed errors, and the
// transfers through a fake cuFile table where "device memory" is host memory. No GPU needed;
// the real library's case runs where SPILLARENA_TEST_CUFILE_LIBRARY names one (else skipped).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/io/gds.h"
#include "spill/core.h"
#include "test_support.h"

using spill::detail::CuFileApi;
using spill::detail::CuFileDescriptor;
using spill::detail::CuFileDriverProperties;
using spill::detail::CuFileStatus;
using spill::detail::GdsDriver;
using spill::detail::GdsFile;
using spill_test::ScratchDir;

namespace {

constexpr std::uint64_t kPage = GdsFile::kAlignmentBytes;

// Sets an environment variable for the scope, then restores what was there.
class EnvScope {
 public:
  EnvScope(const char* name, const std::string& value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old;
    had_ = old != nullptr;
    setenv(name, value.c_str(), 1);
  }
  ~EnvScope() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

const char* const kMissingLibrary = "/nonexistent/spillarena-test/libcufile.so.0";

// ---------------------------------------------------------------------------------------------
// A fake cuFile: records every call, answers with chosen statuses, and moves bytes between
// host memory (standing for device memory) and a byte vector (standing for the file).
// ---------------------------------------------------------------------------------------------

struct Transfer {
  bool write;
  const void* base;
  std::size_t bytes;
  std::int64_t file_offset;
  std::int64_t base_offset;
};

struct FakeCuFile {
  int driver_open_status = 0;
  int driver_opens = 0;
  int driver_closes = 0;
  unsigned int nvfs_major_version = 2;
  unsigned int nvfs_status_flags = 0;
  bool force_compat = false;
  int handle_register_status = 0;
  int handle_registers = 0;
  int handle_deregisters = 0;
  int registered_fd = -1;
  int buf_register_status = 0;
  std::vector<std::pair<const void*, std::size_t>> buf_registers;
  std::vector<const void*> buf_deregisters;
  std::vector<Transfer> transfers;
  std::deque<std::int64_t> answers;  // what the next transfers return; empty: every byte
  int errno_on_failure = 0;
  std::vector<char> file = std::vector<char>(64 * kPage);
  unsigned int cache_kib = 128 * 1024;  // max_device_cache_size
  unsigned int per_buffer_kib = 1024;   // per_buffer_cache_size
  std::vector<std::size_t> cache_limits_kib;
};

FakeCuFile* fake = nullptr;
char fake_handle_object;

CuFileStatus status_of(int code) { return CuFileStatus{code, 0}; }

std::int64_t fake_transfer(bool write, const void* base, std::size_t bytes, std::int64_t at,
                           std::int64_t base_offset) {
  fake->transfers.push_back(Transfer{write, base, bytes, at, base_offset});
  std::int64_t moved = static_cast<std::int64_t>(bytes);
  if (!fake->answers.empty()) {
    moved = fake->answers.front();
    fake->answers.pop_front();
  }
  if (moved < 0) {
    errno = fake->errno_on_failure;
    return moved;
  }
  char* memory = const_cast<char*>(static_cast<const char*>(base)) + base_offset;
  char* file = fake->file.data() + at;
  if (write) {
    std::memcpy(file, memory, static_cast<std::size_t>(moved));
  } else {
    std::memcpy(memory, file, static_cast<std::size_t>(moved));
  }
  return moved;
}

CuFileApi fake_api() {
  CuFileApi api{};
  api.driver_open = []() {
    ++fake->driver_opens;
    return status_of(fake->driver_open_status);
  };
  api.driver_close = []() {
    ++fake->driver_closes;
    return status_of(0);
  };
  api.driver_get_properties = [](CuFileDriverProperties* p) {
    p->nvfs.major_version = fake->nvfs_major_version;
    p->nvfs.dstatusflags = fake->nvfs_status_flags;
    p->max_device_cache_size = fake->cache_kib;
    p->per_buffer_cache_size = fake->per_buffer_kib;
    return status_of(0);
  };
  api.driver_set_max_cache_size = [](std::size_t kib) {
    fake->cache_limits_kib.push_back(kib);
    fake->cache_kib = static_cast<unsigned int>(kib);
    return status_of(0);
  };
  api.get_parameter_bool = [](int parameter, bool* value) {
    *value = parameter == spill::detail::kCuFileParamForceCompatMode && fake->force_compat;
    return status_of(0);
  };
  api.handle_register = [](void** handle, CuFileDescriptor* d) {
    ++fake->handle_registers;
    fake->registered_fd = d->handle.fd;
    *handle = &fake_handle_object;
    return status_of(fake->handle_register_status);
  };
  api.handle_deregister = [](void* handle) {
    if (handle == &fake_handle_object) ++fake->handle_deregisters;
  };
  api.buf_register = [](const void* base, std::size_t bytes, int) {
    fake->buf_registers.emplace_back(base, bytes);
    return status_of(fake->buf_register_status);
  };
  api.buf_deregister = [](const void* base) {
    fake->buf_deregisters.push_back(base);
    return status_of(0);
  };
  api.read = [](void* h, void* base, std::size_t bytes, std::int64_t at, std::int64_t off) {
    return fake_transfer(false, base, bytes, at, off);
  };
  api.write = [](void* h, const void* base, std::size_t bytes, std::int64_t at, std::int64_t off) {
    return fake_transfer(true, base, bytes, at, off);
  };
  return api;
}

// Installs a fresh fake for the scope.
struct FakeScope {
  FakeCuFile state;
  FakeScope() { fake = &state; }
  ~FakeScope() { fake = nullptr; }
  std::shared_ptr<GdsDriver> driver() { return std::make_shared<GdsDriver>(fake_api(), "fake"); }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Loading the library
// ---------------------------------------------------------------------------------------------

TEST_CASE("gds: a missing libcufile is a typed error naming the library and how to get it") {
  EnvScope env("SPILLARENA_CUFILE_LIBRARY", kMissingLibrary);
  try {
    spill::detail::cufile_library();
    FAIL("a missing library loaded");
  } catch (const spill::GdsUnavailableError& e) {
    const std::string message = e.what();
    CHECK(e.library() == kMissingLibrary);
    CHECK(e.cufile_status() == 0);
    CHECK(message.find(kMissingLibrary) != std::string::npos);
    CHECK(message.find("No such file") != std::string::npos);  // dlerror()'s text
    CHECK(message.find("pip install nvidia-cufile-cu12") != std::string::npos);
    CHECK(message.find("LD_LIBRARY_PATH") != std::string::npos);
  }
  // The process's shared session asks the same loader.
  CHECK_THROWS_AS(GdsDriver::shared(), spill::GdsUnavailableError);
}

TEST_CASE("gds: the library searched by default is libcufile.so.0") {
  unsetenv("SPILLARENA_CUFILE_LIBRARY");
  CHECK(spill::detail::cufile_library_name() == "libcufile.so.0");
}

TEST_CASE("gds: a library without cuFile's entry points is a typed error naming one") {
  EnvScope env("SPILLARENA_CUFILE_LIBRARY", "libm.so.6");
  try {
    spill::detail::cufile_library();
    FAIL("libm passed for libcufile");
  } catch (const spill::GdsUnavailableError& e) {
    CHECK(std::string(e.what()).find("cuFileDriverOpen") != std::string::npos);
    CHECK(e.library() == "libm.so.6");
  }
}

TEST_CASE("gds: an arena asked for io = gds without libcufile is refused when made") {
  EnvScope env("SPILLARENA_CUFILE_LIBRARY", kMissingLibrary);
  ScratchDir dir;
  spill::ArenaOptions o;
  o.directory = dir.path();
  o.capacity_bytes = 4 * spill::MiB;
  o.staging_bytes = spill::MiB;
  o.io = spill::IoMode::gds;
  CHECK_THROWS_AS(spill::SpillArena{o}, spill::GdsUnavailableError);
  CHECK(spill_test::list_dir(dir.path()).empty());  // nothing left on disk
}

TEST_CASE("gds: the mode is named gds and automatic never picks it") {
  CHECK(std::string(spill::to_string(spill::IoMode::gds)) == "gds");
  ScratchDir dir;
  spill::ArenaOptions o;
  o.directory = dir.path();
  o.capacity_bytes = 4 * spill::MiB;
  o.staging_bytes = spill::MiB;
  spill::SpillArena arena(o);
  CHECK(arena.stats().io_mode != spill::IoMode::gds);
}

// ---------------------------------------------------------------------------------------------
// Driver session
// ---------------------------------------------------------------------------------------------

TEST_CASE("gds: a driver that does not open is a typed error naming cuFile's status") {
  FakeScope f;
  f.state.driver_open_status = 5001;
  try {
    f.driver();
    FAIL("the driver opened");
  } catch (const spill::GdsUnavailableError& e) {
    const std::string message = e.what();
    CHECK(e.cufile_status() == 5001);
    CHECK(e.library() == "fake");
    CHECK(message.find("CU_FILE_DRIVER_NOT_INITIALIZED (5001)") != std::string::npos);
    CHECK(message.find("allow_compat_mode") != std::string::npos);
  }
  CHECK(f.state.driver_closes == 0);  // nothing to close: it never opened
}

TEST_CASE("gds: the driver names the mode that runs: gds, or compatibility without nvidia-fs") {
  FakeScope f;
  CHECK(std::string(f.driver()->mode()) == "gds");
  f.state.nvfs_major_version = 0;
  CHECK(f.driver()->compatibility_mode());
  CHECK(std::string(f.driver()->mode()) == "compatibility (POSIX through cuFile's bounce buffers)");
  f.state.nvfs_status_flags = 1u << spill::detail::kCuFileNvmeP2pSupportedBit;  // P2PDMA
  CHECK_FALSE(f.driver()->compatibility_mode());
  f.state.nvfs_major_version = 2;
  f.state.force_compat = true;
  CHECK(f.driver()->compatibility_mode());
  CHECK(f.state.driver_opens == f.state.driver_closes);
}

// ---------------------------------------------------------------------------------------------
// Registered file and buffers
// ---------------------------------------------------------------------------------------------

TEST_CASE("gds: the file is registered once and deregistered, then the driver closed, at the end") {
  FakeScope f;
  {
    GdsFile file(f.driver(), 42);
    CHECK(f.state.handle_registers == 1);
    CHECK(f.state.registered_fd == 42);
    CHECK(f.state.driver_opens == 1);
    std::vector<char> device(kPage);
    file.write(device.data(), kPage, 0);
    file.read(device.data(), kPage, 0);
    CHECK(f.state.handle_registers == 1);
    CHECK(f.state.handle_deregisters == 0);
  }
  CHECK(f.state.handle_deregisters == 1);
  CHECK(f.state.driver_closes == 1);
}

TEST_CASE("gds: a file cuFile refuses is a typed error naming cuFile's status") {
  FakeScope f;
  f.state.handle_register_status = 5019;
  try {
    GdsFile file(f.driver(), 7);
    FAIL("the file registered");
  } catch (const spill::GdsUnavailableError& e) {
    CHECK(e.cufile_status() == 5019);
    CHECK(std::string(e.what()).find("CU_FILE_INVALID_FILE_OPEN_FLAG") != std::string::npos);
  }
  CHECK(f.state.driver_closes == 1);
  CHECK_THROWS_AS(GdsFile(f.driver(), -1), spill::InvalidArgumentError);  // not a direct arena
  CHECK(f.state.handle_registers == 1);
}

TEST_CASE("gds: a buffer is registered once per pointer and deregistered at destruction") {
  FakeScope f;
  std::vector<char> a(4 * kPage), b(2 * kPage);
  {
    GdsFile file(f.driver(), 3);
    file.register_buffer(a.data(), 2 * kPage);
    file.register_buffer(a.data(), 2 * kPage);
    file.register_buffer(a.data(), kPage);  // fewer bytes: already covered
    CHECK(f.state.buf_registers.size() == 1);
    file.register_buffer(a.data(), 4 * kPage);  // more bytes: registered anew
    REQUIRE(f.state.buf_registers.size() == 2);
    CHECK(f.state.buf_registers[1].second == 4 * kPage);
    CHECK(f.state.buf_deregisters == std::vector<const void*>{a.data()});
    file.register_buffer(b.data(), b.size());
    CHECK(file.registered_buffers() == 2);
  }
  CHECK(f.state.buf_deregisters.size() == 3);
  CHECK(f.state.handle_deregisters == 1);
}

TEST_CASE("gds: a refused buffer registration is an IoError and leaves it unregistered") {
  FakeScope f;
  f.state.buf_register_status = 5036;
  std::vector<char> a(kPage);
  GdsFile file(f.driver(), 3);
  try {
    file.register_buffer(a.data(), kPage);
    FAIL("the buffer registered");
  } catch (const spill::IoError& e) {
    CHECK(e.error_number() == ENOMEM);
    CHECK(e.bytes() == kPage);
    CHECK(std::string(e.what()).find("CU_FILE_GPU_MEMORY_PINNING_FAILED (5036)") !=
          std::string::npos);
  }
  CHECK(file.registered_buffers() == 0);
  file.write(a.data(), kPage, 0);  // unregistered memory still moves (bounce buffers)
  CHECK(f.state.transfers.size() == 1);
}

TEST_CASE("gds: a pointer inside a registered buffer is passed as the buffer and an offset") {
  FakeScope f;
  std::vector<char> device(8 * kPage);
  GdsFile file(f.driver(), 3);
  file.register_buffer(device.data(), device.size());
  file.write(device.data() + 2 * kPage, kPage, 5 * kPage);
  REQUIRE(f.state.transfers.size() == 1);
  CHECK(f.state.transfers[0].base == device.data());
  CHECK(f.state.transfers[0].base_offset == static_cast<std::int64_t>(2 * kPage));
  CHECK(f.state.transfers[0].file_offset == static_cast<std::int64_t>(5 * kPage));
  // Past the registered bytes: passed as it is.
  std::vector<char> other(kPage);
  file.read(other.data(), kPage, 0);
  CHECK(f.state.transfers[1].base == other.data());
  CHECK(f.state.transfers[1].base_offset == 0);
}

TEST_CASE("gds: a registration of one's own lives as long as its object") {
  FakeScope f;
  std::vector<char> staging(2 * kPage);
  {
    spill::detail::GdsRegistration r(f.driver(), staging.data(), staging.size());
    REQUIRE(f.state.buf_registers.size() == 1);
    CHECK(f.state.buf_registers[0].first == staging.data());
    CHECK(f.state.buf_deregisters.empty());
  }
  CHECK(f.state.buf_deregisters == std::vector<const void*>{staging.data()});
  f.state.buf_register_status = 5036;
  CHECK_THROWS_AS(spill::detail::GdsRegistration(f.driver(), staging.data(), kPage),
                  spill::IoError);
  CHECK(f.state.buf_deregisters.size() == 1);  // nothing to deregister
}

// ---------------------------------------------------------------------------------------------
// cuFile's bounce buffers (Note [cuFile's bounce buffers] in gds.cc)
// ---------------------------------------------------------------------------------------------

TEST_CASE("gds: bounce buffers count as host memory in compatibility mode only") {
  FakeScope f;
  CHECK(f.driver()->bounce_bytes() == 0);  // nvidia-fs: they are device memory
  f.state.nvfs_major_version = 0;
  CHECK(f.driver()->bounce_bytes() == 128 * spill::MiB);
}

TEST_CASE("gds: bounce buffers are capped in whole buffers, never raised, and read back") {
  FakeScope f;
  f.state.nvfs_major_version = 0;
  std::shared_ptr<GdsDriver> driver = f.driver();
  CHECK(driver->limit_bounce_bytes(10 * spill::MiB + 5000) == 10 * spill::MiB);
  CHECK(f.state.cache_limits_kib == std::vector<std::size_t>{10 * 1024});
  CHECK(driver->limit_bounce_bytes(64 * spill::MiB) == 10 * spill::MiB);  // not raised
  CHECK(driver->limit_bounce_bytes(1000) == spill::MiB);                  // at least one buffer
  CHECK(f.state.cache_limits_kib.size() == 2);
  CHECK(driver->bounce_bytes() == spill::MiB);
}

TEST_CASE("gds: a cuFile without the cache limit reports the bounce buffers it keeps") {
  FakeScope f;
  f.state.nvfs_major_version = 0;
  CuFileApi api = fake_api();
  api.driver_set_max_cache_size = nullptr;
  GdsDriver driver(api, "fake");
  CHECK(driver.limit_bounce_bytes(spill::MiB) == 128 * spill::MiB);
  CHECK(f.state.cache_limits_kib.empty());
}

TEST_CASE("gds: a test's cuFile table stands in for libcufile, then the library is back") {
  EnvScope env("SPILLARENA_CUFILE_LIBRARY", kMissingLibrary);
  FakeScope f;
  const CuFileApi api = fake_api();
  spill::detail::set_cufile_api_for_testing(&api);
  CHECK(&spill::detail::cufile_library() == &api);
  {
    std::shared_ptr<GdsDriver> driver = GdsDriver::shared();
    CHECK(driver->library() == spill::detail::kTestingCuFileLibrary);
    CHECK(GdsDriver::shared() == driver);  // one session while it lives
    CHECK(f.state.driver_opens == 1);
  }
  CHECK(f.state.driver_closes == 1);
  spill::detail::set_cufile_api_for_testing(nullptr);
  CHECK_THROWS_AS(spill::detail::cufile_library(), spill::GdsUnavailableError);
  CHECK_THROWS_AS(GdsDriver::shared(), spill::GdsUnavailableError);
}

// ---------------------------------------------------------------------------------------------
// Transfers
// ---------------------------------------------------------------------------------------------

TEST_CASE("gds: unaligned offsets and sizes are InvalidArgumentError before any cuFile call") {
  FakeScope f;
  std::vector<char> device(4 * kPage);
  GdsFile file(f.driver(), 3);
  CHECK_THROWS_AS(file.write(device.data(), kPage + 1, 0), spill::InvalidArgumentError);
  CHECK_THROWS_AS(file.write(device.data(), kPage, 512), spill::InvalidArgumentError);
  CHECK_THROWS_AS(file.read(device.data(), 100, 0), spill::InvalidArgumentError);
  CHECK_THROWS_AS(file.read(device.data(), kPage, kPage / 2), spill::InvalidArgumentError);
  CHECK(f.state.transfers.empty());
  try {
    file.write(device.data(), 5000, kPage);
  } catch (const spill::InvalidArgumentError& e) {
    CHECK(std::string(e.what()).find("5000 bytes at file offset 4096") != std::string::npos);
  }
}

TEST_CASE("gds: short counts are continued until every byte moved") {
  FakeScope f;
  const std::vector<char> src = spill_test::pattern<char>(4 * kPage, 7);
  GdsFile file(f.driver(), 3);
  file.register_buffer(const_cast<char*>(src.data()), src.size());
  f.state.answers = {static_cast<std::int64_t>(kPage), 100, 3 * kPage - 100};
  file.write(src.data(), src.size(), 8 * kPage);
  REQUIRE(f.state.transfers.size() == 3);
  CHECK(f.state.transfers[1].file_offset == static_cast<std::int64_t>(9 * kPage));
  CHECK(f.state.transfers[1].base_offset == static_cast<std::int64_t>(kPage));
  CHECK(f.state.transfers[1].bytes == 3 * kPage);
  CHECK(f.state.transfers[2].file_offset == static_cast<std::int64_t>(9 * kPage + 100));
  CHECK(f.state.transfers[2].bytes == 3 * kPage - 100);

  std::vector<char> dst(src.size());
  f.state.answers = {static_cast<std::int64_t>(2 * kPage), static_cast<std::int64_t>(kPage)};
  file.read(dst.data(), dst.size(), 8 * kPage);
  CHECK(f.state.transfers.size() == 6);
  CHECK(dst == src);
}

TEST_CASE("gds: a transfer that moves nothing is an IoError, not an endless loop") {
  FakeScope f;
  std::vector<char> device(2 * kPage);
  GdsFile file(f.driver(), 3);
  f.state.answers = {static_cast<std::int64_t>(kPage), 0};
  try {
    file.read(device.data(), 2 * kPage, 4 * kPage);
    FAIL("the read succeeded");
  } catch (const spill::IoError& e) {
    CHECK(e.error_number() == EIO);
    CHECK(e.op() == spill::IoOp::read);
    CHECK(e.offset() == 5 * kPage);
    CHECK(e.bytes() == kPage);
  }
  CHECK(f.state.transfers.size() == 2);
}

TEST_CASE("gds: -1 from cuFile is an IoError carrying its errno") {
  FakeScope f;
  std::vector<char> device(kPage);
  GdsFile file(f.driver(), 3);
  f.state.answers = {-1};
  f.state.errno_on_failure = ENOSPC;
  try {
    file.write(device.data(), kPage, 3 * kPage);
    FAIL("the write succeeded");
  } catch (const spill::IoError& e) {
    CHECK(e.error_number() == ENOSPC);
    CHECK(e.op() == spill::IoOp::write);
    CHECK(e.offset() == 3 * kPage);
    CHECK(e.bytes() == kPage);
    CHECK(std::string(e.what()).find("cuFileWrite") != std::string::npos);
  }
}

TEST_CASE("gds: a cuFile status is an IoError with a mapped errno and the status's name") {
  FakeScope f;
  std::vector<char> device(kPage);
  GdsFile file(f.driver(), 3);
  f.state.answers = {-5012};
  try {
    file.read(device.data(), kPage, 0);
    FAIL("the read succeeded");
  } catch (const spill::IoError& e) {
    CHECK(e.error_number() == EFAULT);
    CHECK(e.op() == spill::IoOp::read);
    CHECK(std::string(e.what()).find("CU_FILE_CUDA_POINTER_INVALID (5012)") != std::string::npos);
  }
  CHECK(spill::detail::cufile_status_name(5001) == "CU_FILE_DRIVER_NOT_INITIALIZED");
  CHECK(spill::detail::cufile_status_errno(5029) == ENODEV);
  CHECK(spill::detail::cufile_status_name(5999) == "CU_FILE_UNKNOWN_5999");
  CHECK(spill::detail::cufile_status_errno(5999) == EIO);
}

// ---------------------------------------------------------------------------------------------
// The real library (the nvidia-cufile wheel's libcufile.so.0), where the test is given one
// ---------------------------------------------------------------------------------------------

TEST_CASE("gds: the real libcufile loads, and without a GPU its driver is a typed error") {
  const char* library = std::getenv("SPILLARENA_TEST_CUFILE_LIBRARY");
  if (library == nullptr || *library == '\0' || access(library, R_OK) != 0) {
    std::cout << "skipped: SPILLARENA_TEST_CUFILE_LIBRARY names no libcufile.so.0 (unzip the "
                 "nvidia-cufile wheel and point it at nvidia/cufile/lib/libcufile.so.0)\n";
    return;
  }
  ScratchDir dir;
  EnvScope env("SPILLARENA_CUFILE_LIBRARY", library);
  EnvScope log("CUFILE_LOGFILE_PATH", dir.path() + "/cufile.log");  // not in the working dir
  CHECK_NOTHROW(spill::detail::cufile_library());

  spill::ArenaOptions o;
  o.directory = dir.path();
  o.capacity_bytes = 4 * spill::MiB;
  o.staging_bytes = spill::MiB;
  o.io = spill::IoMode::gds;
  try {
    spill::SpillArena arena(o);  // the library loads; the engine runs as direct
    CHECK(arena.stats().io_mode == spill::IoMode::direct);
    CHECK(arena.stats().io_note.find("cuFile mode: ") != std::string::npos);
  } catch (const spill::GdsUnavailableError& e) {
    // The arena opens cuFile's driver when it is made: without a GPU that is refused, typed.
    std::cout << "the arena was refused, as expected without a GPU: " << e.what() << "\n";
    CHECK(e.cufile_status() != 0);
    std::set<std::string> left = spill_test::list_dir(dir.path());
    left.erase("cufile.log");
    CHECK(left.empty());  // no spill file left on disk
  }

  const std::string path = dir.path() + "/direct";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  REQUIRE(fd >= 0);
  try {
    GdsFile file(fd);
    std::cout << "cuFile opened; mode: " << file.mode() << "\n";
  } catch (const spill::GdsUnavailableError& e) {
    std::cout << "cuFile refused, as expected without a GPU: " << e.what() << "\n";
    CHECK(e.cufile_status() != 0);
    CHECK(e.library() == library);
  }
  close(fd);
}
