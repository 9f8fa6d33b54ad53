// UTF-8 coding, Python whitespace/digit predicates and NFC (see unicode.h).
// NFC = canonical decomposition (recursive, Hangul algorithmic), canonical ordering of combining
// marks (stable by class), then canonical composition (UAX #15), using the generated tables.
#include "text/unicode.h"

#include <algorithm>
#include <cstdint>
#include <unordered_map>

#include "text/tables.h"

namespace wan::text {

namespace {

constexpr char32_t kReplacement = 0xFFFD;

// Valid range of the second byte of a multi-byte sequence, by lead byte (Unicode Table 3-7).
bool second_ok(unsigned char lead, unsigned char b) {
  if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
  if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
  if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
  if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
  return b >= 0x80 && b <= 0xBF;
}

int seq_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;  // continuation byte or invalid lead
}

// Decodes one sequence at s[i]; returns the number of bytes consumed and whether it was valid.
size_t decode_one(std::string_view s, size_t i, char32_t* cp, bool* valid) {
  const auto lead = static_cast<unsigned char>(s[i]);
  const int n = seq_len(lead);
  if (n == 1) {
    *cp = lead;
    *valid = true;
    return 1;
  }
  *valid = false;
  *cp = kReplacement;
  if (n == 0) return 1;
  // Maximal subpart: consume the continuation bytes that are still valid, then stop.
  size_t j = 1;
  char32_t v = lead & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (; j < static_cast<size_t>(n); ++j) {
    if (i + j >= s.size()) return j;
    const auto b = static_cast<unsigned char>(s[i + j]);
    if (j == 1 ? !second_ok(lead, b) : (b < 0x80 || b > 0xBF)) return j;
    v = (v << 6) | (b & 0x3F);
  }
  *cp = v;
  *valid = true;
  return j;
}

}  // namespace

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t c;
    bool ok;
    i += decode_one(s, i, &c, &ok);
    out.push_back(c);
  }
  return out;
}

bool utf8_decode_strict(std::string_view s, std::u32string* out) {
  out->clear();
  out->reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t c;
    bool ok;
    i += decode_one(s, i, &c, &ok);
    if (!ok) return false;
    out->push_back(c);
  }
  return true;
}

void utf8_append(std::string& out, char32_t c) {
  if ((c >= 0xD800 && c <= 0xDFFF) || c > 0x10FFFF) c = kReplacement;
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

bool is_py_space(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_py_decimal(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const auto* end = tables::kDecimalDigits + tables::kDecimalDigitsCount;
  const auto* it = std::upper_bound(tables::kDecimalDigits, end, c,
                                    [](char32_t v, const tables::Range& r) { return v < r.lo; });
  return it != tables::kDecimalDigits && c <= (it - 1)->hi;
}

int combining_class(char32_t c) {
  if (c < 0x300) return 0;
  const auto* end = tables::kCcc + tables::kCccCount;
  const auto* it =
      std::upper_bound(tables::kCcc, end, c, [](char32_t v, const tables::CccRange& r) { return v < r.lo; });
  return (it != tables::kCcc && c <= (it - 1)->hi) ? (it - 1)->ccc : 0;
}

namespace {

// Hangul syllable arithmetic (Unicode §3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr int kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

const tables::Decomposition* find_decomposition(char32_t c) {
  const auto* end = tables::kDecomp + tables::kDecompCount;
  const auto* it = std::lower_bound(tables::kDecomp, end, c,
                                    [](const tables::Decomposition& d, char32_t v) { return d.cp < v; });
  return (it != end && it->cp == c) ? it : nullptr;
}

void decompose(char32_t c, std::u32string& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const int s = static_cast<int>(c - kSBase);
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  const tables::Decomposition* d = c >= 0xC0 ? find_decomposition(c) : nullptr;
  if (!d) {
    out.push_back(c);
    return;
  }
  decompose(d->first, out);
  if (d->second) decompose(d->second, out);
}

const std::unordered_map<uint64_t, char32_t>& composition_map() {
  static const std::unordered_map<uint64_t, char32_t> m = [] {
    std::unordered_map<uint64_t, char32_t> r;
    for (size_t i = 0; i < tables::kDecompCount; ++i) {
      const auto& d = tables::kDecomp[i];
      if (d.composes) r.emplace((static_cast<uint64_t>(d.first) << 32) | d.second, d.cp);
    }
    return r;
  }();
  return m;
}

// The primary composite of (a, b), or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto& m = composition_map();
  const auto it = m.find((static_cast<uint64_t>(a) << 32) | b);
  return it == m.end() ? 0 : it->second;
}

}  // namespace

std::u32string nfc(std::u32string_view s) {
  if (std::all_of(s.begin(), s.end(), [](char32_t c) { return c < 0x300; })) return std::u32string(s);
  std::u32string d;
  d.reserve(s.size() + 8);
  for (char32_t c : s) decompose(c, d);
  // Canonical ordering: stable sort of every run of non-starters by combining class.
  for (size_t i = 0; i < d.size();) {
    if (combining_class(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && combining_class(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + static_cast<std::ptrdiff_t>(i), d.begin() + static_cast<std::ptrdiff_t>(j),
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  // Canonical composition.
  if (d.empty()) return d;
  size_t starter_pos = 0, out_pos = 1;
  int last_class = combining_class(d[0]);
  if (last_class != 0) last_class = 256;  // no starter yet: nothing may compose onto d[0]
  for (size_t i = 1; i < d.size(); ++i) {
    const char32_t c = d[i];
    const int cc = combining_class(c);
    const char32_t comp = compose(d[starter_pos], c);
    if (comp && (last_class < cc || last_class == 0)) {
      d[starter_pos] = comp;
      continue;
    }
    if (cc == 0) starter_pos = out_pos;
    last_class = cc;
    d[out_pos++] = c;
  }
  d.resize(out_pos);
  return d;
}

}  // namespace wan::text
