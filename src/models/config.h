// Model configurations: the DiT (WanModel), the UMT5 text encoder and the two Wan VAEs, with the
// presets of the released models, JSON reading/writing in the official and diffusers key styles,
// and inference of the DiT config from tensor shapes.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace wan {

enum class Task { T2V_A14B, I2V_A14B, TI2V_5B };
const char* task_name(Task t);          // "t2v-A14B", "i2v-A14B", "ti2v-5B"
Task task_from_name(const std::string& s);  // throws wan::Error listing the valid names

struct DiTConfig {
  int dim = 5120;
  int ffn_dim = 13824;
  int num_heads = 40;
  int num_layers = 40;
  int in_dim = 16;
  int out_dim = 16;
  int freq_dim = 256;
  int text_dim = 4096;
  int text_len = 512;
  float eps = 1e-6f;
  int patch[3] = {1, 2, 2};
  std::string model_type = "t2v";  // t2v | i2v | ti2v
  int head_dim() const { return dim / num_heads; }
  void validate() const;  // throws wan::Error on inconsistent values (dim % heads, head_dim != 128, ...)
  bool operator==(const DiTConfig& o) const;
};

// Positions per axis (frames, height, width in tokens) of the reference's RoPE table (spec §2.6).
constexpr int kDiTRopePositions = 1024;

DiTConfig dit_preset(const std::string& name);  // "t2v-A14B", "i2v-A14B", "ti2v-5B", "tiny"
// official config.json ({"_class_name": "WanModel", "dim": ..}) or diffusers transformer config
// ({"_class_name": "WanTransformer3DModel", "num_attention_heads": .., "attention_head_dim": ..}).
DiTConfig dit_config_from_json(const std::string& json_text);
std::string dit_config_to_official_json(const DiTConfig& c);
std::string dit_config_to_diffusers_json(const DiTConfig& c);
// Infers the config from (official-named) tensor shapes: dim from head.modulation, heads = dim/128,
// ffn from blocks.0.ffn.0.weight, in/out dims from patch embedding / head, text_dim from
// text_embedding.0.weight, layers by counting blocks.N.
DiTConfig dit_config_from_shapes(const std::map<std::string, Shape>& shapes);
int64_t dit_param_count(const DiTConfig& c);

struct T5Config {
  int vocab = 256384;
  int dim = 4096;
  int dim_attn = 4096;
  int dim_ffn = 10240;
  int num_heads = 64;
  int num_layers = 24;
  int num_buckets = 32;
  int max_distance = 128;
  float eps = 1e-6f;
  int head_dim() const { return dim_attn / num_heads; }
};
T5Config t5_preset(const std::string& name);  // "umt5-xxl", "tiny"
// Relative position bucket of rel = key_index - query_index (spec §4.2; float32 log as the
// reference computes it). Shared by the CPU encoder (text/umt5) and the GPU one (cuda/t5_gpu).
int t5_relative_bucket(int64_t rel, int num_buckets, int max_distance);

struct VaeConfig {
  int version = 21;          // 21 = Wan2.1 VAE (z 16), 22 = Wan2.2 VAE (z 48, patchified)
  int z_dim = 16;
  int base_dim = 96;         // encoder/decoder width
  int dec_dim = 96;          // Wan2.2: decoder base width 256
  std::vector<int> dim_mult = {1, 2, 4, 4};
  int num_res_blocks = 2;
  std::vector<bool> temporal_downsample = {false, true, true};
  int patch = 1;             // Wan2.2: 2 (pixel-unshuffle before the encoder)
  std::vector<float> latents_mean, latents_std;  // z_dim each
};
VaeConfig vae_preset(const std::string& name);  // "wan2.1", "wan2.2", "tiny2.1", "tiny2.2"

// What a model name stands for (make-checkpoint's --config, `--weights random` sizes): the task and
// the three component configs. Names: t2v-A14B, i2v-A14B, ti2v-5B (real shapes) and tiny, tiny-t2v,
// tiny-i2v, tiny-ti2v (the tiny presets with the same structure; the tiny DiT's text_dim is the tiny
// T5's width so the components chain). layers > 0 overrides the DiT depth only. Throws wan::Error for
// unknown names.
struct ModelPreset {
  std::string name;  // as given (lower-cased)
  Task task = Task::T2V_A14B;
  DiTConfig dit;
  T5Config t5;
  VaeConfig vae;
  bool tiny = false;
};
ModelPreset model_preset(const std::string& name, int layers = 0);
std::vector<std::string> model_preset_names();

}  // namespace wan
