#include "progress.h"

#include <unistd.h>

namespace spill::cli {

bool stdout_is_terminal() { return isatty(STDOUT_FILENO) == 1; }

void ProgressLine::update(const std::string& text, bool milestone) {
  if (terminal_) {
    out_ << "\r\033[K" << text << std::flush;
    drawn_ = true;
  } else if (milestone) {
    out_ << text << "\n" << std::flush;
  }
}

void ProgressLine::finish() {
  if (terminal_ && drawn_) out_ << "\n" << std::flush;
  drawn_ = false;
}

}  // namespace spill::cli
