// The LoRA merge kernel (lora_merge.h). Tiles of 64 x 64 weights per block of 256 threads, each
// thread 4 rows x 4 consecutive columns; per term the factors stream through shared memory 16 ranks
// at a time. Separate __fmul_rn / __fadd_rn keep the order and roundings of the CPU merge.
#include "kernels/lora_merge.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/error.h"
#include "kernels/check.h"

namespace wan::cuda {
namespace {

constexpr int kTile = 64, kRc = 16, kThreads = 256;

struct MergeParams {
  LoraTermDev terms[kMaxLoraTerms];
  DiffTermDev diffs[kMaxDiffTerms];
  int nterms = 0, ndiffs = 0;
};

__device__ __forceinline__ float load_elem(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::F16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <class W>
__global__ void __launch_bounds__(kThreads) merge_kernel(W* w, int64_t rows, int64_t cols, MergeParams prm) {
  __shared__ float s_up[kTile][kRc + 1];
  __shared__ float s_down[kRc][kTile];
  const int tid = static_cast<int>(threadIdx.x);
  const int ty = tid / 16, tx = tid % 16;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile, col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  float delta[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) delta[i][j] = 0.0f;

  for (int t = 0; t < prm.nterms; ++t) {
    const LoraTermDev& term = prm.terms[t];
    float s[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) s[i][j] = 0.0f;
    for (int r0 = 0; r0 < term.rank; r0 += kRc) {
      const int rc = min(kRc, term.rank - r0);
      for (int e = tid; e < kTile * kRc; e += kThreads) {  // up[row0 + a, r0 + b]
        const int a = e / kRc, b = e % kRc;
        const int64_t row = row0 + a;
        s_up[a][b] = (row < rows && b < rc) ? load_elem(term.up, term.up_dtype, row * term.rank + r0 + b) : 0.0f;
      }
      for (int e = tid; e < kRc * kTile; e += kThreads) {  // down[r0 + a, col0 + b]
        const int a = e / kTile, b = e % kTile;
        const int64_t col = col0 + b;
        s_down[a][b] = (col < cols && a < rc) ? load_elem(term.down, term.down_dtype, (r0 + a) * cols + col) : 0.0f;
      }
      __syncthreads();
      for (int rr = 0; rr < rc; ++rr) {
        float a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = s_up[ty * 4 + i][rr];
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = s_down[rr][tx * 4 + j];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) s[i][j] = __fadd_rn(s[i][j], __fmul_rn(a[i], b[j]));
      }
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) delta[i][j] = __fadd_rn(delta[i][j], __fmul_rn(term.scale, s[i][j]));
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + ty * 4 + i;
    if (row >= rows) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t col = col0 + tx * 4 + j;
      if (col >= cols) continue;
      const int64_t idx = row * cols + col;
      float d = delta[i][j];
      for (int k = 0; k < prm.ndiffs; ++k)
        d = __fadd_rn(d, __fmul_rn(prm.diffs[k].scale, load_elem(prm.diffs[k].delta, prm.diffs[k].dtype, idx)));
      store(w + idx, __fadd_rn(widen(w[idx]), d));
    }
  }
}

bool factor_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

}  // namespace

void lora_merge(void* w, DType w_dtype, int64_t rows, int64_t cols, const LoraTermDev* terms, int nterms,
                const DiffTermDev* diffs, int ndiffs, cudaStream_t stream) {
  WAN_CHECK(w_dtype == DType::F32 || w_dtype == DType::BF16, "LoRA merge: weight dtype ", dtype_name(w_dtype),
            " (expected f32 or bf16)");
  WAN_CHECK(nterms >= 0 && nterms <= kMaxLoraTerms, "LoRA merge: ", nterms, " low-rank terms on one weight (at most ",
            kMaxLoraTerms, ")");
  WAN_CHECK(ndiffs >= 0 && ndiffs <= kMaxDiffTerms, "LoRA merge: ", ndiffs, " full-delta terms on one weight (at most ",
            kMaxDiffTerms, ")");
  if (rows <= 0 || cols <= 0 || nterms + ndiffs == 0) return;
  WAN_CHECK(w != nullptr, "LoRA merge: no weight");
  MergeParams p;
  p.nterms = nterms;
  p.ndiffs = ndiffs;
  for (int i = 0; i < nterms; ++i) {
    const LoraTermDev& t = terms[i];
    WAN_CHECK(t.up && t.down && t.rank >= 1, "LoRA merge: term ", i, " has no factors or rank ", t.rank);
    WAN_CHECK(factor_dtype(t.up_dtype) && factor_dtype(t.down_dtype), "LoRA merge: factor dtypes ",
              dtype_name(t.up_dtype), "/", dtype_name(t.down_dtype), " (expected f32, bf16 or f16)");
    p.terms[i] = t;
  }
  for (int i = 0; i < ndiffs; ++i) {
    WAN_CHECK(diffs[i].delta && factor_dtype(diffs[i].dtype), "LoRA merge: full-delta term ", i,
              " has no data or dtype ", dtype_name(diffs[i].dtype));
    p.diffs[i] = diffs[i];
  }
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile));
  WAN_CHECK(grid.y <= 65535u, "LoRA merge: ", rows, " rows is too many for one launch");
  if (w_dtype == DType::BF16)
    merge_kernel<<<grid, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(w), rows, cols, p);
  else
    merge_kernel<<<grid, kThreads, 0, stream>>>(static_cast<float*>(w), rows, cols, p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace wan::cuda
