// fuzz_make_seeds OUT: writes the seed corpus of every fuzz target into OUT/<target>/ with the
// engine's own writers (so the seeds follow the formats as they change): small valid safetensors,
// index, .pth (and their bare data.pkl), config.json and tensor-shape maps, tokenizer files and
// prompts, embeddings / latents / state files. scripts/fuzz.sh adds the small test fixtures.
// Invariants: the output is a pure function of this program (no randomness, no clock); every file
// is small (a few KB), because libFuzzer mutates small inputs much faster; the tokenizer.json seeds
// use the same pieces as the spiece.model that fuzz_tokenizer puts next to them.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "formats/pth.h"
#include "formats/safetensors.h"
#include "formats/zip.h"
#include "models/config.h"
#include "models/dit/weights.h"
#include "pipeline/files.h"
#include "pipeline/pipeline.h"
#include "testing/gguf_writer.h"
#include "testing/tokenizer_files.h"

namespace {

using namespace wan;
namespace fs = std::filesystem;

fs::path g_out;

void put(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(g_out / target);
  std::ofstream f(g_out / target / name, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  WAN_CHECK(f.good(), (g_out / target / name).string(), ": write failed");
}

std::string path_of(const std::string& target, const std::string& name) {
  fs::create_directories(g_out / target);
  return (g_out / target / name).string();
}

// Deterministic small values, exactly representable in every float type.
Tensor ramp(DType t, Shape s) {
  Tensor f = Tensor::empty(DType::F32, s);
  for (int64_t i = 0; i < f.numel(); ++i) f.f32()[i] = static_cast<float>(i % 7) * 0.25f - 0.5f;
  return dtype_is_float(t) ? f.to(t) : [&] {
    Tensor x = Tensor::empty(t, s);
    std::memset(x.data(), 1, x.nbytes());
    return x;
  }();
}

void fill_ramp(const TensorSpec& spec, void* dst) {
  Tensor t = ramp(spec.dtype, spec.shape);
  if (spec.nbytes()) std::memcpy(dst, t.data(), spec.nbytes());
}

void safetensors_seeds() {
  std::vector<std::pair<std::string, Tensor>> all;
  for (DType t : {DType::F64, DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::F8E5M2, DType::I64,
                  DType::I32, DType::I16, DType::I8, DType::U8, DType::Bool})
    all.push_back({cat("t.", dtype_name(t)), ramp(t, Shape{2, 3})});
  write_safetensors(path_of("safetensors", "every_dtype.safetensors"), all, {{"format", "pt"}});
  write_safetensors(path_of("safetensors", "empty_and_scalar.safetensors"),
                    {{"empty", Tensor::empty(DType::F32, Shape{0, 4})}, {"scalar", ramp(DType::F32, Shape{})}});
  // A header whose length is not a multiple of 8 (other writers do this): the tensor is misaligned.
  const std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  put("safetensors", "misaligned.safetensors", file + header + std::string("\0\0\x80?\0\0\0@", 8));
}

void index_seeds() {
  // The shards fuzz_safetensors_index writes: a, b.weight in 00001; c, d in 00002.
  const char* s1 = "model-00001-of-00002.safetensors";
  const char* s2 = "model-00002-of-00002.safetensors";
  nlohmann::json j = {{"metadata", {{"total_size", 40}}},
                      {"weight_map", {{"a", s1}, {"b.weight", s1}, {"c", s2}, {"d", s2}}}};
  put("safetensors_index", "valid.json", j.dump(2));
  j["weight_map"].erase("d");
  put("safetensors_index", "missing_d.json", j.dump());
  put("safetensors_index", "swapped.json", nlohmann::json({{"weight_map", {{"a", s2}, {"c", s1}}}}).dump());
}

void pth_seeds() {
  std::vector<TensorSpec> specs = {{"w", DType::F32, Shape{2, 3}},   {"b", DType::BF16, Shape{3}},
                                   {"h", DType::F16, Shape{2, 2}},   {"i", DType::I64, Shape{2}},
                                   {"f8", DType::F8E4M3, Shape{4}},  {"s", DType::F32, Shape{}}};
  write_pth(path_of("pth", "state_dict.pth"), specs, fill_ramp);
  write_pth(path_of("pth", "zip64.pth"), {specs[0], specs[4]}, fill_ramp, PthWriteOptions{true});
  // The bare data.pkl of the first archive: the unpickler's own seed.
  std::ifstream f(path_of("pth", "state_dict.pth"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  for (const zip::Entry& e : zip::read_directory(p, bytes.size(), "state_dict.pth"))
    if (e.name.size() >= 8 && e.name.compare(e.name.size() - 8, 8, "data.pkl") == 0)
      put("pth", "data.pkl", bytes.substr(e.data_offset, e.size));
}

void config_seeds() {
  for (const char* preset : {"tiny", "tiny-i2v", "tiny-ti2v", "t2v-A14B"}) {
    const DiTConfig c = dit_preset(preset);
    put("config", cat(preset, ".official.json"), dit_config_to_official_json(c));
    put("config", cat(preset, ".diffusers.json"), dit_config_to_diffusers_json(c));
  }
  DiTConfig one = dit_preset("tiny");
  one.num_layers = 1;
  nlohmann::json shapes = nlohmann::json::object();
  for (const auto& [name, s] : dit_expected_shapes(one)) shapes[name] = s.vec();
  put("config", "tiny.shapes.json", shapes.dump());
}

// Darts-clone double array of a few UTF-8 keys, as precompiled charsmaps store them: a node with
// offset o keeps its child with label c at o ^ c and, when a key ends there, a value unit at o.
std::string tiny_charsmap(const std::vector<std::pair<std::string, std::string>>& rules) {
  struct Node {
    std::map<uint8_t, int> next;
    int value = -1;  // offset of the replacement in the string pool
  };
  std::vector<Node> nodes(1);
  std::string pool;
  for (const auto& [key, repl] : rules) {
    int n = 0;
    for (unsigned char c : key) {
      if (!nodes[n].next.count(c)) {
        nodes[n].next[c] = static_cast<int>(nodes.size());
        nodes.emplace_back();
      }
      n = nodes[n].next[c];
    }
    nodes[n].value = static_cast<int>(pool.size());
    pool += repl + '\0';
  }
  std::vector<uint32_t> units(1, 0);
  std::vector<bool> used(1, true), base_used(1, true);
  auto slot = [&](size_t i) {
    if (i >= units.size()) units.resize(i + 1, 0), used.resize(i + 1, false);
    return i;
  };
  // Breadth-first: each node gets the smallest unused base whose slots are all free; its unit stores
  // base ^ (its own index), which is how a reader finds the base again.
  std::vector<std::pair<int, size_t>> queue = {{0, 0}};  // (node, its unit)
  for (size_t q = 0; q < queue.size(); ++q) {
    const int n = queue[q].first;
    const size_t at = queue[q].second;
    uint32_t o = 1;
    auto fits = [&](uint32_t off) {
      if (off < base_used.size() && base_used[off]) return false;
      if (nodes[n].value >= 0 && (slot(off), used[off])) return false;
      for (const auto& [c, child] : nodes[n].next)
        if (slot(off ^ c), used[off ^ c]) return false;
      return true;
    };
    while (!fits(o)) ++o;
    if (o >= base_used.size()) base_used.resize(o + 1, false);
    base_used[o] = true;
    units[at] |= ((o ^ static_cast<uint32_t>(at)) << 10) | (nodes[n].value >= 0 ? (1u << 8) : 0u);
    if (nodes[n].value >= 0) {
      units[slot(o)] = (1u << 31) | static_cast<uint32_t>(nodes[n].value);
      used[o] = true;
    }
    for (const auto& [c, child] : nodes[n].next) {
      units[slot(o ^ c)] = c;
      used[o ^ c] = true;
      queue.push_back({child, o ^ c});
    }
  }
  units.resize((units.size() + 255) / 256 * 256, 0);  // SentencePiece wants whole 256-unit blocks
  std::string blob(4, '\0');
  const uint32_t bytes = static_cast<uint32_t>(units.size() * 4);
  std::memcpy(blob.data(), &bytes, 4);
  blob.append(reinterpret_cast<const char*>(units.data()), bytes);
  return blob + pool;
}

std::string base64(const std::string& s) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < s.size(); i += 3) {
    const uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8) | uint8_t(s[i + 2]);
    for (int sh : {18, 12, 6, 0}) out += k[(v >> sh) & 63];
  }
  if (i + 1 == s.size()) {
    const uint32_t v = uint8_t(s[i]) << 16;
    out += std::string{k[(v >> 18) & 63], k[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == s.size()) {
    const uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8);
    out += std::string{k[(v >> 18) & 63], k[(v >> 12) & 63], k[(v >> 6) & 63], '='};
  }
  return out;
}

void tokenizer_seeds() {
  const std::string charsmap = tiny_charsmap({{"\xEF\xBC\xA1", "A"},         // fullwidth A
                                              {"\xE2\x80\xA6", "..."},       // ellipsis
                                              {"\xEF\xAC\x81", "fi"},        // fi ligature
                                              {"\xE2\x91\xA0", "1"},         // circled 1
                                              {"\x09", " "}});
  // tokenizer.json: the pieces of the spiece.model next to it, few sentinels, three normalizers.
  const auto pieces = gen::tokenizer_pieces();
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(gen::tokenizer_json(pieces, 3));
  put("tokenizer", "plain.tokenizer.json", j.dump());
  j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", base64(charsmap)}};
  put("tokenizer", "charsmap.tokenizer.json", j.dump());
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", nlohmann::ordered_json::array({j["normalizer"]})}};
  j["model"]["byte_fallback"] = false;
  put("tokenizer", "sequence.tokenizer.json", j.dump());
  // spiece.model: few pieces (control, unk, the 256 byte pieces byte_fallback needs, some words), with
  // and without a charsmap.
  std::vector<gen::SpmPiece> few(pieces.begin(), pieces.begin() + 3 + 256);
  for (const char* w : {"\xE2\x96\x81", "\xE2\x96\x81the", "\xE2\x96\x81" "cat", "s", "a", "t"})
    few.push_back({w, -4.0f, gen::PieceType::Normal});
  std::string model = gen::spm_model_proto(few);
  put("tokenizer", "few.spiece.model", model);
  // A second NormalizerSpec field (protobuf merges it into the first) sets precompiled_charsmap.
  auto field = [](int number, const std::string& bytes) {
    std::string f(1, static_cast<char>(number << 3 | 2));
    for (uint64_t v = bytes.size();; v >>= 7) {
      f += static_cast<char>((v & 0x7F) | (v >= 0x80 ? 0x80 : 0));
      if (v < 0x80) break;
    }
    return f + bytes;
  };
  model += field(3, field(2, charsmap));
  put("tokenizer", "charsmap.spiece.model", model);
  put("tokenizer", "full.spiece.model", gen::spm_model_proto(pieces));
  // Prompts (anything not starting with '{' or 0x0A).
  put("tokenizer", "prompt_ascii.txt", "A cat walks <extra_id_0> on the beach at sunset</s>, cinematic");
  put("tokenizer", "prompt_unicode.txt", "Caf\xC3\xA9 \xEF\xBC\xA1 \xE2\x80\xA6 \xE7\x8C\xAB \xF0\x9F\x90\x88 &amp; \xC3\x83\xC2\xA9");
  static const char kInvalid[] = "bad \xFF\xC3 bytes \xED\xA0\x80 end";
  put("tokenizer", "prompt_invalid_utf8.txt", std::string(kInvalid, sizeof kInvalid - 1));
}

void state_seeds() {
  write_prompt_embeds(path_of("state_files", "embeds.safetensors"), ramp(DType::F32, Shape{3, 8}));
  write_latents(path_of("state_files", "latents.safetensors"), ramp(DType::F32, Shape{2, 1, 2, 2}));
  RunState st;
  st.step = 2;
  st.latents = ramp(DType::F32, Shape{2, 1, 2, 2});
  st.sampler.m_last.assign(8, 0.5f);
  st.sampler.m_prev.assign(8, -0.25f);
  st.prompt_embeds = ramp(DType::F32, Shape{3, 8});
  st.negative_embeds = ramp(DType::F32, Shape{2, 8});
  st.fingerprint = R"({"task":"t2v-A14B","steps":"4","sampler":"unipc"})";
  st.timings.load_text_encoder = 0.5;
  st.timings.denoise = 2;
  st.timings.step_seconds = {1, 1};
  write_run_state(path_of("state_files", "state.safetensors"), st, {{"prompt", "a cat"}});
}

// Video requests (fuzz_video_request): JSON bodies and form fields as the OpenAI SDK sends them.
void video_request_seeds() {
  put("video_request", "json_min.txt", R"({"prompt": "a cat"})");
  put("video_request", "json_full.txt",
             R"({"prompt": "a red fox", "model": "wan2.2-t2v-A14B", "size": "64x48", "seconds": "0.25", )"
             R"("seed": 7, "steps": 2, "guidance_scale": "3,4", "shift": 5, "sampler": "euler", "fps": 16})");
  put("video_request", "json_frames.txt", R"({"prompt": "x", "num_frames": 9, "preset": "lightning-4step"})");
  put("video_request", "form.txt",
             "prompt=a cat on a sofa\nsize=96x64\nseconds=0.5\nnegative_prompt=blurry\nsteps=1\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds OUT_DIR\n");
    return 2;
  }
  try {
    g_out = argv[1];
    safetensors_seeds();
    index_seeds();
    pth_seeds();
    config_seeds();
    tokenizer_seeds();
    state_seeds();
    gen::write_gguf_seeds((g_out / "gguf").string());
    video_request_seeds();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_make_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
