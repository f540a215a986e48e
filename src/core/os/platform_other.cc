// The Linux-only functions of platform.h on other systems, so the library still builds there:
// each answers ENOSYS (facts: 0 or nothing), and capabilities() says so beforehand. A disk-backed
// arena is then refused with a typed error when it is made (its directory cannot be vetted);
// the RAM backing works. CMakeLists.txt compiles this file where the system is not Linux.
#include <errno.h>

#include "core/os/platform.h"
#include "core/os/platform_os.h"

namespace spill::platform {

Capabilities os::capabilities() { return Capabilities{}; }  // no Linux extras

int os::open_unnamed(const std::string&, int*) { return EOPNOTSUPP; }

int file_system_info(const std::string&, FileSystemInfo*) { return ENOSYS; }
int file_free_bytes(int, std::uint64_t*) { return ENOSYS; }
int reopen_direct(int, int*, std::uint64_t*) { return ENOSYS; }
int preallocate(int, std::uint64_t) { return ENOSYS; }

int pages_resident(void*, std::uint64_t, std::uint64_t*) { return ENOSYS; }
int drop_page_mappings(void*, std::uint64_t) { return ENOSYS; }

int start_writeback(int, std::uint64_t, std::uint64_t) { return ENOSYS; }
int drop_cached_pages(int, std::uint64_t, std::uint64_t) { return ENOSYS; }
int read_ahead_range(int, std::uint64_t, std::uint64_t) { return ENOSYS; }

std::uint64_t resident_anonymous_bytes() { return 0; }
std::uint64_t mem_available_bytes() { return 0; }
int memory_cgroup(MemoryLimits* out) {
  *out = MemoryLimits{};
  return 0;
}
void set_malloc_thresholds(std::uint64_t) {}

}  // namespace spill::platform
