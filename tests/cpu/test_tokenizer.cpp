// Prompt cleaning and the UMT5 tokenizer against the Python oracle (tools/make_text_fixtures.py):
// - committed cases (tests/fixtures/text/tokenizer_cases.json): the default negative prompt,
//   Chinese, emoji, unknown characters, over-long prompts, every ftfy fixer, HTML references,
//   Unicode whitespace, literal special tokens and mojibake; cleaned text and ids compared with
//   transformers (byte fallback off, as transformers 5 loads the folder) and with the tokenizers
//   library on a byte-fallback tokenizer.json (= SentencePiece itself);
// - fresh random prompts (new seed each run) built from the characters those paths care about,
//   sent through the oracle at run time; each cleaning stage is compared on its own first;
// - Auto byte-fallback detection, the folder without tokenizer.json, and the load errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "text/clean.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace wan::text;

namespace {

const std::string kTokDir = std::string(WAN_FIXTURES) + "/text/tokenizer";

json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return json::parse(f);
}

// ASCII-only and exact (JSON escapes), so that a failing prompt can be copied back.
std::string escaped(const std::string& s) { return json(s).dump(-1, ' ', true, json::error_handler_t::replace); }

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("wan_test_tokenizer_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

uint64_t fresh_seed() {
  return static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count()) ^
         std::random_device{}();
}

// Checks one tokenizer result against oracle ids (unpadded, EOS included).
void expect_encoding(const Encoding& e, const std::vector<int>& want, int max_length, const std::string& what) {
  ASSERT_EQ(static_cast<int>(e.ids.size()), max_length) << what;
  ASSERT_EQ(static_cast<int>(e.mask.size()), max_length) << what;
  EXPECT_EQ(e.length, static_cast<int>(want.size())) << what;
  std::vector<int> got(e.ids.begin(), e.ids.begin() + std::min<int>(e.length, max_length));
  EXPECT_EQ(got, want) << what;
  for (int i = 0; i < max_length; ++i) {
    EXPECT_EQ(e.mask[i], i < e.length ? 1 : 0) << what << " mask at " << i;
    if (i >= e.length) {
      EXPECT_EQ(e.ids[i], 0) << what << " padding at " << i;
    }
  }
  if (e.length > 0) {
    EXPECT_EQ(e.ids[e.length - 1], 1) << what << ": last real token must be EOS";
  }
}

std::vector<int> ids_of(const json& j) { return j.get<std::vector<int>>(); }

// Runs the oracle on prompts; returns its cases.
json run_oracle(const std::vector<std::string>& prompts, int max_length) {
  const fs::path dir = temp_dir("oracle");
  const json req = {{"tokenizer", kTokDir}, {"max_length", max_length}, {"prompts", prompts}};
  {
    std::ofstream f(dir / "in.json");
    f << req.dump();
  }
  const std::string cmd = std::string("'") + WAN_PYTHON + "' '" + WAN_SOURCE_DIR + "/tools/make_text_fixtures.py' --oracle '" +
                          (dir / "in.json").string() + "' '" + (dir / "out.json").string() + "' > '" +
                          (dir / "log.txt").string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream log(dir / "log.txt");
  const std::string log_text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << cmd << "\n" << log_text;
  json out = read_json((dir / "out.json").string());
  fs::remove_all(dir);
  return out["cases"];
}

