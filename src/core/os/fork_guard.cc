#include "core/os/fork_guard.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/os/mutex.h"
#include "core/os/platform.h"
#include "spill/error.h"

namespace spill::detail {

// Note [Arenas across fork]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// fork() copies an arena into the child — its allocator, its queue's state, its mapping and
// descriptors — but none of the threads that serve it, and it does not copy the io_uring ring
// at all: the child's ring descriptor is the parent's ring. Left alone, the copy did harm. A
// child's destructor put the reaper's stop message on the shared ring, the parent's reaper took
// it and stopped, and the parent hung at its next step; with the thread pool the child blocked
// in its destructor (joining threads and destroying condition variables whose waiters do not
// exist there) and kept the file's space; a child that used the arena waited forever for its
// first I/O, or, with io_uring, had the parent's reaper complete a pointer into the child's
// memory.
//
// The policy: an arena belongs to the process that created it. In a fork() child it is inert.
//   - Every operation on it, on its regions and on their Pendings throws
//     spill::ForkedProcessError, naming both processes and the fix: create a new SpillArena in
//     the child (it belongs to the child and works there), or use spawn/forkserver.
//   - Destroying it submits nothing, joins no thread and waits for nothing: the queues' drains
//     and destructors return at once (ThreadPoolQueue, IoUringQueue), Region::free and
//     Pending::settle skip the parent's operations (Completion), ArenaCore::free leaves the
//     allocator and the hashes as they are. What the child holds of its own is released: its
//     copy of the mapping is unmapped, the file's and the ring's descriptors closed.
//   - Members a parent thread may have been using at the instant of fork() — condition
//     variables with waiters, joinable threads, containers changed under a mutex — are
//     ParentOnly: never destroyed in the child.
// The parent's arena is untouched whatever the child does. tests/fork_test.cc checks all of it
// on both backends.
//
// How a child knows: a process-wide fork generation, incremented by a pthread_atfork child
// handler (registered through the platform seam when the first ProcessOwner is made); each
// ProcessOwner keeps the generation and the pid it was made in. A check is one relaxed atomic
// load, where getpid() is a system call (glibc no longer caches it). Children made without
// fork's handlers (vfork, clone) must exec at once, as POSIX asks of them. Python's DataLoader
// workers: fork workers end with os._exit and never touch the arena; spawn and forkserver
// workers never receive it.

namespace {

std::atomic<std::uint64_t> generation{0};
std::atomic<std::uint64_t> current_pid{0};

// Runs in the child, inside fork(): async-signal-safe work only (lock-free atomics, getpid).
void in_fork_child() {
  generation.fetch_add(1, std::memory_order_relaxed);
  current_pid.store(platform::process_id(), std::memory_order_relaxed);
}

void register_once() {
  static const bool registered = [] {
    current_pid.store(platform::process_id(), std::memory_order_relaxed);
    // Without the handler (ENOMEM) children cannot tell: they behave as before this guard.
    platform::register_fork_handler(&in_fork_child);
    return true;
  }();
  static_cast<void>(registered);
}

}  // namespace

std::uint64_t fork_generation() { return generation.load(std::memory_order_relaxed); }

ProcessOwner::ProcessOwner() {
  register_once();
  generation_ = fork_generation();
  pid_ = current_pid.load(std::memory_order_relaxed);
}

void ProcessOwner::throw_forked(const char* operation) const {
  const std::uint64_t here = current_pid.load(std::memory_order_relaxed);
  throw ForkedProcessError(
      pid_, here,
      std::string("spill: ") + operation + " in process " + std::to_string(here) +
          ", a fork() child of process " + std::to_string(pid_) +
          ", which created the arena: an arena belongs to the process that created it; create a "
          "new SpillArena in the child, or use spawn/forkserver (in the child the inherited "
          "arena is inert and may only be destroyed; the parent's is untouched)");
}

void keep_reachable(const void* object, std::size_t bytes) {
  static Mutex mutex;
  static auto* kept = new std::vector<std::unique_ptr<unsigned char[]>>();
  auto copy = std::make_unique<unsigned char[]>(bytes);
  std::memcpy(copy.get(), object, bytes);
  MutexLock lock(mutex);
  kept->push_back(std::move(copy));
}

}  // namespace spill::detail
