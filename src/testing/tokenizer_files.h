// A small, valid stand-in for the google/umt5-xxl tokenizer folder (the real vocabulary cannot be
// downloaded): a SentencePiece UNIGRAM model (spiece.model, a hand-serialised ModelProto) and the
// Hugging Face files describing the same vocabulary (tokenizer.json, tokenizer_config.json,
// special_tokens_map.json).
// Invariants: ids follow UMT5 (pad 0, eos 1, unk 2, no bos), the 256 byte pieces <0x00>..<0xFF> are
// present (byte_fallback), the <extra_id_k> sentinels follow the SentencePiece pieces in reverse
// order (<extra_id_0> has the highest id) as T5 tokenizers lay them out, and the output is a pure
// function of nothing (byte-identical on every run).
#pragma once
#include <string>
#include <vector>

namespace wan::gen {

// SentencePiece piece types (sentencepiece_model.proto ModelProto.SentencePiece.Type).
enum class PieceType : int { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

struct SpmPiece {
  std::string piece;  // UTF-8; U+2581 marks a word start
  float score = 0.f;
  PieceType type = PieceType::Normal;
};

constexpr int kUmt5ExtraIds = 300;  // <extra_id_0> .. <extra_id_299>

// The deterministic vocabulary: control/unknown pieces, 256 byte pieces, common English word
// pieces, suffixes and single printable ASCII characters.
std::vector<SpmPiece> tokenizer_pieces();
// Number of token ids the tokenizer can produce (pieces + sentinels).
int tokenizer_id_count();

// Serialised sentencepiece ModelProto for the pieces.
std::string spm_model_proto(const std::vector<SpmPiece>& pieces);
std::string tokenizer_json(const std::vector<SpmPiece>& pieces, int extra_ids);
std::string tokenizer_config_json(int extra_ids);
std::string special_tokens_map_json(int extra_ids);

// Writes spiece.model, tokenizer.json, tokenizer_config.json and special_tokens_map.json into dir
// (which must exist). Returns the paths written.
std::vector<std::string> write_tokenizer_dir(const std::string& dir);

}  // namespace wan::gen
