// UMT5-XXL text encoder (encoder only), float32 CPU reference (spec §4.1, §4.2, §9 item 12).
// Weights are named like the official T5Encoder state dict (spec §4.4), the engine's internal
// naming; other layouts are mapped through a loader (t5_hf_loader for Hugging Face / diffusers).
//
// Numerics (float32 throughout, by design: the reference runs bf16, this is the exact-math
// reference the GPU path is compared with):
// - embedding rows, no scaling; per block: x += o(attn(norm1(x))), x += fc2(fc1(a) * gelu_tanh(gate(a)))
//   with a = norm2(x); final RMSNorm;
// - T5 RMSNorm: y = fp32(x * rsqrt(mean(x^2) + eps)) * w (no mean subtraction, no bias);
// - attention: scores = q.k^T (NO 1/sqrt(d) scaling) + per-layer relative position bias
//   (bidirectional buckets, t5_relative_bucket), keys with mask 0 excluded (the reference adds
//   finfo.min: exp() of that is exactly 0 in fp32), softmax in fp32.
// Invariants: GEMMs go through wan::ops::linear (fixed summation order: results do not depend on
// the thread count); inputs are checked (ids in range, mask has a real token) with wan::Error.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/config.h"
#include "models/umt5/weights.h"

namespace wan {

class SafetensorsSet;

// Returns the tensor stored under an official name (spec §4.4), as f32 (other float dtypes are
// converted on load); throws wan::Error when it is missing.
using T5TensorLoader = std::function<Tensor(const std::string& official_name)>;

// Loads and shape-checks every tensor of the config; errors name the tensor and both shapes.
T5Weights load_t5_weights(const T5Config& cfg, const T5TensorLoader& load);

// Loader over a Hugging Face / diffusers UMT5EncoderModel checkpoint (names mapped with
// t5_official_to_hf; "encoder.embed_tokens.weight" stands in for a missing "shared.weight").
// The set must outlive the loader.
T5TensorLoader t5_hf_loader(const SafetensorsSet& set);

// Full forward over L positions: out [L, dim]. mask [L] (nullable = all ones): keys with mask 0 are
// excluded from every query's softmax; rows of masked positions are still computed (as the
// reference does). ids must lie in [0, vocab).
Tensor t5_forward(const T5Config& cfg, const T5Weights& w, const int32_t* ids, const int32_t* mask, int64_t L);

// What the pipeline needs: the embeddings of the first `length` tokens (spec §4.2 step 4), [length, dim].
// Computing only those rows is exact: for them every padded key is masked and all other operations
// are row-wise, so the padded positions cannot influence them.
Tensor t5_encode(const T5Config& cfg, const T5Weights& w, const int32_t* ids, int64_t length);

}  // namespace wan
