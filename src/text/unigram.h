// Unigram segmentation as the tokenizers library does it (models/unigram, encode_optimized):
// Viterbi over every vocabulary string that starts at each character, scores summed in float64,
// an unknown node (score = min vocabulary score - 10) covering one character wherever no
// single-character piece exists, consecutive unknowns fused into one string, which then becomes
// its UTF-8 byte pieces "<0xNN>" (byte fallback) or the unknown id.
// Why not SentencePiece's own encoder: it sums in float32 (near-ties may resolve differently) and
// never matches control/byte piece strings, while tokenizers matches every vocabulary string.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace wan::text {

class UnigramModel {
 public:
  struct Piece {
    std::string text;  // UTF-8, U+2581 for a word start
    double score = 0.0;
  };
  UnigramModel() = default;
  // vocab[id]; unk_id must index it.
  UnigramModel(std::vector<Piece> vocab, int unk_id, bool byte_fallback);

  // Appends the ids of one pre-token (UTF-8; "▁word" after Metaspace) to out.
  void encode(std::string_view pretoken, std::vector<int32_t>& out) const;

  bool byte_fallback() const { return byte_fallback_; }

 private:
  struct Entry {
    std::string text;
    int id;
  };
  std::vector<Entry> sorted_;   // by text, bytewise; the first id of a duplicated text is dropped
  std::vector<double> score_;   // by id
  double unk_score_ = 0.0;
  int unk_id_ = 0;
  bool byte_fallback_ = false;
  int byte_id_[256];            // "<0xNN>" ids, -1 when absent
  int find(std::string_view text) const;  // id or -1
};

}  // namespace wan::text