// Random prompts from the characters the cleaning and the tokenizer treat specially.
std::vector<std::string> random_prompts(uint64_t seed, int count) {
  std::mt19937_64 rng(seed);
  const std::vector<std::string> atoms = {
      // plain text, vocabulary pieces and unknown characters
      "a", "cat", " the forest", "Dog", "running ", "4k", "2024", ",", ".", "!", "?", "'", "\"", "-", "(", ")",
      "一只猫", "森林", "电影感", "色调艳丽", "龘", "靐", "😀", "🐱", "🦙", "🪐", "✨", "Ωμέγα", "привет", "é", "ß",
      // whitespace of every kind
      " ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u2003", "\u3000", "\u202f", "\x1c", "\u2028", "\u200b",
      // ftfy: quotes, ligatures, width, controls, escapes, C1, BOM, combining marks, Hangul jamo
      "\u201c", "\u201d", "\u2018", "\u2019", "\u02bc", "ﬁ", "ﬂ", "ĳ", "ǅ", "Ａ", "ｚ", "１", "，", "ｶ", "ﾞ", "\x07",
      "\x0b", "\x7f", "\x1b[1m", "\x1b[0;31m", "\x1b[", "\u0080", "\u0085", "\u0091", "\u009d", "\ufeff", "\ufffc",
      "\u0301", "\u0308", "\u0323", "\u0338", "e\u0301", "\u1100", "\u1161", "\u11a8", "\u212b", "\u2126",
      // HTML references, complete and broken
      "&amp;", "&amp;amp;", "&lt;", "&gt;", "&quot;", "&#39;", "&#x4e00;", "&#128512;", "&#0;", "&#x80;", "&nbsp;",
      "&copy", "&notit;", "&EACUTE;", "&AMP;", "&", "&#", "&#x;", "&ampfoo", "&#9999999999;", "<", "<b>", ">",
      // mojibake fragments (UTF-8 read as Windows-1252 / Latin-1 / others)
      "Ã©", "Ã¨", "Ã ", "Ã", "Â", "Â°", "â€™", "â€œ", "â€\u009d", "â€”", "Ã¼", "Ã¶", "ä¸\u0080", "ç\u008c«", "Ð¿Ñ\u0080",
      "Ã\u0083Â©", "\u00c2\u00a0", "â\u0080\u0099", "Ã¢â‚¬â„¢", "вЂ", "Ã¯Â»Â¿",
      // literal special tokens
      "</s>", "<pad>", "<unk>", "<extra_id_0>", "<extra_id_42>", "<extra_id_100>",
  };
  std::vector<std::string> out;
  for (int p = 0; p < count; ++p) {
    const int n = static_cast<int>(rng() % 40) + (p % 7 == 0 ? 120 : 0);  // some longer than max_length
    std::string s;
    for (int i = 0; i < n; ++i) s += atoms[rng() % atoms.size()];
    out.push_back(s);
  }
  return out;
}

}  // namespace

TEST(Tokenizer, CommittedCasesMatchTransformers) {
  const json fx = read_json(std::string(WAN_FIXTURES) + "/text/tokenizer_cases.json");
  const int max_length = fx["max_length"].get<int>();
  ASSERT_EQ(max_length, 512);
  const Tokenizer hf = Tokenizer::load(kTokDir);  // Auto: tokenizer.json says byte_fallback false
  EXPECT_FALSE(hf.byte_fallback());
  EXPECT_EQ(hf.vocab_size(), fx["vocab_size"].get<int>());
  EXPECT_EQ(hf.max_length(), 512);
  EXPECT_EQ(hf.pad_id(), 0);
  EXPECT_EQ(hf.eos_id(), 1);
  EXPECT_EQ(hf.unk_id(), 2);
  TokenizerOptions on;
  on.byte_fallback = TokenizerOptions::ByteFallback::On;
  const Tokenizer bf = Tokenizer::load(kTokDir, on);
  EXPECT_TRUE(bf.byte_fallback());

  int truncated = 0, with_unknown = 0;
  ASSERT_GE(fx["cases"].size(), 30u);
  for (const json& c : fx["cases"]) {
    const std::string prompt = c["prompt"];
    const std::string what = "prompt " + escaped(prompt);
    EXPECT_EQ(clean_prompt(prompt), c["clean"].get<std::string>()) << what;
    expect_encoding(hf.encode(prompt), ids_of(c["hf"]), max_length, what + " (byte fallback off)");
    expect_encoding(bf.encode(prompt), ids_of(c["hf_bf"]), max_length, what + " (byte fallback on)");
    truncated += c["hf"].size() == 512u;
    with_unknown += ids_of(c["hf"]) != ids_of(c["hf_bf"]);
  }
  EXPECT_GE(truncated, 2);      // the over-long English and Chinese prompts
  EXPECT_GE(with_unknown, 10);  // both unknown-character behaviours were exercised
}

TEST(Tokenizer, DefaultNegativePrompt) {
  // Spec §1.1's string: full-width commas become ',' (ftfy width fix) and nothing is truncated.
  const std::string neg =
      "色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，JPEG压缩残留，"
      "丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，手指融合，静止不动的画面，"
      "杂乱的背景，三条腿，背景人很多，倒着走";
  const json fx = read_json(std::string(WAN_FIXTURES) + "/text/tokenizer_cases.json");
  const json* found = nullptr;
  for (const json& c : fx["cases"])
    if (c["prompt"] == neg) found = &c;
  ASSERT_NE(found, nullptr) << "the default negative prompt is not among the committed cases";
  const std::string cleaned = clean_prompt(neg);
  EXPECT_EQ(cleaned, (*found)["clean"].get<std::string>());
  EXPECT_EQ(cleaned.find("，"), std::string::npos);
  const Encoding e = Tokenizer::load(kTokDir).encode(neg);
  expect_encoding(e, ids_of((*found)["hf"]), 512, "negative prompt");
  EXPECT_GT(e.length, 50);
  EXPECT_LT(e.length, 512);
}

