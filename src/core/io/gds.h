// GPUDirect Storage: device memory written to and read from the spill file through NVIDIA's
// cuFile, on the file's O_DIRECT descriptor, with no host copy made by spillarena (cuFile's
// compatibility mode bounces through cuFile's own host buffers). libcufile is loaded at run
// time, never linked. Torch-free: device memory is a pointer here. See Note [GPUDirect Storage]
// in gds.cc.
//
//   // An arena made with io = gds has an O_DIRECT descriptor (storage.direct_fd()).
//   auto gds = std::make_unique<spill::detail::GdsFile>(storage.direct_fd());
//   // ^ GdsUnavailableError: no libcufile, or cuFile would not start (named in the message)
//   std::cout << gds->mode();                        // "gds" or "compatibility (...)"
//   gds->register_buffer(device_base, device_bytes); // once per device buffer (idempotent)
//   const std::uint64_t body = bytes / GdsFile::kAlignmentBytes * GdsFile::kAlignmentBytes;
//   gds->write(device_ptr, body, region.offset());  // multiples of 4 KiB; throws spill::IoError
//   ...                                             // the tail (< 4 KiB): the host path
//   gds->read(device_ptr, body, region.offset());   // synchronous: bytes are there on return
//   gds.reset();  // deregisters the buffers, then the file; before the device memory is freed
//
//   // A buffer of one's own, registered for as long as it lives (the stash's staging buffer):
//   spill::detail::GdsRegistration staging(spill::detail::GdsDriver::shared(), base, bytes);
//   // Tests: the process's cuFile is a table of fakes instead of libcufile.
//   spill::detail::set_cufile_api_for_testing(&fake_api);  // nullptr: libcufile again
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "core/os/mutex.h"
#include "spill/io.h"

