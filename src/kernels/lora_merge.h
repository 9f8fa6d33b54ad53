// LoRA / full-delta merge into an fp32 weight on the GPU: w[o, i] += delta[o, i], with
//   delta = Σ_terms scale_t · (Σ_r up_t[o, r] · down_t[r, i])  +  Σ_diffs scale_d · diff_d[o, i].
// Used by the streaming weight upload (runtime/load_gpu.h) on the tensor assembled in fp32, before it
// is rounded once to the run's storage dtype, and after a random draw.
//
// Numerics (the CPU merge in src/lora is written in the same order, so the two agree bit for bit):
// factors are read in their stored dtype (f32, bf16, f16) and widened exactly; each term's inner sum
// runs over r in increasing order with a separate multiply and add (no fused multiply-add, as the
// CPU build's -ffp-contract=off); delta starts at +0 and gets each term times its scale, then each
// diff times its scale, in the order given; w = w + delta is the only write. A weight without terms
// is left untouched (a zero-scale term should simply not be passed: w + 0 flips -0 to +0).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace wan::cuda {

struct LoraTermDev {
  const void* up = nullptr;    // [rows, rank], row-major, device
  const void* down = nullptr;  // [rank, cols], row-major, device
  DType up_dtype = DType::F32, down_dtype = DType::F32;  // F32, BF16 or F16
  int rank = 0;
  float scale = 1.0f;
};
struct DiffTermDev {
  const void* delta = nullptr;  // [rows, cols], device
  DType dtype = DType::F32;     // F32, BF16 or F16
  float scale = 1.0f;
};

constexpr int kMaxLoraTerms = 16;  // per weight: callers refuse more (split launches would round differently)
constexpr int kMaxDiffTerms = 16;

// w [rows, cols] on the device (a bias or a modulation table is rows = 1), of dtype w_dtype: F32, or
// BF16 merged in place as w = bf16(f32(w) + delta) with one rounding to nearest even: the same bits
// as widening to fp32, merging and rounding back, without the fp32 copy (a random draw's weights,
// already on the device). Throws wan::Error on more terms than the limits, a bad dtype or a null pointer.
void lora_merge(void* w, DType w_dtype, int64_t rows, int64_t cols, const LoraTermDev* terms, int nterms,
                const DiffTermDev* diffs, int ndiffs, cudaStream_t stream);
inline void lora_merge_f32(float* w, int64_t rows, int64_t cols, const LoraTermDev* terms, int nterms,
                           const DiffTermDev* diffs, int ndiffs, cudaStream_t stream) {
  lora_merge(w, DType::F32, rows, cols, terms, nterms, diffs, ndiffs, stream);
}

}  // namespace wan::cuda