TEST(Tokenizer, FreshRandomPromptsMatchOracle) {
  ASSERT_TRUE(fs::exists(WAN_PYTHON)) << "python oracle missing: " << WAN_PYTHON;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  constexpr int kMaxLength = 64;  // short, so that truncation happens often
  // WAN_TOKENIZER_FUZZ_COUNT raises the number of prompts for a longer soak run.
  const char* count_env = std::getenv("WAN_TOKENIZER_FUZZ_COUNT");
  const int count = count_env ? std::max(1, std::atoi(count_env)) : 80;
  const std::vector<std::string> prompts = random_prompts(seed, count);
  const json cases = run_oracle(prompts, kMaxLength);
  ASSERT_EQ(cases.size(), prompts.size());
  TokenizerOptions off, on;
  off.max_length = on.max_length = kMaxLength;
  off.byte_fallback = TokenizerOptions::ByteFallback::Off;
  on.byte_fallback = TokenizerOptions::ByteFallback::On;
  const Tokenizer t_off = Tokenizer::load(kTokDir, off), t_on = Tokenizer::load(kTokDir, on);
  int truncated = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const json& c = cases[i];
    const std::string what = "prompt " + escaped(prompts[i]);
    const std::u32string u = utf8_decode(prompts[i]);
    // Stage by stage first, so that a failure names the step.
    EXPECT_EQ(utf8_encode(nfc(u)), c["nfc"].get<std::string>()) << what << " (NFC)";
    EXPECT_EQ(utf8_encode(html_unescape(u)), c["html"].get<std::string>()) << what << " (html.unescape)";
    EXPECT_EQ(utf8_encode(ftfy_fix_encoding(u)), c["fix_encoding"].get<std::string>()) << what << " (fix_encoding)";
    EXPECT_EQ(utf8_encode(ftfy_fix_text(u)), c["ftfy"].get<std::string>()) << what << " (ftfy.fix_text)";
    EXPECT_EQ(clean_prompt(prompts[i]), c["clean"].get<std::string>()) << what << " (clean)";
    expect_encoding(t_off.encode(prompts[i]), ids_of(c["hf"]), kMaxLength, what + " (byte fallback off)");
    expect_encoding(t_on.encode(prompts[i]), ids_of(c["hf_bf"]), kMaxLength, what + " (byte fallback on)");
    truncated += c["hf"].size() == static_cast<size_t>(kMaxLength);
    if (HasFailure()) break;  // one prompt's report is enough
  }
  EXPECT_GT(truncated, 0);
}

TEST(Tokenizer, ByteFallbackAutoDetectionAndBareModel) {
  const json fx = read_json(std::string(WAN_FIXTURES) + "/text/tokenizer_cases.json");
  // A folder whose tokenizer.json declares byte fallback: Auto turns it on.
  const fs::path dir = temp_dir("auto");
  fs::copy_file(kTokDir + "/spiece.model", dir / "spiece.model");
  json tj = read_json(kTokDir + "/tokenizer.json");
  tj["model"]["byte_fallback"] = true;
  {
    std::ofstream f(dir / "tokenizer.json");
    f << tj.dump();
  }
  const Tokenizer with_json = Tokenizer::load(dir.string());
  EXPECT_TRUE(with_json.byte_fallback());
  // Only spiece.model (+ config with extra_ids): Auto is off and the specials are synthesised the
  // way transformers lays them out (<extra_id_0> has the highest id).
  fs::remove(dir / "tokenizer.json");
  fs::copy_file(kTokDir + "/tokenizer_config.json", dir / "tokenizer_config.json");
  const Tokenizer bare = Tokenizer::load(dir.string());
  EXPECT_FALSE(bare.byte_fallback());
  EXPECT_EQ(bare.vocab_size(), fx["vocab_size"].get<int>());
  // The .model file path works too.
  const Tokenizer file = Tokenizer::load((dir / "spiece.model").string());
  EXPECT_EQ(file.vocab_size(), fx["vocab_size"].get<int>());
  for (const json& c : fx["cases"]) {
    const std::string prompt = c["prompt"];
    expect_encoding(with_json.encode(prompt), ids_of(c["hf_bf"]), 512, "tokenizer.json byte fallback: " + escaped(prompt));
    expect_encoding(bare.encode(prompt), ids_of(c["hf"]), 512, "bare spiece.model: " + escaped(prompt));
    expect_encoding(file.encode(prompt), ids_of(c["hf"]), 512, "model file: " + escaped(prompt));
  }
  fs::remove_all(dir);
}

