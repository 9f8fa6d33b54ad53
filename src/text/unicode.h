// UTF-8 <-> code points, Python's notion of whitespace and decimal digits, and NFC normalization,
// as the prompt cleaning needs them (text/clean.h).
// Invariants: decoding never fails: invalid UTF-8 becomes U+FFFD per maximal invalid subsequence,
// as Python's bytes.decode('utf-8', 'replace'); encoding writes surrogate code points (which only
// arise from explicit construction) as U+FFFD. NFC follows the Unicode version of the oracle's
// Python (tables generated from its unicodedata, see text/tables.h).
#pragma once
#include <string>
#include <string_view>

namespace wan::text {

std::u32string utf8_decode(std::string_view s);
// Strict decoding: false on any invalid sequence (overlong, surrogate, > U+10FFFF, truncated).
bool utf8_decode_strict(std::string_view s, std::u32string* out);
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t c);

// str.isspace() / `\s` of Python str regexes: \t\n\v\f\r, \x1c-\x1f, space, \x85, \xa0, U+1680,
// U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000.
bool is_py_space(char32_t c);
// `\d` of Python str regexes (Unicode Nd).
bool is_py_decimal(char32_t c);

int combining_class(char32_t c);
// unicodedata.normalize('NFC', s).
std::u32string nfc(std::u32string_view s);

}  // namespace wan::text
