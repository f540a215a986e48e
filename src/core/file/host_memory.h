// HostMemory: anonymous, private memory as arena storage (the RAM arena). Pages are
// touched only when written, so capacity costs address space, not RAM, until used.
#pragma once

#include <memory>

#include "core/file/storage.h"

namespace spill::detail {

// Throws spill::InsufficientSpaceError when capacity exceeds physical memory.
std::unique_ptr<Storage> make_host_memory(std::uint64_t capacity_bytes);

}  // namespace spill::detail