namespace spill::detail {

// ---------------------------------------------------------------------------------------------
// cuFile's C ABI, the few types used here (cufile.h: CUfileError_t, CUfileDescr_t,
// CUfileDrvProps_t), so that building needs neither CUDA nor cuFile
// ---------------------------------------------------------------------------------------------

static_assert(sizeof(void*) == 8, "cuFile exists for 64-bit Linux only");

// CUfileError_t: err is a CUfileOpError (0, or 5000 + n); cu_err the CUresult when err is
// CU_FILE_CUDA_DRIVER_ERROR. Plain data: returned in registers, as the C struct.
struct CuFileStatus {
  int err;
  int cu_err;
};
constexpr int kCuFileSuccess = 0;

// CUfileDescr_t for a Linux descriptor (type CU_FILE_HANDLE_TYPE_OPAQUE_FD).
struct CuFileDescriptor {
  int type;
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;  // null: the file system is found through fstat
};
constexpr int kCuFileHandleTypeOpaqueFd = 1;

// CUfileDrvProps_t, with room for fields later versions may append.
struct CuFileDriverProperties {
  struct {
    unsigned int major_version;  // of the nvidia-fs kernel module; 0 when it is not loaded
    unsigned int minor_version;
    std::size_t poll_thresh_size;
    std::size_t max_direct_io_size;
    unsigned int dstatusflags;  // bit n: CUfileDriverStatusFlags n (file systems, NVMe P2PDMA)
    unsigned int dcontrolflags;
  } nvfs;
  unsigned int fflags;
  unsigned int max_device_cache_size;
  unsigned int per_buffer_cache_size;
  unsigned int max_device_pinned_mem_size;
  unsigned int max_batch_io_size;
  unsigned int max_batch_io_timeout_msecs;
  unsigned char reserved[256];
};
constexpr unsigned int kCuFileNvmeP2pSupportedBit = 11;  // CU_FILE_NVME_P2P_SUPPORTED
constexpr int kCuFileParamForceCompatMode = 2;           // CUFILE_PARAM_FORCE_COMPAT_MODE

// The entry points used, as function pointers: the real library fills them (cufile_library()),
// a test fills them with fakes.
struct CuFileApi {
  CuFileStatus (*driver_open)();
  CuFileStatus (*driver_close)();
  CuFileStatus (*driver_get_properties)(CuFileDriverProperties* properties);
  CuFileStatus (*get_parameter_bool)(int parameter, bool* value);  // null before cuFile 1.9
  CuFileStatus (*handle_register)(void** handle, CuFileDescriptor* descriptor);
  void (*handle_deregister)(void* handle);
  CuFileStatus (*buf_register)(const void* base, std::size_t bytes, int flags);
  CuFileStatus (*buf_deregister)(const void* base);
  // The bytes moved, -1 with errno set, or -CUfileOpError.
  std::int64_t (*read)(void* handle, void* base, std::size_t bytes, std::int64_t file_offset,
                       std::int64_t base_offset);
  std::int64_t (*write)(void* handle, const void* base, std::size_t bytes, std::int64_t file_offset,
                        std::int64_t base_offset);
  // cuFileDriverSetMaxCacheSize, in KiB; null where the library has none.
  CuFileStatus (*driver_set_max_cache_size)(std::size_t max_cache_kib);
};

// The library searched: $SPILLARENA_CUFILE_LIBRARY when set and non-empty (a path, or a file
// name the dynamic linker searches), else "libcufile.so.0" (then "libcufile.so").
std::string cufile_library_name();

// The real libcufile's entry points. Loaded on the first call that succeeds and kept for the
// process's life; until then every call tries again (so a fixed environment is picked up).
// Throws GdsUnavailableError naming the library, dlerror()'s text and how to install it, or the
// entry point missing from it.
const CuFileApi& cufile_library();

// Tests: from now on cufile_library() returns `api` (the caller keeps it alive) and
// GdsDriver::shared() opens its sessions over it, named kTestingCuFileLibrary, instead of
// loading libcufile; nullptr goes back to the library. Lets CI run io = gds over a fake cuFile.
void set_cufile_api_for_testing(const CuFileApi* api);
constexpr const char* kTestingCuFileLibrary = "cuFile set by set_cufile_api_for_testing";

// CU_FILE_... name of a cuFile status ("CU_FILE_DRIVER_NOT_INITIALIZED"), "CU_FILE_UNKNOWN_<n>"
// for codes this file does not know, and the errno an IoError carries for it.
std::string cufile_status_name(int status);
int cufile_status_errno(int status);

// ---------------------------------------------------------------------------------------------
// Driver session and registered file
// ---------------------------------------------------------------------------------------------

// One cuFile driver session: cuFileDriverOpen when made, cuFileDriverClose when destroyed;
// learns which mode runs (see Note [GPUDirect Storage] in gds.cc).
class GdsDriver {
 public:
  // The session over the real library that every GdsFile of the process shares; opened again
  // after the last one is gone. Throws GdsUnavailableError.
  static std::shared_ptr<GdsDriver> shared();

  // A session over `api` (tests pass fakes); `library` names it in errors. Throws
  // GdsUnavailableError naming cuFile's status when the driver does not open.
  GdsDriver(const CuFileApi& api, std::string library);
  ~GdsDriver();
  GdsDriver(const GdsDriver&) = delete;
  GdsDriver& operator=(const GdsDriver&) = delete;

  const CuFileApi& api() const { return api_; }
  const std::string& library() const { return library_; }
  // True when cuFile moves bytes with POSIX I/O through its own host bounce buffers.
  bool compatibility_mode() const { return compatibility_; }
  // "gds" or "compatibility (POSIX through cuFile's bounce buffers)", for stats and logs.
  const char* mode() const;

  // Host memory cuFile's bounce buffers may take, as its properties report it: in compatibility
  // mode its cache (max_device_cache_size), 0 in gds mode (they are device memory then). See
  // Note [cuFile's bounce buffers] in gds.cc.
  std::uint64_t bounce_bytes() const EXCLUDES(mutex_);
  // Asks cuFile to keep that cache within `bytes` (whole per_buffer_cache_size buffers, at
  // least one; cuFileDriverSetMaxCacheSize, never raising it) and returns bounce_bytes() as the
  // properties then report it: more than `bytes` where cuFile would not lower it.
  std::uint64_t limit_bounce_bytes(std::uint64_t bytes) EXCLUDES(mutex_);

