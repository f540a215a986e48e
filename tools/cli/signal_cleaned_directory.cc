#include "signal_cleaned_directory.h"

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "core/text/quote.h"
#include "spill/error.h"
#include "spill/tensor_stash.h"

namespace spill::cli {
namespace {

// Note [Signals and per-file mode]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Per-file mode's files have names; a disk arena's file has none (O_TMPFILE), so a killed run
// leaves nothing there. Interrupted per-file runs left their .pt files behind (issue 19). Its
// files therefore go in a private directory, and the terminating signals a user or a scheduler
// sends are taken by one thread (sigwait) instead of the default action: it removes the directory
// and every file in it, then ends the process by the same signal (same exit status as before).
// The directory is removed last and a file is only ever created inside it, so a file the
// training thread creates meanwhile is either listed and unlinked on the next pass, or its
// creation fails because the directory is gone: nothing can be left. Taken are the signals whose
// default action ends the process and that are sent rather than raised by a fault: the
// terminal's and schedulers' (INT, TERM, HUP, QUIT, XCPU for a CPU-time limit, PWR), the timers'
// (ALRM, VTALRM, PROF), USR1/USR2, PIPE and the realtime signals — each only while it has its
// default action: a blocked signal is queued for sigwait even when ignored, so a signal the
// parent ignored (nohup's SIGHUP, SIGINT of a background job) or one with a handler is left
// out, and keeps its meaning (the red-team pass found nohup'd runs killed by SIGHUP). SIGKILL
// cannot be caught: it leaves the files, as with torch.save (a disk arena is the way not to).
bool has_default_action(int signal_number) {
  struct sigaction current{};
  return sigaction(signal_number, nullptr, &current) == 0 && current.sa_handler == SIG_DFL;
}

sigset_t stop_signals() {
  std::vector<int> candidates = {SIGINT,  SIGTERM,   SIGHUP,  SIGQUIT, SIGXCPU, SIGPWR,
                                 SIGALRM, SIGVTALRM, SIGPROF, SIGUSR1, SIGUSR2, SIGPIPE};
  for (int s = SIGRTMIN; s <= SIGRTMAX; ++s) candidates.push_back(s);
  sigset_t set;
  sigemptyset(&set);
  for (int s : candidates) {
    if (has_default_action(s)) sigaddset(&set, s);
  }
  return set;
}

// Note [A CPU-time limit warns before it kills]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The kernel sends SIGXCPU when the soft RLIMIT_CPU is reached and SIGKILL at the hard one. bash's
// `ulimit -t N` sets both to N, so the first signal is SIGKILL and the files would be left
// (red-team pass). Where the two are equal, the soft limit is lowered by one second: SIGXCPU
// comes first, the files are removed and the run ends by SIGXCPU, one second earlier than the
// limit said.
void warn_before_cpu_limit_kills() {
  rlimit cpu{};
  if (getrlimit(RLIMIT_CPU, &cpu) != 0 || cpu.rlim_max == RLIM_INFINITY) return;
  if (cpu.rlim_cur != cpu.rlim_max || cpu.rlim_max < 2) return;
  cpu.rlim_cur = cpu.rlim_max - 1;
  setrlimit(RLIMIT_CPU, &cpu);
}

// Unlinks every entry of `dir`, then the directory; again while a file appeared meanwhile.
void remove_directory_and_files(const std::string& dir) {
  for (int pass = 0; pass < 1000; ++pass) {
    if (DIR* d = opendir(dir.c_str())) {
      std::vector<std::string> names;
      while (const dirent* e = readdir(d)) {
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
          names.emplace_back(e->d_name);
        }
      }
      closedir(d);
      for (const std::string& name : names) unlink((dir + "/" + name).c_str());
    }
    if (rmdir(dir.c_str()) == 0 || errno != ENOTEMPTY) return;
  }
}

[[noreturn]] void clean_up_on_signal(std::string dir, sigset_t signals) {
  int signal_number = 0;
  while (sigwait(&signals, &signal_number) != 0) {
  }
  remove_directory_and_files(dir);
  signal(signal_number, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, signal_number);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  raise(signal_number);
  std::_Exit(128 + signal_number);  // a signal whose default action is not to end the process
}

}  // namespace

SignalCleanedDirectory::SignalCleanedDirectory(const std::string& parent) {
  make_per_file_stash(parent);  // the per-file stash's typed errors for a bad parent
  std::string name = parent + "/spillarena-per-file-XXXXXX";
  if (mkdtemp(name.data()) == nullptr) {
    const int e = errno;
    const std::string what =
        "making per-file mode's directory " + detail::quote(name) + " failed: " + std::strerror(e);
    if (e == ENOSPC || e == EDQUOT) {
      throw InsufficientSpaceError(parent, 0, 0,
                                   what +
                                       ". Free space there, choose another "
                                       "directory (--dir), or use --mode disk, which "
                                       "reserves its space when it starts");
    }
    throw DirectoryError(parent, e, what + "; choose another with --dir");
  }
  path_ = name;
  warn_before_cpu_limit_kills();
  const sigset_t signals = stop_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  try {
    std::thread(clean_up_on_signal, path_, signals).detach();
  } catch (...) {  // no thread (ulimit -u): the signals act as before, and nothing is left
    pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
    rmdir(path_.c_str());
    throw;
  }
}

SignalCleanedDirectory::~SignalCleanedDirectory() { remove_directory_and_files(path_); }

}  // namespace spill::cli
