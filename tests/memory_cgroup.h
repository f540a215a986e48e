// A memory cgroup made for one test run (root only; v1 or v2): a limit, a child process moved
// into it, its peak and its OOM kills. ok() is false, with a reason, where none can be made.
//
//   spill_test::MemoryCgroup cg("disk");
//   if (!cg.ok()) { MESSAGE("skipped: " << cg.reason()); return; }
//   cg.set_limit(512ull << 20);
//   spill_test::ChildRun r = cg.run({"/path/to/spillarena", "train", "--json"});
//   CHECK(cg.peak_bytes() <= 512ull << 20);
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace spill_test {

struct ChildRun {
  int exit_code = -1;    // when it exited
  int signal = 0;        // when a signal killed it (SIGKILL: the OOM killer)
  std::string out, err;  // its stdout and stderr
  double seconds = 0;
  bool timed_out = false;  // killed (SIGKILL) for running past the timeout
};

class MemoryCgroup {
 public:
  explicit MemoryCgroup(const std::string& name) {
    if (geteuid() != 0) {
      reason_ = "not running as root (a memory cgroup cannot be made)";
      return;
    }
    if (!find_hierarchy()) return;
    path_ = base_ + "/spillarena-test-" + std::to_string(getpid()) + "-" + name;
    std::error_code ec;
    if (!std::filesystem::create_directory(path_, ec)) {
      reason_ = "cannot create " + path_ + ": " + ec.message();
      path_.clear();
    }
  }
  ~MemoryCgroup() {
    for (int i = 0; i < 50 && !path_.empty() && rmdir(path_.c_str()) != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // tasks still leaving
    }
  }
  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;

  bool ok() const { return !path_.empty(); }
  const std::string& reason() const { return reason_; }
  int version() const { return version_; }
  const std::string& path() const { return path_; }

  // No swap either, so going over the limit means reclaim or the OOM killer.
  bool set_limit(std::uint64_t bytes) {
    const std::string v = std::to_string(bytes);
    if (version_ == 1) {
      if (!write_file("memory.limit_in_bytes", v)) return false;
      write_file("memory.memsw.limit_in_bytes", v);  // absent without swap accounting
      return true;
    }
    write_file("memory.swap.max", "0");
    return write_file("memory.max", v);
  }
  std::uint64_t peak_bytes() const {
    return read_number(version_ == 1 ? "memory.max_usage_in_bytes" : "memory.peak");
  }
  // Processes the kernel's OOM killer killed in this cgroup.
  std::uint64_t oom_kills() const {
    return read_key(version_ == 1 ? "memory.oom_control" : "memory.events", "oom_kill");
  }

  // Runs argv[0] with argv in this cgroup and waits for it; past `timeout_s` (> 0) it is killed.
  ChildRun run(const std::vector<std::string>& argv, const std::string& scratch,
               double timeout_s = 0) const {
    const std::string out = scratch + "/child.out", err = scratch + "/child.err";
    const std::string procs = path_ + "/cgroup.procs";
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const auto t0 = std::chrono::steady_clock::now();
    const pid_t pid = fork();
    if (pid == 0) exec_in_cgroup(procs, out, err, args.data());  // never returns
    ChildRun r;
    const int status = wait_for(pid, t0, timeout_s, &r.timed_out);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

 private:
  static int wait_for(pid_t pid, std::chrono::steady_clock::time_point t0, double timeout_s,
                      bool* timed_out) {
    int status = 0;
    while (waitpid(pid, &status, timeout_s > 0 ? WNOHANG : 0) == 0) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s > timeout_s && !*timed_out) {
        kill(pid, SIGKILL);
        *timed_out = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return status;
  }

  // Between fork and exec: only async-signal-safe calls.
  [[noreturn]] static void exec_in_cgroup(const std::string& procs, const std::string& out,
                                          const std::string& err, char** args) {
    const int p = open(procs.c_str(), O_WRONLY);
    if (p < 0 || write(p, "0", 1) != 1) _exit(125);
    close(p);
    const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0) _exit(126);
    execv(args[0], args);
    _exit(127);
  }

  // v1: <mount>/memory<own path>; v2: the root of the unified hierarchy (a child of our own
  // cgroup could not take processes while we are in it).
  bool find_hierarchy() {
    const std::string v1 = "/sys/fs/cgroup/memory";
    if (std::filesystem::exists(v1 + "/memory.limit_in_bytes")) {
      version_ = 1;
      base_ = v1 + own_path(":memory:");
      return true;
    }
    if (slurp("/sys/fs/cgroup/cgroup.controllers").find("memory") != std::string::npos) {
      version_ = 2;
      base_ = "/sys/fs/cgroup";
      return true;
    }
    reason_ = "no memory cgroup hierarchy at /sys/fs/cgroup (v1 memory/ or v2 with memory)";
    return false;
  }
  static std::string own_path(const std::string& marker) {
    std::istringstream lines(slurp("/proc/self/cgroup"));
    for (std::string line; std::getline(lines, line);) {
      const auto at = line.find(marker);
      if (at != std::string::npos) return line.substr(at + marker.size());
    }
    return "";
  }
  bool write_file(const std::string& name, const std::string& value) const {
    std::ofstream f(path_ + "/" + name);
    f << value;
    f.flush();
    return static_cast<bool>(f);
  }
  std::uint64_t read_number(const std::string& name) const {
    std::uint64_t v = 0;
    std::ifstream(path_ + "/" + name) >> v;
    return v;
  }
  std::uint64_t read_key(const std::string& name, const std::string& key) const {
    std::istringstream lines(slurp(path_ + "/" + name));
    for (std::string k; lines >> k;) {
      std::uint64_t v = 0;
      if (lines >> v && k == key) return v;
    }
    return 0;
  }
  static std::string slurp(const std::string& file) {
    std::ifstream in(file);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }

  int version_ = 0;
  std::string base_;
  std::string path_;
  std::string reason_;
};

}  // namespace spill_test
