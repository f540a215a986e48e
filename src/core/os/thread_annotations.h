// Thread-safety annotations: clang's -Wthread-safety checks at compile time that a member marked
// GUARDED_BY(m) is touched only while m is held, and that a function marked REQUIRES(m) is called
// only with m held. Under other compilers the macros expand to nothing. The mutex that carries
// them is spill::detail::Mutex (mutex.h); tests/thread_safety_check.sh compiles the core with
// -Wthread-safety -Werror.
//
//   class Counter {
//    public:
//     void add() {
//       MutexLock lock(mutex_);
//       add_locked();
//     }
//
//    private:
//     void add_locked() REQUIRES(mutex_) { ++count_; }
//     Mutex mutex_;
//     std::uint64_t count_ GUARDED_BY(mutex_) = 0;
//   };
#pragma once

#if defined(__clang__)
#define SPILL_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define SPILL_THREAD_ANNOTATION(x)
#endif

// A type that is a lock (Mutex), and an RAII type that holds one for its lifetime (MutexLock).
#define CAPABILITY(name) SPILL_THREAD_ANNOTATION(capability(name))
#define SCOPED_CAPABILITY SPILL_THREAD_ANNOTATION(scoped_lockable)

// A member or global read or written only while the mutex is held.
#define GUARDED_BY(mutex) SPILL_THREAD_ANNOTATION(guarded_by(mutex))
// The pointee of a pointer member is touched only while the mutex is held.
#define PT_GUARDED_BY(mutex) SPILL_THREAD_ANNOTATION(pt_guarded_by(mutex))

// A function called with the mutexes held (REQUIRES) or not held (EXCLUDES).
#define REQUIRES(...) SPILL_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) SPILL_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

// A function that takes (ACQUIRE) or gives back (RELEASE) the mutexes; no argument: *this.
#define ACQUIRE(...) SPILL_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) SPILL_THREAD_ANNOTATION(release_capability(__VA_ARGS__))

// A function returning a reference to the mutex it names.
#define RETURN_CAPABILITY(mutex) SPILL_THREAD_ANNOTATION(lock_returned(mutex))

// The body is not checked: the lock primitives themselves, whose std:: calls carry no annotations.
#define NO_THREAD_SAFETY_ANALYSIS SPILL_THREAD_ANNOTATION(no_thread_safety_analysis)
