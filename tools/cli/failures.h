// How `spillarena` ends: every failure is one line on stderr and an exit code (2 usage, 1
// runtime), and a run whose output could not be written (stdout on a full disk) does not exit 0.
//
//   int main(int argc, char** argv) {
//     std::signal(SIGXFSZ, SIG_IGN);                        // EFBIG instead of a kill
//     if (bad_options) return report_usage_error("--x must be ...");
//     return finish_output(run_guarded([&] { return run(); }));
//   }
#pragma once

#include <functional>
#include <string>

#include "spill/error.h"

namespace spill::cli {

// The message for a library error, reworded where the library's advice does not fit the CLI
// (a file size limit is not a file system that cannot preallocate).
std::string explain(const spill::Error& error);
// Any library text (a spill::DirectoryInfo's problem, a warning) with the library's advice in
// the CLI's words: Note [The library's advice in the CLI's words] in failures.cc.
std::string in_cli_words(std::string message);

// Prints "spillarena: <problem>" on stderr and returns 2.
int report_usage_error(const std::string& problem);

// Prints "spillarena: <problem>" on stderr and returns 1: a runtime "no" found without an
// exception (a plan whose directory cannot hold the arena).
int report_failure(const std::string& problem);

// Prints "spillarena: warning: <text>" on stderr, the library's advice in the CLI's words (as
// explain); nothing for an empty text. Not a failure: the run goes on and its exit code is
// unchanged.
void warn(const std::string& text);

// Runs `command`; any exception becomes one line on stderr and exit code 1.
int run_guarded(const std::function<int()>& command);

// Flushes stdout. Returns `exit_code`, or 1 (with one line on stderr) when the output could not
// be written.
int finish_output(int exit_code);

}  // namespace spill::cli
