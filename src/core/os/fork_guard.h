// Which process made an object, and members a fork() child must never destroy. An arena made
// before fork() is inert in the child: see Note [Arenas across fork] in src/core/os/fork_guard.cc.
//
//   class Queue {
//     ProcessOwner owner_;                          // the process this queue belongs to
//     ParentOnly<std::condition_variable> idle_;    // not destroyed in a fork() child
//    public:
//     ~Queue() {
//       if (owner_.forked()) return;                // a child: no thread of ours runs here
//       ... stop and join the threads ...
//     }
//     void submit(Request r) {
//       owner_.check("a queued transfer");          // spill::ForkedProcessError in a child
//       ...
//     }
//   };
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

namespace spill::detail {

// The process-wide fork generation: the number of fork() calls between the process that first
// made a ProcessOwner and this one (0 there, 1 in its children, 2 in theirs, ...).
std::uint64_t fork_generation();

// The process an object belongs to: the one it was made in.
class ProcessOwner {
 public:
  ProcessOwner();  // the first one registers the fork handler
  // True in a child of fork() (at any depth) of the process that made this object.
  bool forked() const { return fork_generation() != generation_; }
  // Throws spill::ForkedProcessError naming `operation` ("a write of a region") when forked().
  void check(const char* operation) const {
    if (forked()) throw_forked(operation);
  }
  [[noreturn]] void throw_forked(const char* operation) const;
  std::uint64_t pid() const { return pid_; }

 private:
  std::uint64_t generation_;
  std::uint64_t pid_;
};

// Keeps a copy of an abandoned object's bytes reachable for the process's life, so LeakSanitizer
// does not report what it owned (a fork() child's abandoned queues, ending with exit()).
void keep_reachable(const void* object, std::size_t bytes);

// A T destroyed only in the process that made it. In a fork() child, destroying some objects
// blocks or corrupts: a condition variable that had waiters in the parent (glibc's
// pthread_cond_destroy waits for them to leave), a joinable std::thread (std::terminate), a
// container a parent thread was changing under its mutex at the instant of fork(). There it is
// abandoned instead: its memory is the child's copy and goes with the child.
template <class T>
class ParentOnly {
 public:
  template <class... Args>
  explicit ParentOnly(Args&&... args) {
    new (storage_) T(std::forward<Args>(args)...);
  }
  ~ParentOnly() {
    if (owner_.forked()) {
      keep_reachable(storage_, sizeof(T));
    } else {
      get()->~T();
    }
  }
  ParentOnly(const ParentOnly&) = delete;
  ParentOnly& operator=(const ParentOnly&) = delete;

  T& operator*() { return *get(); }
  const T& operator*() const { return *get(); }
  T* operator->() { return get(); }
  const T* operator->() const { return get(); }

 private:
  T* get() { return std::launder(reinterpret_cast<T*>(storage_)); }
  const T* get() const { return std::launder(reinterpret_cast<const T*>(storage_)); }

  ProcessOwner owner_;
  alignas(T) unsigned char storage_[sizeof(T)];
};

}  // namespace spill::detail
