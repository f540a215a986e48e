#include "core/io/gds.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "core/os/platform.h"
#include "spill/error.h"

namespace spill::detail {

// Note [GPUDirect Storage]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// With io = gds the stash moves device inputs between GPU memory and the spill file through
// cuFile (cuFileWrite/cuFileRead on the file's O_DIRECT descriptor), by way of one registered
// device staging buffer per arena (Note [One registered staging buffer] in
// src/core/stash/gds_path.cc): no device-to-host copy and no pinned host staging of
// spillarena's own. Which inputs take it is the stash's call (accelerator inputs; CPU tensors
// under the copy seam's emulation too); CPU inputs take the CPU path. Host-side I/O of the arena
// (CPU tensors, tails) runs as IoMode::direct, so the file is opened O_DIRECT and has a staging
// pool either way.
//
// Loaded at run time: libcufile (CUDA Toolkit's GDS package, or the nvidia-cufile wheels) is
// dlopen'ed through the platform seam on first use ($SPILLARENA_CUFILE_LIBRARY, else
// libcufile.so.0, then libcufile.so), never linked, so builds and machines without CUDA work
// and only io = gds needs it. The few types of its C ABI used are declared in gds.h. A missing
// library or entry point, or a driver that does not open, is GdsUnavailableError.
//
// Compatibility mode: where the nvidia-fs kernel module is absent (and cufile.json allows
// "allow_compat_mode", the default), or the configuration forces it, cuFile moves the bytes
// with POSIX I/O through bounce buffers in host memory it allocates itself; they count against
// the host budget. GdsDriver says which mode runs: compatibility when cuFile's
// CUFILE_PARAM_FORCE_COMPAT_MODE is set, or when the driver properties report neither an
// nvidia-fs module (major version 0) nor NVMe P2PDMA. That is the driver's answer; a file
// system cuFile cannot serve directly still falls back file by file.
//
// Registration once: the file handle is registered when a GdsFile is made and each device
// buffer once (cuFileBufRegister pins its BAR1 mapping, expensive); a pointer inside a
// registered buffer is passed as the buffer's base plus an offset, as cuFile looks buffers up by
// base. Unregistered memory works too, through cuFile's own bounce buffers. The stash registers
// one staging buffer per arena, kept for the arena's life (GdsRegistration; Note [One registered
// staging buffer] in src/core/stash/gds_path.cc), never a tensor of the caching allocator.
//
// Alignment: the file offset and the byte count of every transfer are multiples of 4 KiB
// (checked before any cuFile call, InvalidArgumentError): unaligned transfers would silently go
// the POSIX way, or write a device page past the tensor. Regions are page aligned; the stash
// sends an input's unaligned tail through the host path.
//
// Errors: cuFileRead/Write return the bytes moved (short counts are continued), -1 with errno,
// or -CUfileOpError; a call moving nothing is EIO, never an endless loop. Failures are
// spill::IoError {op, offset, bytes, errno}, errno mapped from cuFile's status, its CU_FILE_
// name and code in the message.
//
// Tests: set_cufile_api_for_testing puts a table of fakes where libcufile would be loaded, so
// the stash's whole io = gds path runs in CI on the CPU (tests/gds_stash_test.cc: the fake moves
// the bytes with pread/pwrite on the descriptor cuFile was given).

// Note [cuFile's bounce buffers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Memory cuFile registered buffers do not cover goes through bounce buffers of cuFile's own:
// per_buffer_cache_size each, up to max_device_cache_size (both KiB in CUfileDrvProps_t;
// defaults 1 MiB and 128 MiB). With nvidia-fs they are device memory; in compatibility mode
// cuFile stages through host memory, which counts against the host budget the stash keeps (the
// arena's host_pool_bytes), although spillarena never allocates it. So GdsDriver reports that
// cache as bounce_bytes() in compatibility mode (0 in gds mode), and limit_bounce_bytes() asks
// cuFileDriverSetMaxCacheSize to fit it into the budget in whole buffers, then reads the
// properties back: the stats report what cuFile keeps, not what was asked. Where cuFile does not
// lower it (no such entry point; versions that take it only before cuFileDriverOpen, which the
// arena calls when it is made) the stats show the excess; properties.max_device_cache_size_kb in
// cufile.json lowers it there. cuFile's POSIX pool (posix_pool_slab_*), which newer versions use
// in compatibility mode, is not in the properties and not counted.

namespace {

const char* const kDefaultLibraries[] = {"libcufile.so.0", "libcufile.so"};

const char* const kHowToInstall =
    "install the CUDA Toolkit's GDS package (libcufile) or `pip install nvidia-cufile-cu12` and "
    "put its lib directory on LD_LIBRARY_PATH (or set SPILLARENA_CUFILE_LIBRARY to the library's "
    "path)";

struct StatusInfo {
  int code;
  const char* name;
  int error_number;
};

// cuFile's status codes (CUFILEOP_BASE_ERR 5000 + n) and the errno each becomes.
const StatusInfo kStatuses[] = {
    {0, "CU_FILE_SUCCESS", 0},
    {5001, "CU_FILE_DRIVER_NOT_INITIALIZED", ENODEV},
    {5002, "CU_FILE_DRIVER_INVALID_PROPS", EINVAL},
    {5003, "CU_FILE_DRIVER_UNSUPPORTED_LIMIT", EINVAL},
    {5004, "CU_FILE_DRIVER_VERSION_MISMATCH", ENOTSUP},
    {5005, "CU_FILE_DRIVER_VERSION_READ_ERROR", EIO},
    {5006, "CU_FILE_DRIVER_CLOSING", ESHUTDOWN},
    {5007, "CU_FILE_PLATFORM_NOT_SUPPORTED", EOPNOTSUPP},
    {5008, "CU_FILE_IO_NOT_SUPPORTED", EOPNOTSUPP},
    {5009, "CU_FILE_DEVICE_NOT_SUPPORTED", EOPNOTSUPP},
    {5010, "CU_FILE_NVFS_DRIVER_ERROR", EIO},
    {5011, "CU_FILE_CUDA_DRIVER_ERROR", EIO},
    {5012, "CU_FILE_CUDA_POINTER_INVALID", EFAULT},
    {5013, "CU_FILE_CUDA_MEMORY_TYPE_INVALID", EFAULT},
    {5014, "CU_FILE_CUDA_POINTER_RANGE_ERROR", EFAULT},
    {5015, "CU_FILE_CUDA_CONTEXT_MISMATCH", EINVAL},
    {5016, "CU_FILE_INVALID_MAPPING_SIZE", EFAULT},
    {5017, "CU_FILE_INVALID_MAPPING_RANGE", EFAULT},
    {5018, "CU_FILE_INVALID_FILE_TYPE", EINVAL},
    {5019, "CU_FILE_INVALID_FILE_OPEN_FLAG", EINVAL},
    {5020, "CU_FILE_DIO_NOT_SET", EINVAL},
    {5022, "CU_FILE_INVALID_VALUE", EINVAL},
    {5023, "CU_FILE_MEMORY_ALREADY_REGISTERED", EEXIST},
    {5024, "CU_FILE_MEMORY_NOT_REGISTERED", EINVAL},
    {5025, "CU_FILE_PERMISSION_DENIED", EACCES},
    {5026, "CU_FILE_DRIVER_ALREADY_OPEN", EBUSY},
    {5027, "CU_FILE_HANDLE_NOT_REGISTERED", EBADF},
    {5028, "CU_FILE_HANDLE_ALREADY_REGISTERED", EEXIST},
    {5029, "CU_FILE_DEVICE_NOT_FOUND", ENODEV},
    {5030, "CU_FILE_INTERNAL_ERROR", EIO},
    {5031, "CU_FILE_GETNEWFD_FAILED", EMFILE},
    {5033, "CU_FILE_NVFS_SETUP_ERROR", EIO},
    {5034, "CU_FILE_IO_DISABLED", EOPNOTSUPP},
    {5035, "CU_FILE_BATCH_SUBMIT_FAILED", EIO},
    {5036, "CU_FILE_GPU_MEMORY_PINNING_FAILED", ENOMEM},
    {5037, "CU_FILE_BATCH_FULL", EAGAIN},
    {5038, "CU_FILE_ASYNC_NOT_SUPPORTED", EOPNOTSUPP},
};

const StatusInfo* find_status(int status) {
  for (const StatusInfo& s : kStatuses) {
    if (s.code == status) return &s;
  }
  return nullptr;
}

// "CU_FILE_DRIVER_NOT_INITIALIZED (5001)", plus the CUresult of a CUDA driver error.
std::string describe(const CuFileStatus& status) {
  std::string text = cufile_status_name(status.err) + " (" + std::to_string(status.err) + ")";
  if (status.err == 5011) text += ", CUresult " + std::to_string(status.cu_err);
  return text;
}

// What to do about a driver that does not open.
const char* driver_advice(int status) {
  switch (status) {
    case 5001:
      return "the nvidia-fs kernel module is not loaded: load it, or let cuFile run in "
             "compatibility mode (\"allow_compat_mode\": true in the cufile.json named by "
             "CUFILE_ENV_PATH_JSON)";
    case 5011:
    case 5029:
    case 5033:  // what cuFile answers when libcuda.so.1 is missing
      return "cuFile needs an NVIDIA GPU and its driver (libcuda.so.1); use io = direct on "
             "machines without one (cuFile's log, cufile.log or CUFILE_LOGFILE_PATH, has more)";
    default:
      return "see cuFile's log (cufile.log, or CUFILE_LOGFILE_PATH) for the cause, or use "
             "io = direct";
  }
}

// ---------------------------------------------------------------------------------------------
// Loading the library
// ---------------------------------------------------------------------------------------------

template <class F>
bool resolve(void* library, const char* name, F* entry, std::string* missing) {
  void* symbol = nullptr;
  if (platform::find_symbol(library, name, &symbol) != 0) {
    if (missing->empty()) *missing = name;
    return false;
  }
  *entry = reinterpret_cast<F>(symbol);
  return true;
}

CuFileApi resolve_api(void* library, const std::string& name) {
  CuFileApi api{};
  std::string missing;
  resolve(library, "cuFileDriverOpen", &api.driver_open, &missing);
  resolve(library, "cuFileDriverClose", &api.driver_close, &missing);
  resolve(library, "cuFileDriverGetProperties", &api.driver_get_properties, &missing);
  resolve(library, "cuFileHandleRegister", &api.handle_register, &missing);
  resolve(library, "cuFileHandleDeregister", &api.handle_deregister, &missing);
  resolve(library, "cuFileBufRegister", &api.buf_register, &missing);
  resolve(library, "cuFileBufDeregister", &api.buf_deregister, &missing);
  resolve(library, "cuFileRead", &api.read, &missing);
  resolve(library, "cuFileWrite", &api.write, &missing);
  if (!missing.empty()) {
    throw GdsUnavailableError(name, 0,
                              "spill: io = gds: " + name + " has no entry point " + missing +
                                  " (too old a cuFile?); " + kHowToInstall);
  }
  std::string optional;
  resolve(library, "cuFileGetParameterBool", &api.get_parameter_bool, &optional);
  resolve(library, "cuFileDriverSetMaxCacheSize", &api.driver_set_max_cache_size, &optional);
  return api;
}

// By the name asked for ($SPILLARENA_CUFILE_LIBRARY or the default), so a test may point the
// variable elsewhere after a library loaded.
struct LoadedLibrary {
  Mutex mutex;
  std::map<std::string, CuFileApi> apis GUARDED_BY(mutex);
};

LoadedLibrary& loaded_library() {
  // Never destroyed, as the library is never unloaded: a GdsFile may outlive static destructors.
  static LoadedLibrary* const loaded = new LoadedLibrary();
  return *loaded;
}

std::atomic<const CuFileApi*> testing_api{nullptr};

// The name of the library the process's sessions are made over (a test's table, or libcufile).
std::string active_library_name() {
  return testing_api.load() != nullptr ? kTestingCuFileLibrary : cufile_library_name();
}

// Registers [base, base + bytes); throws IoError naming cuFile's status.
void register_or_throw(const CuFileApi& api, const void* base, std::uint64_t bytes) {
  const CuFileStatus status = api.buf_register(base, bytes, 0);
  if (status.err != kCuFileSuccess) {
    throw IoError(cufile_status_errno(status.err),
                  "spill: io = gds: cuFileBufRegister of " + std::to_string(bytes) +
                      " bytes of device memory failed with " + describe(status) +
                      "; transfers from it go through cuFile's bounce buffers",
                  IoOp::write, 0, bytes);
  }
}

}  // namespace

void set_cufile_api_for_testing(const CuFileApi* api) { testing_api.store(api); }

std::string cufile_library_name() {
  const char* configured = std::getenv("SPILLARENA_CUFILE_LIBRARY");
  if (configured != nullptr && *configured != '\0') return configured;
  return kDefaultLibraries[0];
}

const CuFileApi& cufile_library() {
  if (const CuFileApi* testing = testing_api.load()) return *testing;
  const std::string wanted = cufile_library_name();
  LoadedLibrary& loaded = loaded_library();
  MutexLock lock(loaded.mutex);
  const auto found = loaded.apis.find(wanted);
  if (found != loaded.apis.end()) return found->second;
  std::vector<std::string> names{wanted};
  if (wanted == kDefaultLibraries[0]) names.emplace_back(kDefaultLibraries[1]);
  std::string first_error;
  for (const std::string& name : names) {
    void* library = nullptr;
    std::string error;
    if (platform::load_library(name, &library, &error) == 0) {
      return loaded.apis.emplace(wanted, resolve_api(library, name)).first->second;
    }
    if (first_error.empty()) first_error = error;
  }
  throw GdsUnavailableError(wanted, 0,
                            "spill: io = gds needs cuFile (GPUDirect Storage), but " + wanted +
                                " could not be loaded: " + first_error + "; " + kHowToInstall);
}

std::string cufile_status_name(int status) {
  const StatusInfo* s = find_status(status);
  return s != nullptr ? s->name : "CU_FILE_UNKNOWN_" + std::to_string(status);
}

int cufile_status_errno(int status) {
  const StatusInfo* s = find_status(status);
  return s != nullptr ? s->error_number : EIO;
}

// ---------------------------------------------------------------------------------------------
// Driver session
// ---------------------------------------------------------------------------------------------

std::shared_ptr<GdsDriver> GdsDriver::shared() {
  static Mutex* const mutex = new Mutex();
  static auto* const current = new std::weak_ptr<GdsDriver>();
  const CuFileApi& api = cufile_library();
  MutexLock lock(*mutex);
  std::shared_ptr<GdsDriver> driver = current->lock();
  if (!driver || driver->library() != active_library_name()) {
    driver = std::make_shared<GdsDriver>(api, active_library_name());
    *current = driver;
  }
  return driver;
}

GdsDriver::GdsDriver(const CuFileApi& api, std::string library)
    : api_(api), library_(std::move(library)) {
  const CuFileStatus opened = api_.driver_open();
  if (opened.err != kCuFileSuccess) {
    throw GdsUnavailableError(library_, opened.err,
                              "spill: io = gds: cuFileDriverOpen of " + library_ + " failed with " +
                                  describe(opened) + "; " + driver_advice(opened.err));
  }
  bool forced = false;
  if (api_.get_parameter_bool != nullptr &&
      api_.get_parameter_bool(kCuFileParamForceCompatMode, &forced).err != kCuFileSuccess) {
    forced = false;
  }
  CuFileDriverProperties properties{};
  const bool known = api_.driver_get_properties != nullptr &&
                     api_.driver_get_properties(&properties).err == kCuFileSuccess;
  const bool p2pdma = (properties.nvfs.dstatusflags >> kCuFileNvmeP2pSupportedBit) & 1u;
  compatibility_ = forced || !known || (properties.nvfs.major_version == 0 && !p2pdma);
  MutexLock lock(mutex_);
  read_cache_sizes();
}

void GdsDriver::read_cache_sizes() {
  CuFileDriverProperties properties{};
  if (api_.driver_get_properties == nullptr ||
      api_.driver_get_properties(&properties).err != kCuFileSuccess) {
    return;  // unknown: the sizes read before stay
  }
  cache_bytes_ = std::uint64_t{properties.max_device_cache_size} * 1024;
  per_buffer_bytes_ = std::uint64_t{properties.per_buffer_cache_size} * 1024;
}

std::uint64_t GdsDriver::bounce_bytes() const {
  MutexLock lock(mutex_);
  return compatibility_ ? cache_bytes_ : 0;
}

std::uint64_t GdsDriver::limit_bounce_bytes(std::uint64_t bytes) {
  {
    MutexLock lock(mutex_);
    if (compatibility_ && cache_bytes_ > bytes && api_.driver_set_max_cache_size != nullptr) {
      const std::uint64_t buffer = std::max<std::uint64_t>(per_buffer_bytes_, 1024);
      const std::uint64_t limit = std::max<std::uint64_t>(bytes / buffer, 1) * buffer;
      api_.driver_set_max_cache_size(limit / 1024);  // the properties say what it did
      read_cache_sizes();
    }
  }
  return bounce_bytes();
}

GdsRegistration::GdsRegistration(std::shared_ptr<GdsDriver> driver, const void* device_ptr,
                                 std::uint64_t bytes)
    : driver_(std::move(driver)), base_(device_ptr) {
  register_or_throw(driver_->api(), base_, bytes);
}

GdsRegistration::~GdsRegistration() { driver_->api().buf_deregister(base_); }

GdsDriver::~GdsDriver() { api_.driver_close(); }

const char* GdsDriver::mode() const {
  return compatibility_ ? "compatibility (POSIX through cuFile's bounce buffers)" : "gds";
}

// ---------------------------------------------------------------------------------------------
// Registered file
// ---------------------------------------------------------------------------------------------

GdsFile::GdsFile(int direct_fd) : GdsFile(GdsDriver::shared(), direct_fd) {}

GdsFile::GdsFile(std::shared_ptr<GdsDriver> driver, int direct_fd) : driver_(std::move(driver)) {
  if (direct_fd < 0) {
    throw InvalidArgumentError(
        "spill: io = gds: the spill file has no O_DIRECT descriptor (descriptor " +
        std::to_string(direct_fd) + "); GdsFile needs the arena's direct_fd(), made by io = gds");
  }
  CuFileDescriptor descriptor{};
  descriptor.type = kCuFileHandleTypeOpaqueFd;
  descriptor.handle.fd = direct_fd;
  const CuFileStatus registered = driver_->api().handle_register(&handle_, &descriptor);
  if (registered.err != kCuFileSuccess) {
    throw GdsUnavailableError(
        driver_->library(), registered.err,
        "spill: io = gds: cuFileHandleRegister of the spill file (descriptor " +
            std::to_string(direct_fd) + ") failed with " + describe(registered) +
            "; cuFile needs a file opened with O_DIRECT on a file system it supports, or "
            "compatibility mode (\"allow_compat_mode\": true in cufile.json)");
  }
}

GdsFile::~GdsFile() {
  MutexLock lock(mutex_);
  for (const auto& buffer : buffers_) driver_->api().buf_deregister(buffer.first);
  buffers_.clear();
  lock.unlock();
  driver_->api().handle_deregister(handle_);
}

void GdsFile::register_buffer(void* device_ptr, std::uint64_t bytes) {
  const char* base = static_cast<const char*>(device_ptr);
  MutexLock lock(mutex_);
  auto it = buffers_.find(base);
  if (it != buffers_.end() && it->second >= bytes) return;
  const CuFileApi& api = driver_->api();
  if (it != buffers_.end()) {
    api.buf_deregister(base);
    buffers_.erase(it);
  }
  register_or_throw(api, base, bytes);
  buffers_.emplace(base, bytes);
}

std::uint64_t GdsFile::registered_buffers() const {
  MutexLock lock(mutex_);
  return buffers_.size();
}

void GdsFile::write(const void* device_ptr, std::uint64_t bytes, std::uint64_t file_offset) {
  // cuFileWrite takes a const source; transfer() shares the loop with reads.
  transfer(IoOp::write, static_cast<char*>(const_cast<void*>(device_ptr)), bytes, file_offset);
}

void GdsFile::read(void* device_ptr, std::uint64_t bytes, std::uint64_t file_offset) {
  transfer(IoOp::read, static_cast<char*>(device_ptr), bytes, file_offset);
}

GdsFile::Place GdsFile::place_of(const char* device_ptr, std::uint64_t bytes) const {
  MutexLock lock(mutex_);
  auto it = buffers_.upper_bound(device_ptr);
  if (it == buffers_.begin()) return Place{device_ptr, 0};
  --it;
  const auto offset = static_cast<std::uint64_t>(device_ptr - it->first);
  if (offset + bytes > it->second) return Place{device_ptr, 0};
  return Place{it->first, offset};
}

void GdsFile::transfer(IoOp op, char* device_ptr, std::uint64_t bytes, std::uint64_t file_offset) {
  const char* call = op == IoOp::write ? "cuFileWrite" : "cuFileRead";
  if (bytes % kAlignmentBytes != 0 || file_offset % kAlignmentBytes != 0) {
    throw InvalidArgumentError(std::string("spill: io = gds: ") + call + " of " +
                               std::to_string(bytes) + " bytes at file offset " +
                               std::to_string(file_offset) +
                               ": cuFile transfers need the offset and the byte count in "
                               "multiples of 4096 bytes; send the unaligned tail through the "
                               "host path");
  }
  const Place place = place_of(device_ptr, bytes);
  const CuFileApi& api = driver_->api();
  std::uint64_t done = 0;
  while (done < bytes) {
    const std::uint64_t left = bytes - done;
    const auto at = static_cast<std::int64_t>(file_offset + done);
    const auto in_buffer = static_cast<std::int64_t>(place.offset + done);
    errno = 0;
    const std::int64_t moved =
        op == IoOp::write ? api.write(handle_, place.base, left, at, in_buffer)
                          : api.read(handle_, const_cast<char*>(place.base), left, at, in_buffer);
    const int os_error = errno;
    if (moved > 0) {
      done += std::min(static_cast<std::uint64_t>(moved), left);
      continue;
    }
    int error_number = EIO;
    std::string why;
    if (moved == 0) {
      why = "moved no bytes (past the end of the file?)";
    } else if (moved == -1) {
      error_number = os_error != 0 ? os_error : EIO;
      why = std::string("failed: ") + std::strerror(error_number);
    } else {
      const CuFileStatus status{static_cast<int>(-moved), 0};
      error_number = cufile_status_errno(status.err);
      why = "failed with " + describe(status);
    }
    throw IoError(error_number,
                  std::string("spill: io = gds: ") + call + " of " + std::to_string(left) +
                      " bytes at offset " + std::to_string(file_offset + done) +
                      " of the spill file " + why,
                  op, file_offset + done, left);
  }
}

}  // namespace spill::detail
