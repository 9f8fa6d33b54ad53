// diffusers / transformers config files for generated checkpoints. Values follow spec §3.3 (the
// conversion script's pipeline and scheduler settings), §4.5 (UMT5 config) and §6.1 (Wan2.2 VAE).
#include "testing/hf_configs.h"

#include <charconv>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace wan::gen {
namespace {

using json = nlohmann::json;  // std::map-backed: sorted keys

constexpr const char* kDiffusersVersion = "0.35.0";

// The shortest decimal that reads back as f (so 1e-6f is written 1e-06, not 9.99999997e-07).
double short_float(float f) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), f);
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}

json float_list(const std::vector<float>& v) {
  json a = json::array();
  for (float f : v) a.push_back(short_float(f));
  return a;
}

json null_pair() { return json::array({nullptr, nullptr}); }

}  // namespace

double boundary_ratio(Task task) {
  switch (task) {
    case Task::T2V_A14B:
      return 0.875;
    case Task::I2V_A14B:
      return 0.9;
    case Task::TI2V_5B:
      return 0.0;
  }
  return 0.0;
}

double flow_shift(Task task) { return task == Task::TI2V_5B ? 5.0 : 3.0; }

std::string model_index_json(Task task) {
  json j;
  j["_class_name"] = task == Task::I2V_A14B ? "WanImageToVideoPipeline" : "WanPipeline";
  j["_diffusers_version"] = kDiffusersVersion;
  if (task == Task::TI2V_5B) {
    j["boundary_ratio"] = nullptr;
    j["expand_timesteps"] = true;
  } else {
    j["boundary_ratio"] = boundary_ratio(task);
    j["expand_timesteps"] = false;
  }
  if (task == Task::I2V_A14B) {
    // Wan 2.2 I2V has no CLIP image encoder (spec §1.4): the optional components are null.
    j["image_encoder"] = null_pair();
    j["image_processor"] = null_pair();
  }
  j["scheduler"] = {"diffusers", "UniPCMultistepScheduler"};
  j["text_encoder"] = {"transformers", "UMT5EncoderModel"};
  j["tokenizer"] = {"transformers", "T5TokenizerFast"};
  j["transformer"] = {"diffusers", "WanTransformer3DModel"};
  j["transformer_2"] = task == Task::TI2V_5B ? null_pair() : json{"diffusers", "WanTransformer3DModel"};
  j["vae"] = {"diffusers", "AutoencoderKLWan"};
  return j.dump(2) + "\n";
}

std::string scheduler_config_json(Task task) {
  json j;
  j["_class_name"] = "UniPCMultistepScheduler";
  j["_diffusers_version"] = kDiffusersVersion;
  j["beta_end"] = 0.02;
  j["beta_schedule"] = "linear";
  j["beta_start"] = 0.0001;
  j["disable_corrector"] = json::array();
  j["dynamic_thresholding_ratio"] = 0.995;
  j["final_sigmas_type"] = "zero";
  j["flow_shift"] = flow_shift(task);
  j["lower_order_final"] = true;
  j["num_train_timesteps"] = 1000;
  j["predict_x0"] = true;
  j["prediction_type"] = "flow_prediction";
  j["rescale_betas_zero_snr"] = false;
  j["sample_max_value"] = 1.0;
  j["solver_order"] = 2;
  j["solver_p"] = nullptr;
  j["solver_type"] = "bh2";
  j["steps_offset"] = 0;
  j["thresholding"] = false;
  j["timestep_spacing"] = "linspace";
  j["trained_betas"] = nullptr;
  j["use_beta_sigmas"] = false;
  j["use_dynamic_shifting"] = false;
  j["use_exponential_sigmas"] = false;
  j["use_flow_sigmas"] = true;
  j["use_karras_sigmas"] = false;
  return j.dump(2) + "\n";
}

std::string t5_config_hf_json(const T5Config& c) {
  json j;
  j["architectures"] = {"UMT5EncoderModel"};
  j["classifier_dropout"] = 0.0;
  j["d_ff"] = c.dim_ffn;
  j["d_kv"] = c.head_dim();
  j["d_model"] = c.dim;
  j["decoder_start_token_id"] = 0;
  j["dense_act_fn"] = "gelu_new";
  j["dropout_rate"] = 0.1;
  j["eos_token_id"] = 1;
  j["feed_forward_proj"] = "gated-gelu";
  j["initializer_factor"] = 1.0;
  j["is_encoder_decoder"] = true;
  j["is_gated_act"] = true;
  j["layer_norm_epsilon"] = short_float(c.eps);
  j["model_type"] = "umt5";
  j["num_decoder_layers"] = c.num_layers;
  j["num_heads"] = c.num_heads;
  j["num_layers"] = c.num_layers;
  j["pad_token_id"] = 0;
  j["relative_attention_max_distance"] = c.max_distance;
  j["relative_attention_num_buckets"] = c.num_buckets;
  j["tie_word_embeddings"] = false;
  j["tokenizer_class"] = "T5Tokenizer";
  j["torch_dtype"] = "bfloat16";
  j["use_cache"] = true;
  j["vocab_size"] = c.vocab;
  return j.dump(2) + "\n";
}

std::string vae_config_diffusers_json(const VaeConfig& c) {
  const bool v22 = c.version == 22;
  int temporal = 1;
  for (bool t : c.temporal_downsample) temporal *= t ? 2 : 1;
  const int spatial = (1 << static_cast<int>(c.dim_mult.size() - 1)) * c.patch;
  json j;
  j["_class_name"] = "AutoencoderKLWan";
  j["_diffusers_version"] = kDiffusersVersion;
  j["attn_scales"] = json::array();
  j["base_dim"] = c.base_dim;
  if (v22) j["clip_output"] = false;  // written by the conversion script for the Wan2.2 VAE (spec §6.1)
  j["decoder_base_dim"] = v22 ? json(c.dec_dim) : json(nullptr);
  j["dim_mult"] = c.dim_mult;
  j["dropout"] = 0.0;
  j["in_channels"] = 3 * c.patch * c.patch;
  j["is_residual"] = v22;
  j["latents_mean"] = float_list(c.latents_mean);
  j["latents_std"] = float_list(c.latents_std);
  j["num_res_blocks"] = c.num_res_blocks;
  j["out_channels"] = 3 * c.patch * c.patch;
  j["patch_size"] = c.patch > 1 ? json(c.patch) : json(nullptr);
  j["scale_factor_spatial"] = spatial;
  j["scale_factor_temporal"] = temporal;
  j["temperal_downsample"] = c.temporal_downsample;
  j["z_dim"] = c.z_dim;
  return j.dump(2) + "\n";
}

}  // namespace wan::gen
