#include "failures.h"

#include <c10/util/Exception.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <new>
#include <string>
#include <system_error>
#include <utility>

#include "core/text/quote.h"

namespace spill::cli {
namespace {

// A library's message may go on with a backtrace after its first line (LibTorch's do); what the
// user typed is already escaped (Note [Messages are one line] in src/core/text/quote.cc).
std::string first_line(const std::string& text) {
  return detail::printable(text.substr(0, text.find('\n')));
}

bool error_printed = false;  // one line per run: a later failure does not add a second

void print_error(const std::string& message) {
  if (std::exchange(error_printed, true)) return;
  std::cerr << "spillarena: " << first_line(message) << "\n" << std::flush;
}

// Note [The library's advice in the CLI's words]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The library's messages, its errors and the arena's warnings, name the settings a C++ caller
// has (options.directory, capacity_bytes, stats()).
// A CLI user has flags instead, and no flag for some settings (allow_memory_backed_directory):
// each such phrase is replaced here, in one table, so a message never points at something the
// user cannot type.
struct Rewording {
  const char* library;
  const char* cli;
};
constexpr Rewording kRewordings[] = {
    {"choose another with options.directory or $SPILL_DIR", "choose another with --dir"},
    {"point options.directory at a directory", "point --dir at a directory"},
    {"(options.directory or $SPILL_DIR), or set options.allow_memory_backed_directory", "(--dir)"},
    {"lower capacity_bytes", "lower --capacity (or use a smaller model)"},
    // The arena's sizing warnings (Note [Growing the arena] in src/core/arena/arena_growth.cc).
    {"make the arena with that capacity", "pass that --capacity"},
    {"(grow = false): give a capacity", "(--no-grow): give a --capacity"},
    {"(SPILL_DIR, directory=)", "(--dir)"},
    {"stats(): ", "--json's arena: "},
    {"stats()['capacity_needed_bytes']", "the summary's capacity needed"},
};

}  // namespace

std::string in_cli_words(std::string message) {
  for (const Rewording& r : kRewordings) {
    const std::string from = r.library;
    for (std::size_t at = message.find(from); at != std::string::npos;
         at = message.find(from, at + std::char_traits<char>::length(r.cli))) {
      message.replace(at, from.size(), r.cli);
    }
  }
  return message;
}

namespace {

// Note [A thread that cannot start]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// std::thread reports a refused clone() as std::system_error with EAGAIN, whose text is only
// "Resource temporarily unavailable". The cause is nearly always a limit on tasks: ulimit -u
// (RLIMIT_NPROC, counted per user) or the cgroup's pids.max.
std::string system_failure(const std::system_error& e) {
  if (e.code() == std::errc::resource_unavailable_try_again) {
    return std::string("cannot start a thread (") + e.what() +
           "): the limit on processes and "
           "threads is reached (ulimit -u, or the container's pids.max); raise it or stop other "
           "processes of this user";
  }
  return e.what();
}

}  // namespace

// EFBIG's advice is the library's (Note [EFBIG is a size limit, not a disk] in
// src/core/file/io_advice.h), in the CLI's words like every other message.
std::string explain(const spill::Error& error) { return in_cli_words(error.what()); }

int report_usage_error(const std::string& problem) {
  print_error(problem);
  return 2;
}

int report_failure(const std::string& problem) {
  print_error(problem);
  return 1;
}

void warn(const std::string& text) {
  if (text.empty()) return;
  std::cerr << "spillarena: warning: " << first_line(in_cli_words(text)) << "\n" << std::flush;
}

int run_guarded(const std::function<int()>& command) {
  try {
    return command();
  } catch (const spill::Error& e) {
    print_error(explain(e));
  } catch (const c10::Error& e) {
    print_error(e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    print_error("out of memory; use a smaller model (--batch, --seq, --hidden, --layers)");
  } catch (const std::system_error& e) {
    print_error(system_failure(e));
  } catch (const std::exception& e) {
    print_error(e.what());
  }
  return 1;
}

int finish_output(int exit_code) {
  errno = 0;
  std::cout.flush();
  if (std::cout.good()) return exit_code;
  const int e = errno;
  print_error(std::string("cannot write to standard output") +
              (e ? ": " + std::string(std::strerror(e)) : "") +
              "; send it to a file system with free space (or drop the redirection)");
  return 1;
}

}  // namespace spill::cli
