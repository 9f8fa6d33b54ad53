// ftfy.fix_encoding: detection and repair of mojibake (UTF-8 text that was decoded with a
// single-byte codec), following ftfy 6.3 step by step:
//   loop until nothing changes:
//     ASCII or not is_bad(text)                       -> done
//     for each codec that can encode the text (ftfy's order): encode it, restore_byte_a0 (not for
//       macroman), replace_lossy_sequences (sloppy codecs), decode as utf-8-variants -> on success
//       that is the step's result
//     decode_inconsistent_utf8 (fixes each UTF-8-looking run on its own)
//     Latin-1-encodable text -> strict Windows-1252 decoding (ftfy asks whether "windows-1252" is
//       among the possible codecs, but the list names it "sloppy-windows-1252", so this branch
//       always runs for Latin-1-encodable text)
//     C1 controls -> fix_c1_controls
// is_bad is ftfy.badness.BADNESS_RE translated alternative by alternative (same order, same
// character classes, from the generated category table).
#include <algorithm>
#include <optional>
#include <string>

#include "text/clean.h"
#include "text/tables.h"
#include "text/unicode.h"

namespace wan::text {

namespace {

using namespace tables;

uint32_t cat(char32_t c) {
  if (c < 0x80 && c != U' ') return 0;  // the only ASCII member of any class is ' ' (a continuation clue)
  const auto* end = kMojibakeCategories + kMojibakeCategoriesCount;
  const auto* it =
      std::lower_bound(kMojibakeCategories, end, c, [](const CategoryBits& b, char32_t v) { return b.cp < v; });
  return (it != end && it->cp == c) ? it->bits : 0;
}

bool is_word(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  const auto* end = kWordChars + kWordCharsCount;
  const auto* it = std::upper_bound(kWordChars, end, c, [](char32_t v, const Range& r) { return v < r.lo; });
  return it != kWordChars && c <= (it - 1)->hi;
}

bool lower_ascii(char32_t c) { return c >= 'a' && c <= 'z'; }
bool alpha_ascii(char32_t c) { return lower_ascii(c) || (c >= 'A' && c <= 'Z'); }
bool in(char32_t c, std::u32string_view set) { return set.find(c) != std::u32string_view::npos; }

constexpr uint32_t kAccented = kLowerAccented | kUpperAccented;
constexpr uint32_t kPunct = kStartPunct | kEndPunct;

// Does one BADNESS_RE alternative match at s[i]?
bool bad_at(std::u32string_view s, size_t i) {
  const size_t n = s.size();
  const char32_t a = s[i];
  const uint32_t ca = cat(a);
  const char32_t b = i + 1 < n ? s[i + 1] : 0;
  const uint32_t cb = i + 1 < n ? cat(b) : 0;
  const bool has_b = i + 1 < n, has_c = i + 2 < n;
  const char32_t c = has_c ? s[i + 2] : 0;
  const uint32_t cc = has_c ? cat(c) : 0;

  if (ca & kC1) return true;
  if (has_b && (ca & (kBad | kAccented | kBox | kPunct | kCurrency | kNumeric | kLaw)) && (cb & kBad)) return true;
  if (has_c && alpha_ascii(a) && (cb & (kLowerCommon | kUpperCommon)) && (cc & kBad)) return true;
  if (has_b && (ca & kBad) && (cb & (kAccented | kBox | kPunct | kCurrency | kNumeric | kLaw))) return true;
  if (has_b && (ca & (kLowerAccented | kLowerCommon | kBox | kEndPunct | kCurrency | kNumeric)) && (cb & kUpperAccented))
    return true;
  if (has_b && (ca & (kBox | kEndPunct | kCurrency | kNumeric)) && (cb & kLowerAccented)) return true;
  if (has_b && (ca & (kLowerAccented | kBox | kEndPunct)) && (cb & kCurrency)) return true;
  if (has_c && is_py_space(a) && (cb & kUpperAccented) && (cc & kCurrency)) return true;
  if (has_b && (ca & (kUpperAccented | kBox)) && (cb & (kNumeric | kLaw))) return true;
  if (has_c && (ca & (kAccented | kBox | kCurrency | kEndPunct)) && (cb & kStartPunct) && (cc & kNumeric)) return true;
  if (has_c && (ca & (kAccented | kCurrency | kNumeric | kBox | kLaw)) && (cb & kEndPunct) && (cc & kStartPunct))
    return true;
  if (has_b && (ca & (kCurrency | kNumeric | kBox)) && (cb & kStartPunct)) return true;
  if (has_c && lower_ascii(a) && (cb & kUpperAccented) && (cc & (kStartPunct | kCurrency))) return true;
  if (has_b && (ca & kBox) && (cb & kKaomoji)) return true;
  if (has_b && (ca & (kAccented | kCurrency | kNumeric | kPunct | kLaw)) && (cb & kBox)) return true;
  if (has_b && (ca & kBox) && (cb & kEndPunct)) return true;
  if (has_c && (ca & kAccented) && (cb & kPunct) && is_word(c)) return true;
  if (has_b && (a == U'Œ' || a == U'œ') && !alpha_ascii(b)) return true;
  if (has_b && (ca & kUpperAccented) && b == U'°') return true;
  if (has_b && in(a, U"ÂÃÎÐ") &&
      (in(b, U"€œŠš¢£Ÿž\u00a0\u00ad®©°·»–—´") || (cb & kPunct)))
    return true;
  if (has_b && a == U'×' && (b == U'²' || b == U'³')) return true;
  if (i + 3 < n && in(a, U"ØÙ") && in(c, U"ØÙ")) {
    auto arabic = [](char32_t x) {
      return (cat(x) & (kCommon | kCurrency | kBad | kNumeric | kStartPunct)) || in(x, U"ŸŠ®°µ»");
    };
    if (arabic(b) && arabic(s[i + 3])) return true;
  }
  if (has_b && a == U'à' && in(b, U"²µ¹¼½¾")) return true;
  if (has_b && a == U'√' && in(b, U"±∂†≠®™´≤≥¥µø")) return true;
  if (has_b && a == U'≈' && (b == U'°' || b == U'¢')) return true;
  if (has_c && a == U'‚' && b == U'Ä' && in(c, U"ìîïòôúùû†°¢π")) return true;
  if (has_c && a == U'‚' && (b == U'â' || b == U'ó') && in(c, U"àä°ê")) return true;
  if (has_b && a == U'в' && b == U'Ђ') return true;
  if (has_c && in(a, U"ВГРС") && ((cb & (kC1 | kBad | kPunct | kCurrency)) || b == U'°' || b == U'µ') &&
      in(c, U"ВГРС"))
    return true;
  if (i + 6 < n && s.substr(i, 5) == U"ГўВЂВ" && s[i + 5] != U'\n' &&
      (alpha_ascii(s[i + 6]) || s[i + 6] == U' '))
    return true;
  if (has_b && a == U'Ã' && (b == 0xA0 || b == U'¡')) return true;
  if (lower_ascii(a)) {  // [a-z]\s?[ÃÂ][ ]  (the optional \s tried first)
    if (i + 3 < n && is_py_space(b) && (c == U'Ã' || c == U'Â') && s[i + 3] == U' ') return true;
    if (has_c && (b == U'Ã' || b == U'Â') && c == U' ') return true;
  }
  if (i == 0 && has_b && (a == U'Ã' || a == U'Â') && b == U' ') return true;
  if (has_c && (lower_ascii(a) || in(a, U".,?!") || (ca & kEndPunct)) && b == U'Â' &&
      (c == U' ' || (cc & kPunct)))
    return true;
  if (has_c && a == U'β' && b == U'€' && in(c, U"™\u00a0Ά\u00ad®°")) return true;
  if (has_c && in(a, U"ΒΓΞΟ") && ((cb & (kC1 | kBad | kPunct | kCurrency)) || b == U'°') && in(c, U"ΒΓΞΟ"))
    return true;
  if (has_b && a == U'ā' && b == U'€') return true;
  return false;
}

// ---- byte-level helpers (ftfy.fixes.restore_byte_a0, replace_lossy_sequences) ----

using Bytes = std::string;
unsigned char at(const Bytes& b, size_t i) { return static_cast<unsigned char>(b[i]); }
bool cont(unsigned char x) { return x >= 0x80 && x <= 0xBF; }
bool cont_no85a0(unsigned char x) { return (x >= 0x80 && x <= 0x84) || (x >= 0x86 && x <= 0x9F) || (x >= 0xA1 && x <= 0xBF); }

// ALTERED_UTF8_RE: the length of the first alternative matching at i, or 0.
size_t altered_at(const Bytes& b, size_t i) {
  const size_t n = b.size();
  auto x = [&](size_t k) -> int { return i + k < n ? at(b, i + k) : -1; };
  const int a = x(0);
  if ((a == 0xC2 || a == 0xC3 || a == 0xC5 || a == 0xCE || a == 0xD0 || a == 0xD9) && x(1) == 0x20) return 2;
  if ((a == 0xE2 || a == 0xE3) && x(1) == 0x20 && x(2) >= 0 && cont_no85a0(static_cast<unsigned char>(x(2)))) return 3;
  if (a >= 0xE0 && a <= 0xE3 && x(1) >= 0 && cont_no85a0(static_cast<unsigned char>(x(1))) && x(2) == 0x20) return 3;
  if (a == 0xF0) {
    auto c = [&](int k) { return x(k) >= 0 && cont(static_cast<unsigned char>(x(k))); };
    if (x(1) == 0x20 && c(2) && c(3)) return 4;
    if (c(1) && x(2) == 0x20 && c(3)) return 4;
    if (c(1) && c(2) && x(3) == 0x20) return 4;
  }
  return 0;
}

Bytes restore_byte_a0(const Bytes& in) {
  // A_GRAVE_WORD_RE: b"\xc3 (?! |quele|quela|quilo|s )" -> b"\xc3\xa0 "
  Bytes b;
  for (size_t i = 0; i < in.size(); ++i) {
    if (at(in, i) == 0xC3 && i + 1 < in.size() && in[i + 1] == ' ') {
      const std::string_view rest = std::string_view(in).substr(i + 2);
      const bool excluded = rest.starts_with(" ") || rest.starts_with("quele") || rest.starts_with("quela") ||
                            rest.starts_with("quilo") || rest.starts_with("s ");
      if (!excluded) {
        b += "\xC3\xA0 ";
        ++i;
        continue;
      }
    }
    b.push_back(in[i]);
  }
  Bytes out;
  for (size_t i = 0; i < b.size();) {
    const size_t len = altered_at(b, i);
    if (len == 0) {
      out.push_back(b[i++]);
      continue;
    }
    for (size_t k = 0; k < len; ++k) out.push_back(b[i + k] == ' ' ? '\xA0' : b[i + k]);
    i += len;
  }
  return out;
}

// LOSSY_UTF8_RE: the length of the first alternative matching at i, or 0.
size_t lossy_at(const Bytes& b, size_t i) {
  const size_t n = b.size();
  auto x = [&](size_t k) -> int { return i + k < n ? at(b, i + k) : -1; };
  auto sub = [&](size_t k) { return x(k) == 0x1A || x(k) == '?'; };        // [\x1a?]
  auto sc = [&](size_t k) { return x(k) == 0x1A || (x(k) >= 0x80 && x(k) <= 0xBF); };  // [\x1a\x80-\xbf]
  auto scq = [&](size_t k) { return sub(k) || (x(k) >= 0x80 && x(k) <= 0xBF); };       // [\x1a?\x80-\xbf]
  const int a = x(0);
  if (a >= 0xC2 && a <= 0xDF && x(1) == 0x1A) return 2;
  if ((a == 0xC2 || a == 0xC3) && x(1) == '?') return 2;
  if (a == 0xED && x(1) >= 0xA0 && x(1) <= 0xAF && sub(2) && x(3) == 0xED && x(4) >= 0xB0 && x(4) <= 0xBF && scq(5))
    return 6;
  if (a == 0xED && x(1) >= 0xA0 && x(1) <= 0xAF && scq(2) && x(3) == 0xED && x(4) >= 0xB0 && x(4) <= 0xBF && sub(5))
    return 6;
  if (a >= 0xE0 && a <= 0xEF && sub(1) && sc(2)) return 3;
  if (a >= 0xE0 && a <= 0xEF && sc(1) && sub(2)) return 3;
  if (a >= 0xF0 && a <= 0xF4) {
    if (sub(1) && sc(2) && sc(3)) return 4;
    if (sc(1) && sub(2) && sc(3)) return 4;
    if (sc(1) && sc(2) && sub(3)) return 4;
  }
  if (a == 0x1A) return 1;
  return 0;
}

Bytes replace_lossy_sequences(const Bytes& b) {
  Bytes out;
  for (size_t i = 0; i < b.size();) {
    const size_t len = lossy_at(b, i);
    if (len == 0) {
      out.push_back(b[i++]);
    } else {
      out += "\xEF\xBF\xBD";
      i += len;
    }
  }
  return out;
}

// ftfy's strict "utf-8-variants" decoding: UTF-8, plus CESU-8 surrogate pairs and C0 80 as NUL.
std::optional<std::u32string> decode_utf8_variants(const Bytes& b) {
  std::u32string out;
  size_t i = 0;
  const size_t n = b.size();
  while (i < n) {
    const unsigned char a = at(b, i);
    if (a == 0xC0 && i + 1 < n && at(b, i + 1) == 0x80) {
      out.push_back(0);
      i += 2;
      continue;
    }
    if (a == 0xED && i + 5 < n && at(b, i + 1) >= 0xA0 && at(b, i + 1) <= 0xAF && cont(at(b, i + 2)) &&
        at(b, i + 3) == 0xED && at(b, i + 4) >= 0xB0 && at(b, i + 4) <= 0xBF && cont(at(b, i + 5))) {
      out.push_back(static_cast<char32_t>(((at(b, i + 1) & 0x0F) << 16) + ((at(b, i + 2) & 0x3F) << 10) +
                                          ((at(b, i + 4) & 0x0F) << 6) + (at(b, i + 5) & 0x3F) + 0x10000));
      i += 6;
      continue;
    }
    // One standard sequence, strictly.
    int len = a < 0x80 ? 1 : (a >= 0xC2 && a <= 0xDF) ? 2 : (a >= 0xE0 && a <= 0xEF) ? 3 : (a >= 0xF0 && a <= 0xF4) ? 4 : 0;
    if (len == 0 || i + static_cast<size_t>(len) > n) return std::nullopt;
    std::u32string one;
    if (!utf8_decode_strict(std::string_view(b).substr(i, static_cast<size_t>(len)), &one) || one.size() != 1)
      return std::nullopt;
    out.push_back(one[0]);
    i += static_cast<size_t>(len);
  }
  return out;
}

// Encodes text with codec k if every character is encodable (chardata.possible_encoding).
std::optional<Bytes> encode_codec(std::u32string_view s, int k) {
  Bytes out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c < 0x80 && c != 0x1A) {
      out.push_back(static_cast<char>(c));
      continue;
    }
    if (c == kCodecByte1A[k]) {
      out.push_back('\x1A');
      continue;
    }
    int found = -1;
    for (int j = 0; j < 128; ++j)
      if (kCodecHigh[k][j] == c) {
        found = j;
        break;
      }
    if (found < 0) return std::nullopt;
    out.push_back(static_cast<char>(0x80 + found));
  }
  return out;
}