 private:
  void read_cache_sizes() REQUIRES(mutex_);

  const CuFileApi api_;
  const std::string library_;
  bool compatibility_ = true;
  mutable Mutex mutex_;
  std::uint64_t cache_bytes_ GUARDED_BY(mutex_) = 0;       // max_device_cache_size
  std::uint64_t per_buffer_bytes_ GUARDED_BY(mutex_) = 0;  // per_buffer_cache_size
};

// A device buffer registered with cuFile (cuFileBufRegister) for as long as this lives, for
// memory that outlives every transfer from it (the stash's staging buffer, kept for its arena's
// life; never a tensor the caching allocator may free). Destroyed before the memory is freed.
class GdsRegistration {
 public:
  // Throws spill::IoError naming cuFile's status; the memory then still moves, unregistered,
  // through cuFile's bounce buffers.
  GdsRegistration(std::shared_ptr<GdsDriver> driver, const void* device_ptr, std::uint64_t bytes);
  ~GdsRegistration();
  GdsRegistration(const GdsRegistration&) = delete;
  GdsRegistration& operator=(const GdsRegistration&) = delete;

 private:
  const std::shared_ptr<GdsDriver> driver_;
  const void* const base_;
};

// The spill file registered with cuFile once, and the device buffers registered with it.
// Thread-safe: transfers may run on several threads while another registers a buffer.
class GdsFile {
 public:
  // cuFile's unit: file offsets and byte counts of every transfer are multiples of it.
  static constexpr std::uint64_t kAlignmentBytes = 4096;

  // Registers `direct_fd` (opened with O_DIRECT; the caller keeps it open while this lives) with
  // the process's shared session. Throws GdsUnavailableError (no library, no driver, or a file
  // cuFile refuses, with its status); InvalidArgumentError for a descriptor of -1.
  explicit GdsFile(int direct_fd);
  GdsFile(std::shared_ptr<GdsDriver> driver, int direct_fd);
  // Deregisters every buffer, then the file. Transfers must have returned.
  ~GdsFile();
  GdsFile(const GdsFile&) = delete;
  GdsFile& operator=(const GdsFile&) = delete;

  // cuFileBufRegister of [device_ptr, device_ptr + bytes), once per pointer: again with the same
  // or fewer bytes does nothing, with more it registers anew. Not while a transfer uses it.
  // Throws spill::IoError (the buffer then stays unregistered and transfers from it still work,
  // through cuFile's bounce buffers).
  void register_buffer(void* device_ptr, std::uint64_t bytes);

  // Synchronous transfers between device memory and [file_offset, file_offset + bytes) of the
  // file; short counts are continued. A pointer inside a registered buffer is passed as that
  // buffer and an offset in it. Throws InvalidArgumentError (before any cuFile call) unless
  // file_offset and bytes are multiples of kAlignmentBytes; spill::IoError {op, offset, bytes,
  // errno} naming cuFile's status on failure.
  void write(const void* device_ptr, std::uint64_t bytes, std::uint64_t file_offset);
  void read(void* device_ptr, std::uint64_t bytes, std::uint64_t file_offset);

  bool compatibility_mode() const { return driver_->compatibility_mode(); }
  const char* mode() const { return driver_->mode(); }
  std::uint64_t registered_buffers() const;

 private:
  struct Place {
    const char* base;
    std::uint64_t offset;
  };
  Place place_of(const char* device_ptr, std::uint64_t bytes) const;
  void transfer(IoOp op, char* device_ptr, std::uint64_t bytes, std::uint64_t file_offset);

  const std::shared_ptr<GdsDriver> driver_;  // first: outlives the handle and the buffers
  void* handle_ = nullptr;
  mutable Mutex mutex_;
  std::map<const char*, std::uint64_t> buffers_ GUARDED_BY(mutex_);  // base -> bytes
};

}  // namespace spill::detail