TEST(Tokenizer, TruncationKeepsEosAndTinyMaxLength) {
  TokenizerOptions o;
  o.max_length = 1;
  const Tokenizer t = Tokenizer::load(kTokDir, o);
  const Encoding e = t.encode("a cat runs in the forest");
  ASSERT_EQ(e.ids.size(), 1u);
  EXPECT_EQ(e.ids[0], 1);
  EXPECT_EQ(e.length, 1);
  const Encoding empty = Tokenizer::load(kTokDir).encode("");
  EXPECT_EQ(empty.length, 1);
  EXPECT_EQ(empty.ids[0], 1);
  o.max_length = 0;
  EXPECT_THROW(Tokenizer::load(kTokDir, o), wan::Error);
}

// A prompt longer than max_length is cut (keeping EOS), and the encoding says by how many tokens.
TEST(Tokenizer, TruncationCountsTheDroppedTokens) {
  const Tokenizer full = Tokenizer::load(kTokDir);
  const std::string prompt = "a red fox runs through the snow at dawn";
  const size_t n = full.tokenize(wan::text::clean_prompt(prompt)).size();
  ASSERT_GT(n, 5u);
  EXPECT_EQ(full.encode(prompt).dropped, 0);
  TokenizerOptions o;
  o.max_length = 4;
  const Encoding e = Tokenizer::load(kTokDir, o).encode(prompt);
  EXPECT_EQ(e.length, 4);
  EXPECT_EQ(e.dropped, static_cast<int>(n) - 3);
  EXPECT_EQ(e.ids[3], full.eos_id());
}

TEST(Tokenizer, InvalidUtf8BecomesReplacementCharacter) {
  // Python's bytes.decode('utf-8', 'replace'): one U+FFFD per maximal invalid subsequence.
  EXPECT_EQ(utf8_encode(utf8_decode("a\xff" "b")), "a\uFFFD" "b");
  EXPECT_EQ(utf8_encode(utf8_decode("\xe4\xb8")), "\uFFFD");           // truncated 3-byte sequence
  EXPECT_EQ(utf8_encode(utf8_decode("\xed\xa0\x80")), "\uFFFD\uFFFD\uFFFD");  // surrogate
  EXPECT_EQ(utf8_encode(utf8_decode("\xc0\xaf")), "\uFFFD\uFFFD");     // overlong
  std::u32string out;
  EXPECT_FALSE(utf8_decode_strict("\xf4\x90\x80\x80", &out));          // > U+10FFFF
  EXPECT_TRUE(utf8_decode_strict("\xf0\x9f\x98\x80", &out));
  EXPECT_EQ(out, U"\U0001F600");
  const Tokenizer t = Tokenizer::load(kTokDir);
  EXPECT_EQ(t.encode("cat \xff\xfe dog").ids, t.encode("cat \uFFFD\uFFFD dog").ids);
}

TEST(Tokenizer, RandomBytesNeverThrow) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Tokenizer t = Tokenizer::load(kTokDir);
  for (int i = 0; i < 300; ++i) {
    std::string s(rng() % 400, '\0');
    for (char& c : s) c = static_cast<char>(rng() & 0xFF);
    Encoding e;
    ASSERT_NO_THROW(e = t.encode(s)) << escaped(s);
    ASSERT_GE(e.length, 1);
    ASSERT_EQ(e.ids[e.length - 1], 1);
    ASSERT_EQ(e.ids.size(), 512u);
  }
}

TEST(Tokenizer, LoadErrorsNameThePath) {
  try {
    Tokenizer::load("/nonexistent/umt5");
    FAIL() << "no error";
  } catch (const wan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/umt5"), std::string::npos) << e.what();
  }
  const fs::path dir = temp_dir("errors");
  try {
    Tokenizer::load(dir.string());
    FAIL() << "no error";
  } catch (const wan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("spiece.model"), std::string::npos) << e.what();
  }
  {
    std::ofstream f(dir / "spiece.model");
    f << "not a model";
  }
  try {
    Tokenizer::load(dir.string());
    FAIL() << "no error";
  } catch (const wan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("spiece.model"), std::string::npos) << e.what();
  }
  fs::copy_file(kTokDir + "/spiece.model", dir / "spiece.model", fs::copy_options::overwrite_existing);
  {
    std::ofstream f(dir / "tokenizer.json");
    f << "{ broken";
  }
  EXPECT_THROW(Tokenizer::load(dir.string()), wan::Error);
  fs::remove_all(dir);
}
