// Prompt cleaning: Python's html.unescape, ftfy.fix_text (all fixers but fix_encoding, which lives
// in mojibake.cpp) and the whitespace collapse. Each function mirrors the Python code path it names;
// the comments point out the Python semantics that are easy to get wrong.
#include "text/clean.h"

#include <algorithm>
#include <cstring>

#include "text/tables.h"
#include "text/unicode.h"

namespace wan::text {

namespace {

bool ascii_digit(char32_t c) { return c >= '0' && c <= '9'; }
bool ascii_hex(char32_t c) { return ascii_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool ascii_alnum(char32_t c) { return ascii_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Entity tables are sorted bytewise; names are ASCII, so a code-point string compares the same way.
const char* find_entity(const tables::Entity* table, size_t count, std::u32string_view name) {
  if (name.empty() || name.size() > 64) return nullptr;
  std::string key;
  for (char32_t c : name) {
    if (c >= 0x80) return nullptr;
    key.push_back(static_cast<char>(c));
  }
  const auto* end = table + count;
  const auto* it = std::lower_bound(table, end, key, [](const tables::Entity& e, const std::string& k) {
    return std::strcmp(e.name, k.c_str()) < 0;
  });
  return (it != end && key == it->name) ? it->value : nullptr;
}

void append_utf8(std::u32string& out, const char* utf8) { out += utf8_decode(utf8); }

// html._invalid_charrefs: references to these numbers decode to Windows-1252 (or \ufffd, \r).
char32_t invalid_charref(uint64_t num, bool* found) {
  *found = true;
  if (num == 0x00) return 0xFFFD;
  if (num == 0x0D) return '\r';
  if (num >= 0x80 && num <= 0x9F) return tables::kCodecHigh[1][num - 0x80];  // sloppy cp1252 keeps 81,8D,8F,90,9D
  *found = false;
  return 0;
}

// html._invalid_codepoints: references to these numbers decode to nothing.
bool invalid_codepoint(uint64_t n) {
  if ((n >= 0x1 && n <= 0x8) || n == 0xB || (n >= 0xE && n <= 0x1F) || (n >= 0x7F && n <= 0x9F)) return true;
  if (n >= 0xFDD0 && n <= 0xFDEF) return true;
  return n <= 0x10FFFF && (n & 0xFFFE) == 0xFFFE;  // U+xFFFE, U+xFFFF of every plane
}

// The replacement of html._replace_charref for a numeric reference.
void numeric_charref(uint64_t num, std::u32string& out) {
  bool found;
  const char32_t c = invalid_charref(num, &found);
  if (found) {
    out.push_back(c);
  } else if ((num >= 0xD800 && num <= 0xDFFF) || num > 0x10FFFF) {
    out.push_back(0xFFFD);
  } else if (!invalid_codepoint(num)) {
    out.push_back(static_cast<char32_t>(num));
  }
}

// Parses digits [b, e) in base 10/16; saturates above U+10FFFF (Python ints do not overflow; every
// such value maps to U+FFFD anyway).
uint64_t parse_number(std::u32string_view s, size_t b, size_t e, int base) {
  uint64_t v = 0;
  for (size_t i = b; i < e; ++i) {
    const char32_t c = s[i];
    const int d = ascii_digit(c) ? static_cast<int>(c - '0') : static_cast<int>((c | 0x20) - 'a' + 10);
    v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
    if (v > 0x110000) v = 0x110000;
  }
  return v;
}

}  // namespace

// Python 3.11 html.unescape: re.sub of
//   &(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)
// where a named reference is looked up whole, then by its longest prefix of length >= 2.
std::u32string html_unescape(std::u32string_view s) {
  if (s.find(U'&') == std::u32string_view::npos) return std::u32string(s);
  std::u32string out;
  out.reserve(s.size());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (s[i] != U'&') {
      out.push_back(s[i++]);
      continue;
    }
    const size_t j = i + 1;
    if (j < n && s[j] == U'#') {
      size_t k = j + 1, e;
      if (k < n && ascii_digit(s[k])) {
        for (e = k; e < n && ascii_digit(s[e]); ++e) {
        }
        numeric_charref(parse_number(s, k, e, 10), out);
      } else if (k + 1 < n && (s[k] == U'x' || s[k] == U'X') && ascii_hex(s[k + 1])) {
        for (e = k + 1; e < n && ascii_hex(s[e]); ++e) {
        }
        numeric_charref(parse_number(s, k + 1, e, 16), out);
      } else {
        out.push_back(s[i++]);  // no match at '&': it stays, scanning resumes after it
        continue;
      }
      i = (e < n && s[e] == U';') ? e + 1 : e;
      continue;
    }
    // Named: 1..32 code points outside "\t\n\f <&#;", then an optional ';'.
    size_t e = j;
    while (e < n && e - j < 32) {
      const char32_t c = s[e];
      if (c == U'\t' || c == U'\n' || c == U'\f' || c == U' ' || c == U'<' || c == U'&' || c == U'#' || c == U';')
        break;
      ++e;
    }
    if (e == j) {
      out.push_back(s[i++]);
      continue;
    }
    if (e < n && s[e] == U';') ++e;
    const std::u32string_view name = s.substr(j, e - j);
    if (const char* v = find_entity(tables::kHtml5, tables::kHtml5Count, name)) {
      append_utf8(out, v);
    } else {
      bool done = false;
      for (size_t x = name.size() - 1; x > 1; --x) {
        if (const char* v2 = find_entity(tables::kHtml5, tables::kHtml5Count, name.substr(0, x))) {
          append_utf8(out, v2);
          out.append(name.substr(x));
          done = true;
          break;
        }
      }
      if (!done) {
        out.push_back(U'&');
        out.append(name);
      }
    }
    i = e;
  }
  return out;
}

// ftfy.fixes.unescape_html: re.sub of "&#?[0-9A-Za-z]{1,24};" where a match is replaced when it is
// a known name (html5 names with ';' and ftfy's all-caps extras) or a numeric reference whose
// html.unescape result has no ';' left.
std::u32string ftfy_unescape_html(std::u32string_view s) {
  std::u32string out;
  out.reserve(s.size());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (s[i] != U'&') {
      out.push_back(s[i++]);
      continue;
    }
    size_t b = i + 1;
    const bool numeric = b < n && s[b] == U'#';
    if (numeric) ++b;
    size_t e = b;
    while (e < n && ascii_alnum(s[e]) && e - b <= 24) ++e;
    const size_t len = e - b;
    if (len < 1 || len > 24 || e >= n || s[e] != U';') {
      out.push_back(s[i++]);
      continue;
    }
    const std::u32string_view match = s.substr(i, e + 1 - i);
    if (!numeric) {
      const std::u32string_view name = s.substr(b, e + 1 - b);  // with the ';'
      const char* v = find_entity(tables::kHtml5, tables::kHtml5Count, name);
      if (!v) v = find_entity(tables::kFtfyUpper, tables::kFtfyUpperCount, name);
      if (v)
        append_utf8(out, v);
      else
        out.append(match);
    } else {
      const std::u32string u = html_unescape(match);
      if (u.find(U';') != std::u32string::npos)
        out.append(match);
      else
        out += u;
    }
    i = e + 1;
  }
  return out;
}

std::u32string ftfy_fix_c1_controls(std::u32string_view s) {
  std::u32string out(s);
  for (char32_t& c : out)
    if (c >= 0x80 && c <= 0x9F) c = tables::kCodecHigh[1][c - 0x80];
  return out;
}

namespace {

std::u32string map_chars(std::u32string_view s, const tables::CodepointMap* table, size_t count) {
  std::u32string out;
  out.reserve(s.size());
  const auto* end = table + count;
  for (char32_t c : s) {
    const auto* it =
        std::lower_bound(table, end, c, [](const tables::CodepointMap& m, char32_t v) { return m.cp < v; });
    if (it != end && it->cp == c)
      append_utf8(out, it->value);
    else
      out.push_back(c);
  }
  return out;
}

std::u32string uncurl_quotes(std::u32string_view s) {
  std::u32string out(s);
  for (char32_t& c : out) {
    if (c == 0x02BC || (c >= 0x2018 && c <= 0x201B))
      c = U'\'';
    else if (c >= 0x201C && c <= 0x201F)
      c = U'"';
  }
  return out;
}

std::u32string fix_line_breaks(std::u32string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char32_t c = s[i];
    if (c == U'\r') {
      if (i + 1 < s.size() && s[i + 1] == U'\n') ++i;
      out.push_back(U'\n');
    } else if (c == 0x2028 || c == 0x2029 || c == 0x85) {
      out.push_back(U'\n');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// "\033\[((?:\d|;)*)([a-zA-Z])" with Python's Unicode \d.
std::u32string remove_terminal_escapes(std::u32string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s[i] == 0x1B && i + 1 < s.size() && s[i + 1] == U'[') {
      size_t e = i + 2;
      while (e < s.size() && (s[e] == U';' || is_py_decimal(s[e]))) ++e;
      if (e < s.size() && ((s[e] >= U'a' && s[e] <= U'z') || (s[e] >= U'A' && s[e] <= U'Z'))) {
        i = e + 1;
        continue;
      }
    }
    out.push_back(s[i++]);
  }
  return out;
}

bool is_removed_control(char32_t c) {
  return c <= 0x08 || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F || (c >= 0x206A && c <= 0x206F) ||
         c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFC);
}

// ftfy.fix_and_explain for one segment with the default configuration.
std::u32string fix_segment(std::u32string text, bool unescape_html) {
  if (text.find(U'<') != std::u32string::npos) unescape_html = false;
  while (true) {
    const std::u32string orig = text;
    if (unescape_html) text = ftfy_unescape_html(text);
    text = ftfy_fix_encoding(text);
    text = ftfy_fix_c1_controls(text);
    text = map_chars(text, tables::kLigatures, tables::kLigaturesCount);
    text = map_chars(text, tables::kWidthMap, tables::kWidthMapCount);
    text = uncurl_quotes(text);
    text = fix_line_breaks(text);
    // fix_surrogates: the identity (code points decoded from UTF-8 are never surrogates).
    text = remove_terminal_escapes(text);
    text.erase(std::remove_if(text.begin(), text.end(), is_removed_control), text.end());
    text = nfc(text);
    if (text == orig) return text;
  }
}

}  // namespace

