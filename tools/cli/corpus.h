// The default training text, embedded in the binary at build time: the books of Genesis and
// Exodus from the King James Version (public domain; taken from Debian's bible-kjv-text, see
// data/README.md).
#pragma once

#include <string_view>

namespace spill::cli {

std::string_view embedded_corpus();

}  // namespace spill::cli
