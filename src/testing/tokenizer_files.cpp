// Stand-in UMT5 tokenizer files: a hand-serialised SentencePiece model and the matching Hugging Face
// JSON files. Protobuf wire format: each field is a varint key (field << 3 | wire type) followed by a
// varint (type 0), 4 little-endian bytes (type 5, float) or a varint length and bytes (type 2).
#include "testing/tokenizer_files.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "testing/text_files.h"

namespace wan::gen {
namespace {

using json = nlohmann::ordered_json;

// Word pieces, most frequent first (a higher score wins in the unigram segmentation).
constexpr const char* kWords[] = {
    "the",     "a",         "of",        "and",      "in",         "to",         "is",       "on",        "with",
    "at",      "by",        "for",       "from",     "an",         "it",         "its",      "as",        "that",
    "this",    "are",       "cat",       "dog",      "man",        "woman",      "girl",     "boy",       "bird",
    "fish",    "horse",     "car",       "city",     "street",     "water",      "sea",      "sky",       "sun",
    "moon",    "tree",      "forest",    "river",    "mountain",   "snow",       "rain",     "light",     "night",
    "day",     "morning",   "sunset",    "cloud",    "field",      "flower",     "grass",    "house",     "room",
    "window",  "table",     "chair",     "road",     "beach",      "wave",       "red",      "blue",      "green",
    "white",   "black",     "yellow",    "golden",   "small",      "large",      "old",      "young",     "happy",
    "slow",    "fast",      "soft",      "bright",   "dark",       "warm",       "cold",     "beautiful", "walks",
    "runs",    "sits",      "flies",     "swims",    "plays",      "looks",      "holds",    "moves",     "jumps",
    "walking", "running",   "sitting",   "flying",   "playing",    "dancing",    "standing", "looking",   "camera",
    "shot",    "close",     "up",        "view",     "background", "foreground", "scene",    "video",     "motion",
    "style",   "cinematic", "realistic", "detailed", "quality",    "frame",      "color",    "colors",    "over",
    "under",   "into",      "through",   "front",    "behind",     "near",       "while",    "his",       "her",
    "their",   "one",       "two",       "three",
};
// Subword continuations (no word-start marker).
constexpr const char* kSuffixes[] = {"s",  "es", "ed", "ing", "er", "est", "ly", "tion", "al", "en",
                                     "re", "in", "on", "an",  "at", "or",  "ar", "le",   "th", "st"};

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, int field, int wire) { put_varint(out, (static_cast<uint64_t>(field) << 3) | wire); }
// int32 fields encode negative values as 10-byte two's-complement varints.
void put_int(std::string& out, int field, int64_t v) {
  put_key(out, field, 0);
  put_varint(out, static_cast<uint64_t>(v));
}
void put_bool(std::string& out, int field, bool v) { put_int(out, field, v ? 1 : 0); }
void put_float(std::string& out, int field, float v) {
  put_key(out, field, 5);
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
}
void put_bytes(std::string& out, int field, const std::string& s) {
  put_key(out, field, 2);
  put_varint(out, s.size());
  out += s;
}

const std::string kMeta = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

std::string extra_id(int k) { return "<extra_id_" + std::to_string(k) + ">"; }

json sentinel_list(int extra_ids) {
  json a = json::array();
  for (int k = 0; k < extra_ids; ++k) a.push_back(extra_id(k));
  return a;
}

json metaspace() {
  return {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "always"}, {"split", true}};
}

}  // namespace

std::vector<SpmPiece> tokenizer_pieces() {
  std::vector<SpmPiece> p;
  p.push_back({"<pad>", 0.f, PieceType::Control});
  p.push_back({"</s>", 0.f, PieceType::Control});
  p.push_back({"<unk>", 0.f, PieceType::Unknown});
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    p.push_back({buf, 0.f, PieceType::Byte});
  }
  p.push_back({kMeta, -3.0f, PieceType::Normal});
  int rank = 0;
  for (const char* w : kWords) p.push_back({kMeta + w, -4.0f - 0.01f * rank++, PieceType::Normal});
  rank = 0;
  for (const char* s : kSuffixes) p.push_back({s, -6.0f - 0.01f * rank++, PieceType::Normal});
  std::set<std::string> seen;
  for (const SpmPiece& x : p) seen.insert(x.piece);
  for (int c = 0x21; c <= 0x7E; ++c) {
    std::string s(1, static_cast<char>(c));
    if (seen.insert(s).second) p.push_back({s, -8.0f - 0.001f * (c - 0x21), PieceType::Normal});
  }
  // Every piece must be unique: SentencePiece refuses a model with duplicates.
  std::set<std::string> uniq;
  for (const SpmPiece& x : p) WAN_ASSERT(uniq.insert(x.piece).second, "duplicate tokenizer piece ", x.piece);
  return p;
}

int tokenizer_id_count() { return static_cast<int>(tokenizer_pieces().size()) + kUmt5ExtraIds; }

