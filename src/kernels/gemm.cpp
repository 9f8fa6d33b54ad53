// cuBLASLt wrapper for the Linear layers (see gemm.h for the contract).
// Row-major y[M, N] = x[M, K]·w[N, K]ᵀ is, in cuBLASLt's column-major terms, D[N, M] = op(A)·B with
// A = w viewed as a column-major [K, N] matrix (ld K) and op = transpose, B = x as a column-major
// [K, M] matrix (ld K), D = y as column-major [N, M] (ld N): the "TN" layout the fastest Hopper kernels
// use. The bias is then a per-row vector of D, which is what cuBLASLt's BIAS epilogue adds.
#include "kernels/gemm.h"

#include <cublasLt.h>

#include <map>
#include <tuple>

#include "core/error.h"
#include "kernels/check.h"

namespace wan::cuda {
namespace {

// Largest power of two (<= 256) dividing the address: the alignment the heuristic may assume.
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  const uintptr_t low = a & (~a + 1);
  return static_cast<uint32_t>(low >= 256 ? 256 : low);
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::BF16: return CUDA_R_16BF;
    case DType::F32: return CUDA_R_32F;
    default: WAN_THROW("GemmRunner: unsupported dtype ", dtype_name(t));
  }
}

struct PlanKey {
  int64_t M, N, K;
  DType in, out;
  bool bias;
  Act act;
  uint32_t align_x, align_w, align_y;
  auto tie() const { return std::tie(M, N, K, in, out, bias, act, align_x, align_w, align_y); }
  bool operator<(const PlanKey& o) const { return tie() < o.tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  void destroy() {
    // Destruction cannot fail in a way we could act on; statuses are ignored on purpose.
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (desc) cublasLtMatmulDescDestroy(desc);
    a = b = d = nullptr;
    desc = nullptr;
  }
};

}  // namespace

struct GemmRunner::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::map<PlanKey, Plan> plans;

  Plan& plan_for(const PlanKey& k, const void* bias) {
    auto it = plans.find(k);
    if (it != plans.end()) return it->second;
    Plan p;
    try {
      CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
      cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
      if (k.act == Act::GeluTanh)
        epi = k.bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
      else if (k.bias)
        epi = CUBLASLT_EPILOGUE_BIAS;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
      if (k.bias)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
      const cudaDataType_t tin = cuda_type(k.in), tout = cuda_type(k.out);
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, tin, static_cast<uint64_t>(k.K), static_cast<uint64_t>(k.N), k.K));
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, tin, static_cast<uint64_t>(k.K), static_cast<uint64_t>(k.M), k.K));
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, tout, static_cast<uint64_t>(k.N), static_cast<uint64_t>(k.M), k.N));

      cublasLtMatmulPreference_t pref = nullptr;
      CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
      {
        const uint64_t ws = workspace_bytes;
        const uint32_t aa = k.align_w, ab = k.align_x, ad = k.align_y;
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
        if (st == CUBLAS_STATUS_SUCCESS)
          st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa));
        if (st == CUBLAS_STATUS_SUCCESS)
          st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof(ab));
        if (st == CUBLAS_STATUS_SUCCESS)
          st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof(ad));
        if (st == CUBLAS_STATUS_SUCCESS)
          st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof(ad));
        if (st == CUBLAS_STATUS_SUCCESS)
          st = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
      }
      cublasLtMatmulPreferenceDestroy(pref);
      if (st == CUBLAS_STATUS_NOT_SUPPORTED) found = 0;  // reported below with the shape
      else CUBLAS_CHECK(st);
      WAN_CHECK(found >= 1, "GemmRunner: cuBLASLt has no algorithm for y[", k.M, ", ", k.N, "] = x[", k.M, ", ", k.K,
                "]·w[", k.N, ", ", k.K, "]ᵀ (", dtype_name(k.in), " -> ", dtype_name(k.out),
                k.bias ? ", bias" : "", k.act == Act::GeluTanh ? ", gelu" : "", "; alignments x ", k.align_x, " w ",
                k.align_w, " y ", k.align_y, ", workspace ", workspace_bytes, " bytes)");
      p.algo = result.algo;
    } catch (...) {
      p.destroy();
      throw;
    }
    return plans.emplace(k, p).first->second;
  }
};

GemmRunner::GemmRunner(void* workspace, size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  WAN_CHECK(workspace != nullptr || workspace_bytes == 0, "GemmRunner: null workspace of ", workspace_bytes,
            " bytes");
  impl_->workspace = workspace;
  impl_->workspace_bytes = workspace_bytes;
  CUBLAS_CHECK(cublasLtCreate(&impl_->handle));
}

GemmRunner::~GemmRunner() {
  for (auto& [k, p] : impl_->plans) p.destroy();
  if (impl_->handle) cublasLtDestroy(impl_->handle);
}

size_t GemmRunner::plan_count() const { return impl_->plans.size(); }

void GemmRunner::run(const void* x, const void* w, const void* bias, void* y, int64_t M, int64_t K, int64_t N,
                     DType in_type, DType out_type, Act act, cudaStream_t stream) {
  WAN_CHECK(M >= 0 && N >= 0 && K >= 1, "GemmRunner: bad shape M ", M, " K ", K, " N ", N);
  WAN_CHECK((in_type == DType::BF16 || in_type == DType::F32) && (out_type == DType::BF16 || out_type == DType::F32),
            "GemmRunner: unsupported dtypes ", dtype_name(in_type), " -> ", dtype_name(out_type));
  WAN_CHECK(!(in_type == DType::F32 && out_type == DType::BF16), "GemmRunner: fp32 inputs need an fp32 output");
  // No fp32 GELU in the model (the time MLP uses SiLU), so that epilogue stays unsupported and untested.
  WAN_CHECK(!(in_type == DType::F32 && act == Act::GeluTanh), "GemmRunner: GELU epilogue needs bf16 inputs");
  if (M == 0 || N == 0) return;
  WAN_CHECK(x && w && y, "GemmRunner: null x, w or y");
  const PlanKey key{M, N, K, in_type, out_type, bias != nullptr, act, alignment_of(x), alignment_of(w),
                    alignment_of(y)};
  Plan& p = impl_->plan_for(key, bias);
  if (bias)  // the descriptor is shared by every call of this shape; the pointer is read at launch
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(impl_->handle, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.d, y, p.d, &p.algo,
                              impl_->workspace, impl_->workspace_bytes, stream));
}

void GemmRunner::linear(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, __nv_bfloat16* y,
                        int64_t M, int64_t K, int64_t N, Act act, cudaStream_t stream) {
  run(x, w, bias, y, M, K, N, DType::BF16, DType::BF16, act, stream);
}
void GemmRunner::linear(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias, float* y, int64_t M,
                        int64_t K, int64_t N, Act act, cudaStream_t stream) {
  run(x, w, bias, y, M, K, N, DType::BF16, DType::F32, act, stream);
}
void GemmRunner::linear(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t K, int64_t N,
                        Act act, cudaStream_t stream) {
  run(x, w, bias, y, M, K, N, DType::F32, DType::F32, act, stream);
}

}  // namespace wan::cuda
