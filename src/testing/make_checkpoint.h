// Random-weight checkpoints of every component of a Wan 2.2 task, in the official release layout, the
// diffusers layout (spec §3) or as ComfyUI component files, for tests and benchmarks without the real
// weights.
// Invariants:
// - Deterministic: the same options give byte-identical files. A tensor's values depend only on
//   (seed, component, official tensor name), so the two layouts hold the same values, and the two
//   A14B experts differ (their components are "high_noise_model" and "low_noise_model").
// - Streaming: one tensor is in memory at a time (a real A14B expert is 57 GB in fp32).
// - All or nothing: everything is written under "<out>.partial-XXXXXX" next to <out> and renamed to
//   <out> at the end; on failure the partial folder is removed and <out> is left as it was.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/layout.h"
#include "models/config.h"
#include "core/dtype.h"

namespace wan::gen {

struct MakeCheckpointOptions {
  std::string config;                // a model_preset name
  Layout layout = Layout::Official;  // Official, Diffusers or ComfyUI (component files)
  int layers = 0;                    // > 0: DiT num_layers override
  // DiT weights. Official / diffusers: F32 or BF16 (T5 bf16, VAE fp32 as released). ComfyUI: F16, BF16,
  // F32, or F8E4M3 = fp8_scaled (DiT and T5 GEMM weights fp8 with a per-tensor scale_weight); the
  // text encoder and the VAE are fp16 there (umt5_xxl_fp16, wan_2.1_vae / wan2.2_vae).
  DType dtype = DType::F32;
  uint64_t seed = 0;
  std::string out;                           // output folder
  bool force = false;                        // replace a non-empty <out>
  bool dit_only = false;                     // only the (high-noise) DiT + config (not a whole checkpoint)
  uint64_t max_shard_bytes = 5000000000ull;  // "5GB" as Hugging Face counts it
};

struct MakeCheckpointResult {
  std::string root;
  std::vector<std::string> files;  // relative to root, sorted
  uint64_t bytes = 0;
};

MakeCheckpointResult make_checkpoint(const MakeCheckpointOptions& o);

// Layout::ComfyUI: the files written, relative to the output folder, under ComfyUI's models/ folder
// names and Comfy-Org's file names ("" = not written; tokenizer is a folder).
struct ComfyUIFiles {
  std::string dit, dit_high, dit_low, text_encoder, vae, tokenizer;
};
ComfyUIFiles comfyui_files(const std::string& config, DType dtype);

}  // namespace wan::gen
