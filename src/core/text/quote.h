// What the user gave, as a message shows it: one line, quoted, bytes that are not text escaped.
// Internal (not installed): the core, the LibTorch layer, the CLI and the Python bindings build
// their messages with it.
//
//   #include "core/text/quote.h"
//   throw spill::PathError(dir, ENOENT, "spill: spill directory " + spill::detail::quote(dir) +
//                                           " does not exist");
//   // spill::detail::quote("/tmp/a\nb") == "'/tmp/a\\nb'"
#pragma once

#include <string>
#include <string_view>

namespace spill::detail {

// `text` between single quotes. Valid UTF-8 stays as it is (a non-ASCII path stays readable);
// \n, \r, \t, \\ and \' get C escapes, other control characters, DEL and bytes that are not
// valid UTF-8 become \xNN. The result is printable, one line and valid UTF-8 (Python can
// raise it). Note [Messages are one line]
std::string quote(std::string_view text);

// The same escapes without the quotes (a ' or \ stays as it is), for a message built elsewhere
// that may hold what the user typed (a command-line parser's).
std::string printable(std::string_view text);

}  // namespace spill::detail
