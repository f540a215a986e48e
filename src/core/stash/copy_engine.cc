#include "copy_engine.h"

#include <atomic>
#include <utility>

#include "core/os/mutex.h"

namespace spill::detail {
namespace {

Mutex override_mutex;
std::shared_ptr<CopyEngine> installed GUARDED_BY(override_mutex);
std::atomic<bool> is_overridden{false};
std::atomic<EmulatedHostMemory> host_memory{EmulatedHostMemory::off};
std::atomic<std::uint64_t> epoch{0};

}  // namespace

void settle_copy(const CopyPtr& copy) noexcept {
  try {
    if (copy) copy->synchronize();
  } catch (...) {
    // Reported by whatever uses the device next; a destructor cannot throw.
  }
}

std::shared_ptr<CopyEngine> CopyEngine::override_engine() {
  if (!is_overridden.load(std::memory_order_acquire)) return nullptr;
  MutexLock lock(override_mutex);
  return installed;
}

bool CopyEngine::overridden() { return is_overridden.load(std::memory_order_acquire); }

EmulatedHostMemory emulated_host_memory() { return host_memory.load(); }

std::uint64_t emulation_epoch() { return epoch.load(); }

void set_copy_engine_override(std::shared_ptr<CopyEngine> engine, EmulatedHostMemory memory) {
  std::shared_ptr<CopyEngine> previous;  // dies after the lock: its copy thread joins
  {
    MutexLock lock(override_mutex);
    previous = std::exchange(installed, std::move(engine));
    host_memory.store(memory);
    epoch.fetch_add(1);
    is_overridden.store(installed != nullptr, std::memory_order_release);
  }
}

}  // namespace spill::detail
