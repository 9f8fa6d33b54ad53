// The text normalizer of the tokenizers library for SentencePiece models ("Precompiled"): the
// model's precompiled character map (a Darts double-array trie of UTF-8 keys + replacement strings,
// NFKC-based for T5 models) applied the way tokenizers applies it, which is NOT how SentencePiece
// applies it:
//   for each extended grapheme cluster (UAX #29): if it is shorter than 6 bytes and some trie key
//   is a prefix of it, the WHOLE cluster becomes the replacement of the SHORTEST such key (the rest
//   of the cluster is dropped); otherwise each character is replaced on its own (or kept).
// SentencePiece instead takes the longest key at every position. The two differ on clusters such
// as "…" + U+0338 (tokenizers drops the mark) or Hangul jamo L+V (SentencePiece composes them).
// The Wan reference tokenizes with tokenizers, so the engine follows it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace wan::text {

// Boundaries of the extended grapheme clusters of s: 0, ..., s.size() (UAX #29 incl. GB9c and
// GB11; properties from the `regex` module, see text/tables.h).
std::vector<size_t> grapheme_boundaries(std::u32string_view s);

class PrecompiledCharsmap {
 public:
  PrecompiledCharsmap() = default;
  // blob = NormalizerSpec.precompiled_charsmap: u32 LE trie size, trie units, '\0'-separated
  // replacement strings. Empty blob = identity. Throws wan::Error (naming `source`) if malformed.
  static PrecompiledCharsmap from_blob(std::string blob, const std::string& source);
  bool empty() const { return units_.empty(); }
  // The replacement of the shortest trie key that is a prefix of chunk (UTF-8), if any.
  std::optional<std::string_view> transform(std::string_view chunk) const;
  // tokenizers' Precompiled normalization of a UTF-8 string.
  std::string normalize(std::string_view utf8) const;

 private:
  std::vector<uint32_t> units_;
  std::string normalized_;
};

// NormalizerSpec.precompiled_charsmap of a serialized SentencePiece ModelProto ("" when absent).
// Throws wan::Error (naming `source`) on a malformed protobuf.
std::string spm_model_charsmap(std::string_view model_bytes, const std::string& source);

// Standard base64 (tokenizer.json stores the charsmap that way). Throws on invalid input.
std::string base64_decode(std::string_view s);

}  // namespace wan::text