// ftfy.fix_text: fixes each line (up to and including its '\n') on its own; the first line that
// contains '<' switches HTML unescaping off for itself and every later line (ftfy overwrites its
// config object in the loop).
std::u32string ftfy_fix_text(std::u32string_view s) {
  std::u32string out;
  out.reserve(s.size());
  bool unescape_html = true;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t brk = s.find(U'\n', pos);
    brk = brk == std::u32string_view::npos ? s.size() : brk + 1;
    const std::u32string_view seg = s.substr(pos, brk - pos);
    if (unescape_html && seg.find(U'<') != std::u32string_view::npos) unescape_html = false;
    out += fix_segment(std::u32string(seg), unescape_html);
    pos = brk;
  }
  return out;
}

std::u32string whitespace_clean(std::u32string_view s) {
  std::u32string out;
  out.reserve(s.size());
  bool in_space = false;
  for (char32_t c : s) {
    if (is_py_space(c)) {
      in_space = true;
      continue;
    }
    if (in_space && !out.empty()) out.push_back(U' ');
    in_space = false;
    out.push_back(c);
  }
  return out;
}

std::string clean_prompt(std::string_view prompt) {
  std::u32string t = ftfy_fix_text(utf8_decode(prompt));
  t = html_unescape(html_unescape(t));
  return utf8_encode(whitespace_clean(t));
}

}  // namespace wan::text