constexpr int kLatin1 = 0, kMacRoman = 8;
bool codec_is_sloppy(int k) { return k >= 1 && k <= 6; }

// UTF8_DETECTOR_RE at position i (the lookbehind checked by the caller): the match length or 0.
size_t utf8_run_at(std::u32string_view s, size_t i) {
  size_t p = i;
  auto is = [&](size_t k, uint32_t bit) { return k < s.size() && (cat(s[k]) & bit); };
  auto conts = [&](size_t k, int count) {
    for (int j = 0; j < count; ++j)
      if (!(is(k + static_cast<size_t>(j), kUtf8Continuation) || (k + j < s.size() && s[k + j] == U' '))) return false;
    return true;
  };
  while (true) {
    if (is(p, kUtf8First2) && conts(p + 1, 1))
      p += 2;
    else if (is(p, kUtf8First3) && conts(p + 1, 2))
      p += 3;
    else if (is(p, kUtf8First4) && conts(p + 1, 3))
      p += 4;
    else
      break;
  }
  return p - i;
}

std::u32string decode_inconsistent_utf8(std::u32string_view text) {
  std::u32string out;
  for (size_t i = 0; i < text.size();) {
    const bool lookbehind_ok = i == 0 || !(cat(text[i - 1]) & kUtf8ContinuationStrict);
    const size_t len = lookbehind_ok ? utf8_run_at(text, i) : 0;
    if (len == 0) {
      out.push_back(text[i++]);
      continue;
    }
    const std::u32string_view sub = text.substr(i, len);
    if (len < text.size() && ftfy_is_bad(sub))
      out += ftfy_fix_encoding(sub);
    else
      out.append(sub);
    i += len;
  }
  return out;
}

