// Fuzz target: the DiT config.json readers and shape inference (models/config.h) and the checkpoint
// detection that reads config.json (ckpt/layout.h). Every input is tried three ways:
//   - as config.json text: dit_config_from_json, then what callers do with an accepted config
//     (parameter count, and the writers, whose output must read back to an equal config);
//   - as config.json of a folder that also holds a small DiT file: detect_checkpoint;
//   - when it is a JSON object of {"tensor name": [dims]}: dit_config_from_shapes over those shapes
//     (dims as a safetensors header can give them: non-negative, at most 8, numel within 63 bits).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "ckpt/layout.h"
#include "formats/safetensors.h"
#include "fuzz_util.h"
#include "models/config.h"

namespace {

using namespace wan;

void check_accepted(const DiTConfig& c) {
  (void)dit_param_count(c);
  fuzz::require(dit_config_from_json(dit_config_to_official_json(c)) == c, "official config.json round trip");
  // diffusers' config has no text_len (WanTransformer3DModel fixes it at 512).
  if (c.text_len == 512)
    fuzz::require(dit_config_from_json(dit_config_to_diffusers_json(c)) == c, "diffusers config.json round trip");
}

// A folder with config.json (the input) and a one-tensor DiT file, as make-checkpoint lays them out.
std::filesystem::path make_folder() {
  const auto dir = fuzz::scratch_dir() / "transformer";
  std::filesystem::create_directories(dir);
  Tensor t = Tensor::empty(DType::F32, Shape{2});
  std::memset(t.data(), 0, 8);
  write_safetensors((dir / "diffusion_pytorch_model.safetensors").string(), {{"head.modulation", t}});
  return dir;
}

std::optional<std::map<std::string, Shape>> shapes_of(const nlohmann::json& j) {
  if (!j.is_object() || j.empty()) return std::nullopt;
  std::map<std::string, Shape> shapes;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const nlohmann::json& v = it.value();
    if (!v.is_array() || v.size() > static_cast<size_t>(kMaxDims)) return std::nullopt;
    std::vector<int64_t> dims;
    uint64_t numel = 1;
    for (const auto& d : v) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) return std::nullopt;
      const uint64_t x = d.get<uint64_t>();
      if (__builtin_mul_overflow(numel, x, &numel) || numel > (uint64_t{1} << 62)) return std::nullopt;
      dims.push_back(static_cast<int64_t>(x));
    }
    shapes[it.key()] = Shape(dims);
  }
  return shapes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path dir = make_folder();
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::accepts([&] { check_accepted(dit_config_from_json(text)); });

  fuzz::write_file(dir / "config.json", data, size);
  fuzz::accepts([&] {
    CheckpointInfo info = detect_checkpoint(dir.string());
    check_accepted(info.dit);
  });

  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (const auto shapes = shapes_of(j))
    fuzz::accepts([&] {
      const DiTConfig c = dit_config_from_shapes(*shapes);
      check_accepted(c);
      // The inferred sizes are the tensors' own, not truncated or wrapped on the way to int.
      const auto& s = *shapes;
      fuzz::require(c.dim == s.at("head.modulation")[2] && c.ffn_dim == s.at("blocks.0.ffn.0.weight")[0] &&
                        c.in_dim == s.at("patch_embedding.weight")[1] &&
                        c.freq_dim == s.at("time_embedding.0.weight")[1] &&
                        c.text_dim == s.at("text_embedding.0.weight")[1] &&
                        static_cast<int64_t>(c.out_dim) * 4 == s.at("head.head.weight")[0],
                    "inferred sizes equal the tensor shapes they come from");
    });
  return 0;
}
