// Safe echoing of user text (see printable.h).
#include "core/printable.h"

#include <cstdio>

namespace wan {

size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  return n;
}

size_t first_invalid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_length(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string printable(std::string_view s, size_t max_chars) {
  std::string out;
  out.reserve(s.size());
  size_t chars = 0;
  char buf[8];
  for (size_t i = 0; i < s.size();) {
    if (max_chars > 0 && chars == max_chars) {
      out += "...";
      break;
    }
    ++chars;
    const size_t n = utf8_sequence_length(s, i);
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (n == 0 || (n == 1 && (c < 0x20 || c == 0x7F))) {
      if (c == '\n') out += "\\n";
      else if (c == '\r') out += "\\r";
      else if (c == '\t') out += "\\t";
      else {
        std::snprintf(buf, sizeof buf, "\\x%02X", c);
        out += buf;
      }
      ++i;
      continue;
    }
    out.append(s.substr(i, n));
    i += n;
  }
  return out;
}

}  // namespace wan