std::u32string fix_encoding_step(const std::u32string& text) {
  if (text.empty()) return text;
  if (std::all_of(text.begin(), text.end(), [](char32_t c) { return c < 0x80; }) || !ftfy_is_bad(text)) return text;
  bool latin1_possible = false;
  for (int k = 0; k < kCodecCount; ++k) {
    std::optional<Bytes> enc = encode_codec(text, k);
    if (!enc) continue;
    if (k == kLatin1) latin1_possible = true;
    Bytes bytes = *enc;
    if (k != kMacRoman) {
      bool altered = false;
      for (size_t i = 0; i < bytes.size() && !altered; ++i) altered = altered_at(bytes, i) != 0;
      if (altered) bytes = restore_byte_a0(bytes);
    }
    if (codec_is_sloppy(k)) bytes = replace_lossy_sequences(bytes);
    if (std::optional<std::u32string> fixed = decode_utf8_variants(bytes)) return *fixed;
  }
  const std::u32string inconsistent = decode_inconsistent_utf8(text);
  if (inconsistent != text) return inconsistent;
  if (latin1_possible) {
    // text.encode('latin-1').decode('windows-1252'), strict: five bytes are undefined there.
    std::u32string fixed;
    bool ok = true;
    for (char32_t c : text) {
      if (c >= 0x80 && c <= 0x9F) {
        if (c == 0x81 || c == 0x8D || c == 0x8F || c == 0x90 || c == 0x9D) {
          ok = false;
          break;
        }
        fixed.push_back(kCodecHigh[1][c - 0x80]);
      } else {
        fixed.push_back(c);
      }
    }
    if (ok && fixed != text) return fixed;
  }
  if (std::any_of(text.begin(), text.end(), [](char32_t c) { return c >= 0x80 && c <= 0x9F; }))
    return ftfy_fix_c1_controls(text);
  return text;
}

}  // namespace

bool ftfy_is_bad(std::u32string_view s) {
  for (size_t i = 0; i < s.size(); ++i)
    if (bad_at(s, i)) return true;
  return false;
}

std::u32string ftfy_fix_encoding(std::u32string_view s) {
  std::u32string text(s);
  while (true) {
    std::u32string next = fix_encoding_step(text);
    if (next == text) return text;
    text = std::move(next);
  }
}

}  // namespace wan::text
