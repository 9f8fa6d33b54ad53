// tokenizers' Precompiled normalizer: Darts trie lookup, grapheme clusters, and the SentencePiece
// model / base64 plumbing to get the character map (see precompiled.h).
#include "text/precompiled.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "text/tables.h"
#include "text/unicode.h"

namespace wan::text {

// ---------------------------------------------------------------------------------------------
// Grapheme clusters (UAX #29, extended)

namespace {

struct GProps {
  uint8_t gcb = tables::kGcbOther;
  bool ext_pict = false;
  uint8_t incb = tables::kIncbNone;
};

GProps gprops(char32_t c) {
  GProps p;
  if (c >= 0xAC00 && c <= 0xD7A3) {
    p.gcb = ((c - 0xAC00) % 28 == 0) ? tables::kGcbLV : tables::kGcbLVT;
    return p;
  }
  if (c >= 0x20 && c < 0x7F) return p;
  const auto* end = tables::kGrapheme + tables::kGraphemeCount;
  const auto* it = std::upper_bound(tables::kGrapheme, end, c,
                                    [](char32_t v, const tables::GraphemeRange& r) { return v < r.lo; });
  if (it != tables::kGrapheme && c <= (it - 1)->hi) {
    p.gcb = (it - 1)->gcb;
    p.ext_pict = (it - 1)->ext_pict != 0;
    p.incb = (it - 1)->incb;
  }
  return p;
}

bool is_control_like(uint8_t g) { return g == tables::kGcbControl || g == tables::kGcbCR || g == tables::kGcbLF; }

}  // namespace

std::vector<size_t> grapheme_boundaries(std::u32string_view s) {
  using namespace tables;
  std::vector<size_t> b{0};
  if (s.empty()) return b;
  GProps prev = gprops(s[0]);
  // State over the text before the current position.
  bool ep_ext = prev.ext_pict;           // ends with ExtPict Extend*
  bool ep_ext_before_prev = false;       // the same, one character earlier (for "... ZWJ x ExtPict")
  int ri_run = prev.gcb == kGcbRegionalIndicator ? 1 : 0;
  bool incb_cons = prev.incb == kIncbConsonant, incb_link = false;
  for (size_t i = 1; i < s.size(); ++i) {
    const GProps cur = gprops(s[i]);
    bool brk;
    if (prev.gcb == kGcbCR && cur.gcb == kGcbLF) brk = false;                                    // GB3
    else if (is_control_like(prev.gcb) || is_control_like(cur.gcb)) brk = true;                   // GB4, GB5
    else if (prev.gcb == kGcbL && (cur.gcb == kGcbL || cur.gcb == kGcbV || cur.gcb == kGcbLV || cur.gcb == kGcbLVT))
      brk = false;                                                                                // GB6
    else if ((prev.gcb == kGcbLV || prev.gcb == kGcbV) && (cur.gcb == kGcbV || cur.gcb == kGcbT)) brk = false;  // GB7
    else if ((prev.gcb == kGcbLVT || prev.gcb == kGcbT) && cur.gcb == kGcbT) brk = false;        // GB8
    else if (cur.gcb == kGcbExtend || cur.gcb == kGcbZWJ || cur.gcb == kGcbSpacingMark) brk = false;  // GB9, GB9a
    else if (prev.gcb == kGcbPrepend) brk = false;                                                // GB9b
    else if (cur.incb == kIncbConsonant && incb_cons && incb_link) brk = false;                   // GB9c
    else if (prev.gcb == kGcbZWJ && cur.ext_pict && ep_ext_before_prev) brk = false;              // GB11
    else if (prev.gcb == kGcbRegionalIndicator && cur.gcb == kGcbRegionalIndicator && ri_run % 2 == 1)
      brk = false;                                                                                // GB12, GB13
    else brk = true;                                                                              // GB999
    if (brk) b.push_back(i);
    // Advance the state past s[i].
    ep_ext_before_prev = ep_ext;
    ep_ext = cur.ext_pict || (ep_ext && cur.gcb == kGcbExtend);
    ri_run = cur.gcb == kGcbRegionalIndicator ? ri_run + 1 : 0;
    if (cur.incb == kIncbConsonant) {
      incb_cons = true;
      incb_link = false;
    } else if (incb_cons && cur.incb == kIncbLinker) {
      incb_link = true;
    } else if (!(incb_cons && cur.incb == kIncbExtend)) {
      incb_cons = incb_link = false;
    }
    prev = cur;
  }
  b.push_back(s.size());
  return b;
}

// ---------------------------------------------------------------------------------------------
// Character map

namespace {

// Darts-clone double-array unit fields.
bool unit_has_leaf(uint32_t u) { return (u >> 8) & 1u; }
uint32_t unit_value(uint32_t u) { return u & ((1u << 31) - 1u); }
uint32_t unit_label(uint32_t u) { return u & ((1u << 31) | 0xFFu); }
uint32_t unit_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

}  // namespace

PrecompiledCharsmap PrecompiledCharsmap::from_blob(std::string blob, const std::string& source) {
  PrecompiledCharsmap m;
  if (blob.empty()) return m;
  WAN_CHECK(blob.size() >= 4, source, ": precompiled charsmap too short (", blob.size(), " bytes)");
  uint32_t trie_bytes;
  std::memcpy(&trie_bytes, blob.data(), 4);  // little endian (x86/ARM hosts)
  WAN_CHECK(trie_bytes % 4 == 0 && trie_bytes >= 4 && trie_bytes <= blob.size() - 4, source,
            ": precompiled charsmap has a bad trie size ", trie_bytes);
  m.units_.resize(trie_bytes / 4);
  std::memcpy(m.units_.data(), blob.data() + 4, trie_bytes);
  m.normalized_ = blob.substr(4 + trie_bytes);
  return m;
}

std::optional<std::string_view> PrecompiledCharsmap::transform(std::string_view chunk) const {
  if (units_.empty()) return std::nullopt;
  const size_t n_units = units_.size();
  size_t pos = 0;
  uint32_t unit = units_[0];
  pos ^= unit_offset(unit);
  for (size_t i = 0; i < chunk.size(); ++i) {
    const auto c = static_cast<unsigned char>(chunk[i]);
    pos ^= c;
    if (pos >= n_units) return std::nullopt;
    unit = units_[pos];
    if (unit_label(unit) != c) return std::nullopt;
    pos ^= unit_offset(unit);
    if (pos >= n_units) return std::nullopt;
    if (unit_has_leaf(unit)) {
      // The first (shortest) key found decides, as in tokenizers.
      const size_t start = unit_value(units_[pos]);
      if (start >= normalized_.size()) return std::nullopt;
      const size_t end = normalized_.find('\0', start);
      return std::string_view(normalized_).substr(start, (end == std::string::npos ? normalized_.size() : end) - start);
    }
  }
  return std::nullopt;
}

std::string PrecompiledCharsmap::normalize(std::string_view utf8) const {
  if (units_.empty()) return std::string(utf8);
  const std::u32string s = utf8_decode(utf8);
  const std::vector<size_t> b = grapheme_boundaries(s);
  std::string out;
  out.reserve(utf8.size());
  std::string g, one;
  for (size_t k = 0; k + 1 < b.size(); ++k) {
    g = utf8_encode(std::u32string_view(s).substr(b[k], b[k + 1] - b[k]));
    if (g.size() < 6) {
      if (const auto r = transform(g)) {
        out += *r;
        continue;
      }
    }
    for (size_t i = b[k]; i < b[k + 1]; ++i) {
      one.clear();
      utf8_append(one, s[i]);
      if (const auto r = transform(one))
        out += *r;
      else
        out += one;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Protobuf (just enough to find ModelProto.normalizer_spec.precompiled_charsmap) and base64

namespace {

bool read_varint(std::string_view b, size_t* i, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*i >= b.size()) return false;
    const auto c = static_cast<unsigned char>(b[(*i)++]);
    *v |= static_cast<uint64_t>(c & 0x7F) << shift;
    if (c < 0x80) return true;
  }
  return false;
}

// Calls fn(field, wire_type, bytes-or-empty) for each field; false on malformed input.
template <typename Fn>
bool for_each_field(std::string_view b, Fn fn) {
  size_t i = 0;
  while (i < b.size()) {
    uint64_t key, v;
    if (!read_varint(b, &i, &key)) return false;
    const int wt = static_cast<int>(key & 7);
    const uint64_t field = key >> 3;
    if (wt == 0) {
      if (!read_varint(b, &i, &v)) return false;
    } else if (wt == 1 || wt == 5) {
      const size_t n = wt == 1 ? 8 : 4;
      if (b.size() - i < n) return false;
      i += n;
    } else if (wt == 2) {
      if (!read_varint(b, &i, &v) || v > b.size() - i) return false;
      if (!fn(field, b.substr(i, static_cast<size_t>(v)))) return true;  // fn asked to stop
      i += static_cast<size_t>(v);
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string spm_model_charsmap(std::string_view model, const std::string& source) {
  std::string_view spec;
  bool found_spec = false;
  const bool ok = for_each_field(model, [&](uint64_t field, std::string_view bytes) {
    if (field == 3) {  // ModelProto.normalizer_spec
      spec = bytes;
      found_spec = true;
    }
    return true;
  });
  WAN_CHECK(ok, source, ": malformed SentencePiece model (protobuf)");
  std::string charsmap;
  if (!found_spec) return charsmap;
  const bool ok2 = for_each_field(spec, [&](uint64_t field, std::string_view bytes) {
    if (field == 2) charsmap.assign(bytes);  // NormalizerSpec.precompiled_charsmap
    return true;
  });
  WAN_CHECK(ok2, source, ": malformed SentencePiece normalizer spec");
  return charsmap;
}

std::string base64_decode(std::string_view s) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    if (c == '=') break;
    const int v = val(c);
    WAN_CHECK(v >= 0, "invalid base64 character");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return out;
}

}  // namespace wan::text
