// UMT5 tokenizer: the model and vocabulary through libsentencepiece, encoding as transformers 5's
// T5 tokenizer does it (see tokenizer.h for the pipeline and the reasons).
#include "text/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_limits.h"
#include "text/clean.h"
#include "text/precompiled.h"
#include "text/unigram.h"
#include "text/unicode.h"

#if defined(WAN_HAVE_SENTENCEPIECE)
#include <sentencepiece_processor.h>
#endif

namespace wan::text {

namespace fs = std::filesystem;

struct AddedToken {
  std::string content;
  int id;
};

struct Tokenizer::Impl {
  std::string model_path;
  PrecompiledCharsmap charsmap;
  UnigramModel unigram;
  int max_length = 512;
  bool byte_fallback = false;
  int pieces = 0;
  int vocab = 0;
  int pad = 0, eos = 1, unk = 2;
  std::vector<AddedToken> specials;  // sorted by content length, longest first
  bool special_first_byte[256] = {};  // quick filter: can a special token start with this byte?

  std::vector<int32_t> encode_segment(std::string_view text) const;
};

namespace {

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  WAN_CHECK(f.good(), p.string(), ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_json_limited(ss.str(), p.string());
}

// A token id: an integer in [0, 2^31 - 1), so that "largest id + 1" (the vocabulary size) is an int too.
// (A float such as 1e300 does not convert to int at all.)
int token_id(const nlohmann::json& v, const fs::path& file) {
  const bool ok = v.is_number_unsigned() ? v.get<uint64_t>() < INT32_MAX
                                         : v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < INT32_MAX;
  WAN_CHECK(ok, file.string(), ": token id ", v.dump(), " is not an integer in [0, 2147483647)");
  return static_cast<int>(v.get<int64_t>());
}

// Rust's char::is_whitespace (Unicode White_Space), what WhitespaceSplit splits on.
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace

// transformers 5's T5 pipeline for text between special tokens: Precompiled normalizer,
// WhitespaceSplit, Metaspace("▁", prepend always, split), Unigram on each piece.
std::vector<int32_t> Tokenizer::Impl::encode_segment(std::string_view text) const {
  static constexpr std::string_view kMeta = "\xE2\x96\x81";  // U+2581
  const std::u32string norm = utf8_decode(charsmap.normalize(text));
  std::vector<int32_t> out;
  std::string word;
  for (size_t i = 0; i <= norm.size(); ++i) {
    if (i < norm.size() && !is_white_space(norm[i])) {
      utf8_append(word, norm[i]);
      continue;
    }
    if (word.empty()) continue;
    if (!std::string_view(word).starts_with(kMeta)) word.insert(0, kMeta);
    // Split before every U+2581 (MergedWithNext): "▁a▁▁b" -> "▁a", "▁", "▁b".
    size_t b = 0;
    while (b < word.size()) {
      size_t e = word.find(kMeta, b + kMeta.size());
      if (e == std::string::npos) e = word.size();
      unigram.encode(std::string_view(word).substr(b, e - b), out);
      b = e;
    }
    word.clear();
  }
  return out;
}

#if defined(WAN_HAVE_SENTENCEPIECE)

Tokenizer Tokenizer::load(const std::string& path, const TokenizerOptions& opts) {
  WAN_CHECK(opts.max_length >= 1, "tokenizer max_length must be >= 1 (got ", opts.max_length, ")");
  auto impl = std::make_shared<Impl>();
  const fs::path p(path);
  fs::path dir;
  if (fs::is_directory(p)) {
    dir = p;
    impl->model_path = (p / "spiece.model").string();
    WAN_CHECK(fs::is_regular_file(impl->model_path), path,
              ": no spiece.model in this folder (expected a diffusers tokenizer/ or google/umt5-xxl/ folder)");
  } else {
    WAN_CHECK(fs::is_regular_file(p), path, ": tokenizer file or folder not found");
    impl->model_path = p.string();
  }
  // libsentencepiece validates the model and provides the vocabulary.
  std::string model_bytes;
  {
    std::ifstream f(impl->model_path, std::ios::binary);
    WAN_CHECK(f.good(), impl->model_path, ": cannot open");
    model_bytes.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  sentencepiece::SentencePieceProcessor sp;
  const auto st = sp.LoadFromSerializedProto(model_bytes);
  WAN_CHECK(st.ok(), impl->model_path, ": not a SentencePiece model: ", st.ToString());
  impl->pieces = sp.GetPieceSize();
  impl->unk = sp.unk_id();
  impl->pad = sp.pad_id() >= 0 ? sp.pad_id() : 0;
  impl->eos = sp.eos_id() >= 0 ? sp.eos_id() : 1;
  std::vector<UnigramModel::Piece> vocab(static_cast<size_t>(impl->pieces));
  for (int i = 0; i < impl->pieces; ++i) vocab[static_cast<size_t>(i)] = {sp.IdToPiece(i), static_cast<double>(sp.GetScore(i))};

  // Added tokens, byte fallback, vocabulary scores and the character map: from tokenizer.json when
  // the folder has one (what transformers loads), else the way transformers converts spiece.model.
  bool json_byte_fallback = false;
  std::string charsmap;
  const fs::path tj = dir / "tokenizer.json";
  const bool has_json = !dir.empty() && fs::is_regular_file(tj);
  std::map<std::string, int> specials;
  if (has_json) {
    const nlohmann::json j = read_json(tj);
    try {
      const nlohmann::json& m = j.at("model");
      WAN_CHECK(m.value("type", "Unigram") == "Unigram", tj.string(), ": model type ", m.value("type", ""),
                " is not Unigram");
      if (m.contains("byte_fallback") && m["byte_fallback"].is_boolean()) json_byte_fallback = m["byte_fallback"].get<bool>();
      // The scores transformers uses; the pieces must be spiece.model's.
      const auto& jv = m.at("vocab");
      for (size_t i = 0; i < jv.size() && i < vocab.size(); ++i) {
        WAN_CHECK(jv[i].at(0).get<std::string>() == vocab[i].text, tj.string(), ": piece ", i, " '",
                  jv[i].at(0).get<std::string>(), "' differs from spiece.model's '", vocab[i].text, "'");
        vocab[i].score = jv[i].at(1).get<double>();
      }
      for (size_t i = vocab.size(); i < jv.size(); ++i) vocab.push_back({jv[i].at(0).get<std::string>(), jv[i].at(1).get<double>()});
      if (j.contains("added_tokens"))
        for (const auto& t : j["added_tokens"])
          if (t.value("special", false)) specials[t.at("content").get<std::string>()] = token_id(t.at("id"), tj);
      // transformers 5 keeps only a Precompiled normalizer (none when the file has none).
      if (j.contains("normalizer") && j["normalizer"].is_object()) {
        const nlohmann::json& nz = j["normalizer"];
        std::vector<nlohmann::json> list;
        if (nz.value("type", "") == "Sequence")
          list = nz.at("normalizers").get<std::vector<nlohmann::json>>();
        else
          list.push_back(nz);
        for (const auto& x : list)
          if (x.value("type", "") == "Precompiled" && x.contains("precompiled_charsmap") &&
              x["precompiled_charsmap"].is_string()) {
            charsmap = base64_decode(x["precompiled_charsmap"].get<std::string>());
            break;
          }
      }
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      WAN_THROW(tj.string(), ": unexpected content: ", e.what());
    }
  } else {
    int extra_ids = 100;  // T5Tokenizer's default
    const fs::path tc = dir / "tokenizer_config.json";
    if (!dir.empty() && fs::is_regular_file(tc)) {
      const nlohmann::json j = read_json(tc);
      if (j.contains("extra_ids") && j["extra_ids"].is_number_integer()) extra_ids = j["extra_ids"].get<int>();
    }
    WAN_CHECK(extra_ids >= 0 && extra_ids <= 100000, tc.string(), ": bad extra_ids ", extra_ids);
    for (int i = 0; i < impl->pieces; ++i)
      if (sp.IsControl(i) || sp.IsUnknown(i)) specials[sp.IdToPiece(i)] = i;
    for (int i = 0; i < extra_ids; ++i) {
      const std::string t = "<extra_id_" + std::to_string(i) + ">";
      specials[t] = impl->pieces + extra_ids - 1 - i;
    }
    vocab.resize(static_cast<size_t>(impl->pieces + extra_ids));
    for (const auto& [content, id] : specials)
      if (id >= impl->pieces) vocab[static_cast<size_t>(id)] = {content, 0.0};
    charsmap = spm_model_charsmap(model_bytes, impl->model_path);
  }
  for (const auto& [content, id] : specials)
    if (!content.empty()) {
      WAN_CHECK(id >= 0, "special token '", content, "' has a negative id");
      impl->specials.push_back({content, id});
      impl->special_first_byte[static_cast<unsigned char>(content[0])] = true;
    }
  std::stable_sort(impl->specials.begin(), impl->specials.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  impl->vocab = static_cast<int>(vocab.size());
  for (const auto& t : impl->specials) impl->vocab = std::max(impl->vocab, t.id + 1);

  switch (opts.byte_fallback) {
    case TokenizerOptions::ByteFallback::On: impl->byte_fallback = true; break;
    case TokenizerOptions::ByteFallback::Off: impl->byte_fallback = false; break;
    case TokenizerOptions::ByteFallback::Auto: impl->byte_fallback = has_json && json_byte_fallback; break;
  }
  impl->charsmap = PrecompiledCharsmap::from_blob(std::move(charsmap), impl->model_path);
  impl->unigram = UnigramModel(std::move(vocab), impl->unk, impl->byte_fallback);
  impl->max_length = opts.max_length;
  Tokenizer t;
  t.impl_ = std::move(impl);
  return t;
}

#else  // !WAN_HAVE_SENTENCEPIECE

Tokenizer Tokenizer::load(const std::string& path, const TokenizerOptions&) {
  WAN_THROW(path, ": cannot load the UMT5 tokenizer: wan was built without libsentencepiece "
                  "(install libsentencepiece-dev and re-run cmake)");
}

#endif

std::vector<int32_t> Tokenizer::tokenize(std::string_view text) const {
  WAN_ASSERT(impl_, "tokenizer not loaded");
  std::vector<int32_t> out;
  size_t seg = 0, i = 0;
  while (i < text.size()) {
    // Leftmost-longest special token at i (the list is sorted longest first).
    const AddedToken* hit = nullptr;
    if (impl_->special_first_byte[static_cast<unsigned char>(text[i])])
      for (const auto& t : impl_->specials)
        if (text.compare(i, t.content.size(), t.content) == 0) {
          hit = &t;
          break;
        }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > seg) {
      const auto ids = impl_->encode_segment(text.substr(seg, i - seg));
      out.insert(out.end(), ids.begin(), ids.end());
    }
    out.push_back(hit->id);
    i += hit->content.size();
    seg = i;
  }
  if (seg < text.size()) {
    const auto ids = impl_->encode_segment(text.substr(seg));
    out.insert(out.end(), ids.begin(), ids.end());
  }
  return out;
}

Encoding Tokenizer::encode(std::string_view prompt) const {
  WAN_ASSERT(impl_, "tokenizer not loaded");
  std::vector<int32_t> ids = tokenize(clean_prompt(prompt));
  const size_t keep = static_cast<size_t>(impl_->max_length - 1);
  Encoding e;
  if (ids.size() > keep) {
    e.dropped = static_cast<int>(ids.size() - keep);
    ids.resize(keep);
  }
  ids.push_back(impl_->eos);
  e.length = static_cast<int>(ids.size());
  e.ids = std::move(ids);
  e.ids.resize(static_cast<size_t>(impl_->max_length), impl_->pad);
  e.mask.assign(static_cast<size_t>(impl_->max_length), 0);
  std::fill(e.mask.begin(), e.mask.begin() + e.length, 1);
  return e;
}

int Tokenizer::vocab_size() const { return impl_->vocab; }
int Tokenizer::max_length() const { return impl_->max_length; }
bool Tokenizer::byte_fallback() const { return impl_->byte_fallback; }
int Tokenizer::pad_id() const { return impl_->pad; }
int Tokenizer::eos_id() const { return impl_->eos; }
int Tokenizer::unk_id() const { return impl_->unk; }

}  // namespace wan::text
