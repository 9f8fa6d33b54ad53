// Fuzz target: the tokenizer files and prompts (text/tokenizer.h). The first byte picks what the
// input is:
//   '{'  tokenizer.json, next to a fixed valid spiece.model (the stand-in make-checkpoint writes, so
//        seeds built from the same pieces get past the piece-by-piece comparison);
//   0x0A spiece.model (a serialised ModelProto starts with field 1, the pieces), alone in its folder;
//   else a prompt, encoded by that fixed tokenizer.
// A tokenizer that loads must encode a few fixed prompts (special tokens, non-ASCII, unknown
// characters) into exactly max_length ids below vocab_size, ending its real tokens with EOS.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_util.h"
#include "testing/tokenizer_files.h"
#include "text/tokenizer.h"

namespace {

using namespace wan;

constexpr int kMaxLength = 48;

void check_encoding(const text::Tokenizer& tok, std::string_view prompt) {
  const text::Encoding e = tok.encode(prompt);
  fuzz::require(e.ids.size() == kMaxLength && e.mask.size() == kMaxLength, "max_length ids and mask");
  fuzz::require(e.length >= 1 && e.length <= kMaxLength, "length within 1..max_length");
  fuzz::require(e.ids[static_cast<size_t>(e.length - 1)] == tok.eos_id(), "last real token is EOS");
  for (int32_t id : e.ids) fuzz::require(id >= 0 && id < tok.vocab_size(), "ids below vocab_size");
}

void check_loaded(const std::string& path) {
  const text::Tokenizer tok = text::Tokenizer::load(path, {kMaxLength});
  for (std::string_view p : {"a cat <extra_id_0> runs</s> over the river", "\xC3\x9C\x6E\xC3\xAF \xE2\x80\xA6 \xEF\xBC\xA1",
                             "\xE7\x8C\xAB \xF0\x9F\x90\x88\xE2\x80\x8D\xE2\xAC\x9B", ""})
    check_encoding(tok, p);
}

struct Folders {
  std::filesystem::path json_dir, model_dir;
  text::Tokenizer fixed;
};

const Folders& folders() {
  static const Folders f = [] {
    Folders x;
    x.json_dir = fuzz::scratch_dir() / "tok_json";
    x.model_dir = fuzz::scratch_dir() / "tok_model";
    const auto fixed_dir = fuzz::scratch_dir() / "tok_fixed";
    for (const auto& d : {x.json_dir, x.model_dir, fixed_dir}) std::filesystem::create_directories(d);
    const std::string model = gen::spm_model_proto(gen::tokenizer_pieces());
    fuzz::write_file(x.json_dir / "spiece.model", model.data(), model.size());
    gen::write_tokenizer_dir(fixed_dir.string());
    x.fixed = text::Tokenizer::load(fixed_dir.string(), {kMaxLength});
    return x;
  }();
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Folders& f = folders();
  if (size > 0 && data[0] == '{') {
    fuzz::write_file(f.json_dir / "tokenizer.json", data, size);
    fuzz::accepts([&] { check_loaded(f.json_dir.string()); });
  } else if (size > 0 && data[0] == 0x0A) {
    fuzz::write_file(f.model_dir / "spiece.model", data, size);
    fuzz::accepts([&] { check_loaded(f.model_dir.string()); });
  } else {
    fuzz::accepts([&] { check_encoding(f.fixed, std::string_view(reinterpret_cast<const char*>(data), size)); });
  }
  return 0;
}
