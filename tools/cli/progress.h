// ProgressLine: one status line that redraws in place on a terminal and falls back to plain,
// occasional lines when output goes to a file or a pipe.
#pragma once

#include <ostream>
#include <string>

namespace spill::cli {

// Whether standard output is a terminal (isatty), where a progress line redraws in place.
bool stdout_is_terminal();

class ProgressLine {
 public:
  ProgressLine(std::ostream& out, bool terminal) : out_(out), terminal_(terminal) {}
  // On a terminal every update redraws; elsewhere only updates with `milestone` print a line.
  void update(const std::string& text, bool milestone);
  void finish();  // ends the redrawn line so later output starts on a new one

 private:
  std::ostream& out_;
  bool terminal_;
  bool drawn_ = false;
};

}  // namespace spill::cli
