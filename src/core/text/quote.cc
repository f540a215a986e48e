#include "core/text/quote.h"

#include <cstdio>

namespace spill::detail {
namespace {

// Note [Messages are one line]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An error message names the value the user gave (a path, an option's text). Such a value may
// hold a newline, a terminal escape or bytes that are not UTF-8: printed raw, a message becomes
// two lines (the CLI prints only the first: the rest of the advice is lost), moves the
// terminal's cursor, or cannot become a Python str. Every message shows such text through
// quote(), so each one is a single printable line whatever the user typed.

// Length of the valid UTF-8 sequence of two or more bytes at the start of `s` (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF), 0 when there is none.
std::size_t utf8_sequence(std::string_view s) {
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const auto cont = [&](std::size_t i, unsigned lo = 0x80, unsigned hi = 0xBF) {
    return i < s.size() && b(i) >= lo && b(i) <= hi;
  };
  const unsigned lead = b(0);
  // U+0080..U+009F are control characters too (0x9B starts a terminal escape): escaped.
  if (lead == 0xC2) return cont(1, 0xA0) ? 2 : 0;
  if (lead >= 0xC3 && lead <= 0xDF) return cont(1) ? 2 : 0;
  if (lead >= 0xE0 && lead <= 0xEF) {
    const unsigned lo = lead == 0xE0 ? 0xA0 : 0x80;
    const unsigned hi = lead == 0xED ? 0x9F : 0xBF;
    return cont(1, lo, hi) && cont(2) ? 3 : 0;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    const unsigned lo = lead == 0xF0 ? 0x90 : 0x80;
    const unsigned hi = lead == 0xF4 ? 0x8F : 0xBF;
    return cont(1, lo, hi) && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

void append_escaped(std::string* out, unsigned char c, bool in_quotes) {
  if (in_quotes && (c == '\\' || c == '\'')) {
    *out += '\\';
    *out += static_cast<char>(c);
    return;
  }
  switch (c) {
    case '\n':
      *out += "\\n";
      return;
    case '\r':
      *out += "\\r";
      return;
    case '\t':
      *out += "\\t";
      return;
    default:
      break;
  }
  if (c >= 0x20 && c < 0x7F) {
    *out += static_cast<char>(c);
    return;
  }
  char hex[5];
  std::snprintf(hex, sizeof hex, "\\x%02x", c);  // lowercase, as Python shows bytes
  *out += hex;
}

std::string escaped(std::string_view text, bool in_quotes) {
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const std::size_t n = c >= 0x80 ? utf8_sequence(text.substr(i)) : 0;
    if (n > 0) {
      out.append(text.data() + i, n);
      i += n;
    } else {
      append_escaped(&out, c, in_quotes);
      ++i;
    }
  }
  return out;
}

}  // namespace

std::string quote(std::string_view text) { return "'" + escaped(text, true) + "'"; }

std::string printable(std::string_view text) { return escaped(text, false); }

}  // namespace spill::detail
