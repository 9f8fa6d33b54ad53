// THE weight table of the UMT5-XXL encoder (the official T5Encoder, spec §4.4), in its registration
// order. GPU storage: bf16 for the token embedding and the GEMM weights, fp32 for the RMSNorm weights and
// the relative-position tables (read by fp32 kernels). Fusion: q|k|v and gate|fc1 (one GEMM each).
#pragma once
#include <vector>

#include "core/tensor.h"
#include "models/config.h"
#include "models/weight_spec.h"

namespace wan {

WeightTable umt5_weight_table(const T5Config& c);  // throws wan::Error on an inconsistent config

// The loaded weights, one typed member per table row (the CPU and GPU encoders read them).
struct T5Block {                // official prefix "blocks.{i}."
  Tensor norm1;                 // [dim]                   norm1.weight
  Tensor q, k, v;               // [dim_attn, dim]         attn.{q,k,v}.weight
  Tensor o;                     // [dim, dim_attn]         attn.o.weight
  Tensor pos_embedding;         // [num_buckets, heads]    pos_embedding.embedding.weight
  Tensor norm2;                 // [dim]                   norm2.weight
  Tensor ffn_gate;              // [dim_ffn, dim]          ffn.gate.0.weight (GELU branch)
  Tensor ffn_fc1;               // [dim_ffn, dim]          ffn.fc1.weight (linear branch)
  Tensor ffn_fc2;               // [dim, dim_ffn]          ffn.fc2.weight
};

struct T5Weights {
  Tensor token_embedding;       // [vocab, dim]            token_embedding.weight
  std::vector<T5Block> blocks;  // num_layers
  Tensor norm;                  // [dim]                   norm.weight
};


}  // namespace wan
