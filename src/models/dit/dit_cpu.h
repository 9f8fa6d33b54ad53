// The Wan DiT (official WanModel, spec §2) as a CPU float32 reference built from wan::ops.
// Weights are typed members named after the official state dict (spec §3.2) and are loaded through
// a name -> tensor callback, so this module knows nothing about checkpoint layouts.
// Invariants: every weight tensor is contiguous F32 with the shape its comment states (checked at
// load time against the config); dit_forward never reads a weight it was not given and throws
// wan::Error for any input whose shape does not fit the config.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "models/config.h"
#include "core/tensor.h"

namespace wan {

// D = dim, F = ffn_dim, P = patch volume (1·2·2).
struct DiTLinear {
  Tensor weight;  // [out, in]
  Tensor bias;    // [out]
};

struct DiTAttention {
  DiTLinear q, k, v, o;  // [D, D] / [D] each
  Tensor norm_q;         // [D] RMSNorm over all heads jointly
  Tensor norm_k;         // [D]
};

struct DiTBlock {
  Tensor modulation;         // [1, 6, D]: shift/scale/gate (self-attn), shift/scale/gate (ffn)
  DiTAttention self_attn;    // self_attn.*
  DiTAttention cross_attn;   // cross_attn.*
  Tensor norm3_weight;       // [D] affine LayerNorm before cross-attention
  Tensor norm3_bias;         // [D]
  DiTLinear ffn_0;           // ffn.0: [F, D] / [F]
  DiTLinear ffn_2;           // ffn.2: [D, F] / [D]
};

struct DiTWeights {
  Tensor patch_embedding_weight;  // [D, in_dim, 1, 2, 2] (Conv3d, kernel = stride = patch)
  Tensor patch_embedding_bias;    // [D]
  DiTLinear text_embedding_0;     // [D, text_dim] / [D]
  DiTLinear text_embedding_2;     // [D, D] / [D]
  DiTLinear time_embedding_0;     // [D, freq_dim] / [D]
  DiTLinear time_embedding_2;     // [D, D] / [D]
  DiTLinear time_projection_1;    // [6D, D] / [6D]
  std::vector<DiTBlock> blocks;   // num_layers
  Tensor head_modulation;         // [1, 2, D]: shift, scale of the output head
  DiTLinear head_head;            // [out_dim·P, D] / [out_dim·P]
};

// Returns the tensor stored under an official name (any float dtype; converted to F32 here).
using DiTWeightFn = std::function<Tensor(const std::string& official_name)>;
// Loads all weights of cfg (cfg.num_layers blocks), checking every shape; errors name the tensor.
DiTWeights load_dit_weights(const DiTConfig& cfg, const DiTWeightFn& get);

// Called with intermediate activations (float32 copies):
//   "patch_embed" [B, S, D], "time_embed" e [B, Lt, D], "time_proj" e0 [B, Lt, 6D],
//   "text_embed" [B, text_len, D], "block.<i>" [B, S, D] (output of block i), "head" [B, S, out_dim·P]
// with S = seq_len and Lt = 1 for a per-sample timestep, S for a per-token one.
using DiTHook = std::function<void(const std::string& name, const Tensor& value)>;

// The host bytes dit_forward allocates for B samples of `S` tokens (seq_len) with Lt timestep rows per
// sample (1 or S) and an output of `out_elems` floats, besides its inputs and weights: the residual
// stream and the q, k, v, attention, projection and FFN buffers (rows = B·S), the text and time
// embeddings, the head and the output. Plain arithmetic, for refusing a run before it starts.
size_t dit_forward_bytes(const DiTConfig& cfg, int64_t B, int64_t S, int64_t Lt, int64_t out_elems);

// Velocity prediction of the official WanModel.forward:
//   x        [B, in_dim, T, H, W] f32 (I2V: the caller concatenates y, so in_dim = 36)
//   t        [B] (one timestep per sample, A14B) or [B, seq_len] (per token, TI2V) f32
//   context  [B, Lctx, text_dim] f32 with Lctx <= text_len; rows >= context_lens[b] are ignored
//            (the model zero-pads each prompt to text_len and attends to all text_len slots)
//   seq_len  >= f·h·w tokens (0: exactly f·h·w); padding tokens are computed but never attended to
// Returns [B, out_dim, T, H, W] f32.
// fp8_block_gemms: the blocks' 7 GEMMs' linears (q, k, v, o of both attentions, ffn.0, ffn.2) as the GPU
// DiT's DiTGemm::Fp8 computes them: input rows rounded to bf16 (as the GPU holds them) and quantised per
// row, weights quantised per output row (ops/fp8_ref.h), then ops::linear_fp8_ref; all else unchanged.
Tensor dit_forward(const DiTConfig& cfg, const DiTWeights& w, const Tensor& x, const Tensor& t, const Tensor& context,
                   const std::vector<int64_t>& context_lens, int64_t seq_len = 0, const DiTHook& hook = {},
                   bool fp8_block_gemms = false);

}  // namespace wan
