// The fault hook at the platform seam: spill::testing::set_fault_hook (fault_injection.h)
// installs it, platform::fault_verdict (platform.h) asks it. Test-only; no system calls.
#include "core/os/fault_injection.h"

#include <algorithm>
#include <atomic>
#include <memory>

#include "core/os/mutex.h"
#include "core/os/platform.h"

namespace spill {

// Note [Fault injection at the seam]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Tests prove what happens when the disk misbehaves (EIO, ENOSPC, short counts, end of file)
// without a failing disk: every pwrite and pread of write_at/read_at, every read or write piece
// the io_uring backend submits, the O_TMPFILE open and fallocate ask fault_verdict first, as
// tcmalloc wraps mincore for its tests. A short count is real, not a relabelled completion: only
// that many bytes move (io_uring gets the shorter length in its submission), so a loop or a reaper
// that dropped the remainder would lose data and a round-trip test sees it. Errors move nothing.
// With no hook the cost is one relaxed load of `armed` per call; the hook itself is copied out
// under a mutex, so a test may remove it while a worker thread is still calling it.
namespace {
std::atomic<bool> armed{false};
detail::Mutex hook_mutex;
std::shared_ptr<const testing::FaultHook> installed GUARDED_BY(hook_mutex);
}  // namespace

void testing::set_fault_hook(FaultHook hook) {
  detail::MutexLock lock(hook_mutex);
  installed = hook ? std::make_shared<const FaultHook>(std::move(hook)) : nullptr;
  armed.store(installed != nullptr, std::memory_order_relaxed);
}

std::int64_t platform::fault_verdict(testing::FaultSite site, std::uint64_t bytes,
                                     std::uint64_t offset) {
  const auto all = static_cast<std::int64_t>(bytes);
  if (!armed.load(std::memory_order_relaxed)) return all;
  std::shared_ptr<const testing::FaultHook> hook;
  {
    detail::MutexLock lock(hook_mutex);
    hook = installed;
  }
  return hook ? std::min(all, (*hook)(site, bytes, offset)) : all;
}

}  // namespace spill
