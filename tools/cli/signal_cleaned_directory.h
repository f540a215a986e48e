// Per-file mode's files in a private directory that a terminating signal removes with them.
//
//   SignalCleanedDirectory private_dir("/mnt/nvme");  // /mnt/nvme/spillarena-per-file-XXXXXX
//   auto stash = spill::make_per_file_stash(private_dir.path());
//   // kill -TERM now: the directory and its .pt files go, then the process ends by SIGTERM
#pragma once

#include <string>

namespace spill::cli {

// Makes a 0700 directory inside `parent` and a thread that, on a terminating signal sent to the
// process (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGXCPU, SIGALRM, SIGUSR1, SIGPIPE, ... each while it
// has its default action), removes it with every file in it and ends the process by that signal.
// Construct it before any other thread starts (the signals are blocked in the threads made after
// it). The destructor removes the (by then empty) directory. Throws the per-file stash's errors
// for a bad `parent`, DirectoryError when the directory cannot be made.
// See Note [Signals and per-file mode].
class SignalCleanedDirectory {
 public:
  explicit SignalCleanedDirectory(const std::string& parent);
  ~SignalCleanedDirectory();
  SignalCleanedDirectory(const SignalCleanedDirectory&) = delete;
  SignalCleanedDirectory& operator=(const SignalCleanedDirectory&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace spill::cli
