// The UMT5 tokenizer of the Wan reference (spec §4.3): prompt cleaning (text/clean.h), then the
// SentencePiece unigram model of google/umt5-xxl, EOS appended, truncated and right-padded to
// max_length (512), with the attention mask.
//
// Invariants: encode() never throws on any input bytes (invalid UTF-8 becomes U+FFFD); ids and
// mask have exactly max_length entries; the last real token is EOS, also after truncation.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace wan::text {

// The reference tokenizes with transformers (AutoTokenizer -> the `tokenizers` library), which does
// NOT give SentencePiece's own results on every input, so the engine reproduces transformers 5's T5
// pipeline: libsentencepiece loads and validates spiece.model and supplies the vocabulary, and
// encoding follows tokenizers step by step:
//   1. special added tokens ("<pad>", "</s>", "<unk>", "<extra_id_N>", or tokenizer.json's
//      "added_tokens" marked special) written literally in the text are split off first
//      (leftmost-longest) and become their ids;
//   2. each other piece: the Precompiled normalizer (text/precompiled.h; grapheme-cluster based,
//      unlike SentencePiece's), WhitespaceSplit, Metaspace ("▁" prepended, split before each "▁"),
//      and the Unigram Viterbi in float64 over every vocabulary string (text/unigram.h).
// Unknown characters: with byte fallback on, each byte of a run of unknown characters becomes a
// "<0xNN>" piece (as SentencePiece, and a tokenizer.json declaring "byte_fallback": true); with it
// off, the run becomes ONE <unk>. Auto (default) reads model.byte_fallback from tokenizer.json when
// the folder has one, and is off without it (transformers converts a bare T5 spiece.model without
// byte fallback). Caveat: transformers 5's T5Tokenizer always rebuilds its model with byte fallback
// off, whatever tokenizer.json says; transformers 4 (the Wan reference's version) honours the file.
// The tests compare with transformers 5 (off) and with the tokenizers library on a byte-fallback
// tokenizer.json (on), on fixed prompts and on thousands of random ones.

struct TokenizerOptions {
  int max_length = 512;
  enum class ByteFallback { Auto, On, Off };
  ByteFallback byte_fallback = ByteFallback::Auto;
};

struct Encoding {
  std::vector<int32_t> ids;   // [max_length]; pad id after `length`
  std::vector<int32_t> mask;  // [max_length]; 1 for the first `length` entries, then 0
  int length = 0;             // real tokens including the EOS (= seq_len of spec §4.3)
  int dropped = 0;            // tokens of the prompt cut off by the truncation (0: all kept)
};

class Tokenizer {
 public:
  // `path`: a folder with spiece.model (a diffusers `tokenizer/` or the official
  // `google/umt5-xxl/` folder; tokenizer.json / tokenizer_config.json are read when present), or
  // the .model file itself. Throws wan::Error naming the file on any problem, and when wan was
  // built without libsentencepiece.
  static Tokenizer load(const std::string& path, const TokenizerOptions& opts = {});

  // Cleans, tokenizes, appends EOS, truncates to max_length (keeping the EOS) and pads.
  Encoding encode(std::string_view prompt) const;
  // Token ids of already-cleaned text: special-token split + SentencePiece, no EOS, no truncation.
  std::vector<int32_t> tokenize(std::string_view text) const;

  int vocab_size() const;  // SentencePiece pieces + added tokens (largest id + 1)
  int max_length() const;
  bool byte_fallback() const;
  int pad_id() const;
  int eos_id() const;
  int unk_id() const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace wan::text