std::string spm_model_proto(const std::vector<SpmPiece>& pieces) {
  std::string model;
  for (const SpmPiece& x : pieces) {
    std::string m;
    put_bytes(m, 1, x.piece);
    put_float(m, 2, x.score);
    put_int(m, 3, static_cast<int>(x.type));
    put_bytes(model, 1, m);
  }
  std::string trainer;                                       // TrainerSpec
  put_int(trainer, 3, 1);                                    // model_type = UNIGRAM
  put_int(trainer, 4, static_cast<int64_t>(pieces.size()));  // vocab_size
  put_bool(trainer, 35, true);                               // byte_fallback
  put_int(trainer, 40, 2);                                   // unk_id
  put_int(trainer, 41, -1);                                  // bos_id (UMT5 has no BOS)
  put_int(trainer, 42, 1);                                   // eos_id
  put_int(trainer, 43, 0);                                   // pad_id
  put_bytes(trainer, 45, "<unk>");
  put_bytes(trainer, 46, "<s>");
  put_bytes(trainer, 47, "</s>");
  put_bytes(trainer, 48, "<pad>");
  put_bytes(model, 2, trainer);
  std::string norm;  // NormalizerSpec: no character mapping, whitespace handling as T5
  put_bytes(norm, 1, "identity");
  put_bool(norm, 3, true);  // add_dummy_prefix
  put_bool(norm, 4, true);  // remove_extra_whitespaces
  put_bool(norm, 5, true);  // escape_whitespaces
  put_bytes(model, 3, norm);
  return model;
}

std::string tokenizer_json(const std::vector<SpmPiece>& pieces, int extra_ids) {
  const int n = static_cast<int>(pieces.size());
  json added = json::array();
  auto added_token = [](int id, const std::string& content) {
    return json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  for (int i = 0; i < n; ++i)
    if (pieces[i].type == PieceType::Control || pieces[i].type == PieceType::Unknown)
      added.push_back(added_token(i, pieces[i].piece));
  for (int id = n; id < n + extra_ids; ++id) added.push_back(added_token(id, extra_id(n + extra_ids - 1 - id)));

  json vocab = json::array();
  for (const SpmPiece& x : pieces) vocab.push_back(json::array({x.piece, x.score}));
  for (int id = n; id < n + extra_ids; ++id) vocab.push_back(json::array({extra_id(n + extra_ids - 1 - id), 0.0}));

  json seqA = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  json seqB = {{"Sequence", {{"id", "B"}, {"type_id", 0}}}};
  json eos = {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}};
  json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", json::array({{{"type", "WhitespaceSplit"}}, metaspace()})}};
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", json::array({seqA, eos})},
                         {"pair", json::array({seqA, eos, seqB, eos})},
                         {"special_tokens", {{"</s>", {{"id", "</s>"}, {"ids", {1}}, {"tokens", {"</s>"}}}}}}};
  // Byte pieces first become bytes (so "<0xE7><0x8C><0xAB>" decodes to one character), then U+2581 a space.
  j["decoder"] = {{"type", "Sequence"}, {"decoders", json::array({{{"type", "ByteFallback"}}, metaspace()})}};
  j["model"] = {{"type", "Unigram"}, {"unk_id", 2}, {"vocab", vocab}, {"byte_fallback", true}};
  return j.dump(2) + "\n";
}

std::string tokenizer_config_json(int extra_ids) {
  json j;
  j["additional_special_tokens"] = sentinel_list(extra_ids);
  j["clean_up_tokenization_spaces"] = true;
  j["eos_token"] = "</s>";
  j["extra_ids"] = extra_ids;
  j["legacy"] = true;
  j["pad_token"] = "<pad>";
  j["sp_model_kwargs"] = json::object();
  j["tokenizer_class"] = "T5Tokenizer";
  j["unk_token"] = "<unk>";
  return j.dump(2) + "\n";
}

std::string special_tokens_map_json(int extra_ids) {
  json j;
  j["additional_special_tokens"] = sentinel_list(extra_ids);
  j["eos_token"] = "</s>";
  j["pad_token"] = "<pad>";
  j["unk_token"] = "<unk>";
  return j.dump(2) + "\n";
}

std::vector<std::string> write_tokenizer_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::vector<SpmPiece> pieces = tokenizer_pieces();
  const std::pair<const char*, std::string> files[] = {
      {"spiece.model", spm_model_proto(pieces)},
      {"tokenizer.json", tokenizer_json(pieces, kUmt5ExtraIds)},
      {"tokenizer_config.json", tokenizer_config_json(kUmt5ExtraIds)},
      {"special_tokens_map.json", special_tokens_map_json(kUmt5ExtraIds)},
  };
  std::vector<std::string> written;
  for (const auto& [name, content] : files) {
    std::string p = (fs::path(dir) / name).string();
    write_text_file(p, content);
    written.push_back(p);
  }
  return written;
}

}  // namespace wan::gen
