// cuBLASLt wrapper for the Linear layers (see gemm.h for the contract).
// Row-major y[M, N] = x[M, K]·w[N, K]ᵀ is, in cuBLASLt's column-major terms, D[N, M] = op(A)·B with
// A = w viewed as a column-major [K, N] matrix (ld K) and op = transpose, B = x as a column-major
// [K, M] matrix (ld K), D = y as column-major [N, M] (ld N): the "TN" layout the fastest Hopper kernels
// use. The bias is then a per-row vector of D, which is what cuBLASLt's BIAS epilogue adds. For FP8 the
// same mapping makes w cuBLASLt's A (outer-vector scale of N entries: scale_w) and x its B (M entries:
// scale_x); TN is also the only FP8 layout cuBLASLt accepts on Hopper.
#include "kernels/gemm.h"

#include <cublasLt.h>

#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "core/error.h"
#include "kernels/check.h"
#include "kernels/gemm_epilogue.h"

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
    case DType::F8E4M3: return CUDA_R_8F_E4M3;
    default: WAN_THROW("GemmRunner: unsupported dtype ", dtype_name(t));
  }
}

constexpr int32_t kNoScaleMode = -1;  // bf16 / fp32 plans: no scale attributes at all

struct PlanKey {
  int64_t M, N, K;
  DType in, out;
  bool bias;
  Act act;
  uint32_t align_x, align_w, align_y;
  int32_t scale_mode = kNoScaleMode;  // FP8: CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F for A and B
  bool fast_accum = false;            // FP8: Fp8Accumulate::Fast
  auto tie() const {
    return std::tie(M, N, K, in, out, bias, act, align_x, align_w, align_y, scale_mode, fast_accum);
  }
  bool operator<(const PlanKey& o) const { return tie() < o.tie(); }
};

cublasLtEpilogue_t epilogue_of(const PlanKey& k) {
  if (k.act == Act::GeluTanh) return k.bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  return k.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

// The matmul descriptor of a plan: fp32 compute, TN, the epilogue; FP8 adds the scale modes, the
// scale pointers of this call (rewritten before every launch) and the bf16 bias type.
void set_desc_attributes(cublasLtMatmulDesc_t desc, const PlanKey& k, const void* bias, const float* scale_a,
                         const float* scale_b) {
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const cublasLtEpilogue_t epi = epilogue_of(k);
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (k.bias)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  if (k.scale_mode == kNoScaleMode) return;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &k.scale_mode,
                                              sizeof(k.scale_mode)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &k.scale_mode,
                                              sizeof(k.scale_mode)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_a, sizeof(scale_a)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_b, sizeof(scale_b)));
  const int8_t fast = k.fast_accum ? 1 : 0;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
  if (k.bias) {
    const int32_t bias_type = CUDA_R_16BF;  // cuBLASLt's FP8 table: bf16 bias for bf16 and fp32 D
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                sizeof(bias_type)));
  }
}

std::string describe(const PlanKey& k, size_t workspace_bytes) {
  return cat("y[", k.M, ", ", k.N, "] = x[", k.M, ", ", k.K, "]·w[", k.N, ", ", k.K, "]ᵀ (", dtype_name(k.in),
             " -> ", dtype_name(k.out), k.bias ? ", bias" : "", k.act == Act::GeluTanh ? ", gelu" : "",
             k.scale_mode == kNoScaleMode ? "" : ", outer-vector scales", k.fast_accum ? ", fast accumulation" : "",
             "; alignments x ", k.align_x, " w ",
             k.align_w, " y ", k.align_y, ", workspace ", workspace_bytes, " bytes)");
}

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

  // The plan of k, built and cached on first use. Without an algorithm: an error naming the problem, or,
  // when `may_fail` (the FP8 fused-epilogue attempt), null for any refusal (the caller then builds the
  // plain plan, whose own errors are reported). bias and the scales are this call's pointers.
  Plan* plan_for(const PlanKey& k, const void* bias, const float* scale_a, const float* scale_b, bool may_fail) {
    auto it = plans.find(k);
    if (it != plans.end()) return &it->second;
    Plan p;
    try {
      CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      set_desc_attributes(p.desc, k, bias, scale_a, scale_b);
      const cudaDataType_t tin = cuda_type(k.in), tout = cuda_type(k.out);
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, tin, static_cast<uint64_t>(k.K), static_cast<uint64_t>(k.N), k.K));
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, tin, static_cast<uint64_t>(k.K), static_cast<uint64_t>(k.M), k.K));
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, tout, static_cast<uint64_t>(k.N), static_cast<uint64_t>(k.M), k.N));
      WAN_CHECK(find_algo(k, p), "GemmRunner: cuBLASLt has no algorithm for ", describe(k, workspace_bytes));
    } catch (const Error&) {
      p.destroy();
      if (may_fail) return nullptr;
      throw;
    } catch (...) {
      p.destroy();
      throw;
    }
    return &plans.emplace(k, p).first->second;
  }

  // The heuristic's best algorithm for the plan's descriptors and k's alignments; false when none.
  bool find_algo(const PlanKey& k, Plan& p) {
    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const uint64_t ws = workspace_bytes;
    const uint32_t aa = k.align_w, ab = k.align_x, ad = k.align_y;
    cublasStatus_t st =
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
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
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) return false;  // the caller reports it with the shape
    CUBLAS_CHECK(st);
    if (found < 1) return false;
    p.algo = result.algo;
    return true;
  }

  void drop(const PlanKey& k) {
    auto it = plans.find(k);
    if (it == plans.end()) return;
    it->second.destroy();
    plans.erase(it);
  }

  // A stream of the runner's own for the first launch of an FP8 fused-epilogue plan made while the
  // caller's stream is being captured: a refusal must not reach the capture (created on first need).
  cudaStream_t trial = nullptr;
  cudaStream_t trial_stream() {
    if (!trial) CUDA_CHECK(cudaStreamCreateWithFlags(&trial, cudaStreamNonBlocking));
    return trial;
  }
  // FP8 state: fused (bias / GELU) keys cuBLASLt refused, the epilogue mode, separate-epilogue calls.
  std::set<PlanKey> fp8_unfused;
  Fp8Epilogue fp8_epilogue = Fp8Epilogue::Auto;
  Fp8Accumulate fp8_accumulate = Fp8Accumulate::Fast;
  size_t fp8_separate = 0;
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
  if (impl_->trial) cudaStreamDestroy(impl_->trial);
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
  Plan& p = *impl_->plan_for(key, bias, nullptr, nullptr, false);
  if (bias)  // the descriptor is shared by every call of this shape; the pointer is read at launch
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(impl_->handle, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.d, y, p.d, &p.algo,
                              impl_->workspace, impl_->workspace_bytes, stream));
}

// FP8: the fused plan (bias / GELU in cuBLASLt's epilogue) when cuBLASLt plans and launches it, else the
// plain plan followed by bias_act_rows. A fused key refused once is remembered and not tried again.
void GemmRunner::run_fp8(const uint8_t* xq, const float* scale_x, const uint8_t* wq, const float* scale_w,
                         const void* bias, void* y, int64_t M, int64_t K, int64_t N, DType out_type, Act act,
                         cudaStream_t stream) {
  WAN_CHECK(M >= 0 && N >= 0 && K >= 1, "GemmRunner (fp8): bad shape M ", M, " K ", K, " N ", N);
  WAN_CHECK(out_type == DType::BF16 || out_type == DType::F32, "GemmRunner (fp8): output must be bf16 or f32, not ",
            dtype_name(out_type));
  const int64_t n_align = out_type == DType::BF16 ? 8 : 4;  // N·sizeof(y) % 16 == 0
  WAN_CHECK(K % 16 == 0 && N % n_align == 0, "GemmRunner (fp8): cuBLASLt needs K % 16 == 0 and N % ", n_align,
            " == 0 (16-byte rows), got K ", K, " N ", N);
  if (M == 0 || N == 0) return;
  WAN_CHECK(xq && wq && y && scale_x && scale_w, "GemmRunner (fp8): null xq, wq, y or scale");
  for (const void* ptr : {static_cast<const void*>(xq), static_cast<const void*>(wq), static_cast<const void*>(y),
                          static_cast<const void*>(scale_x), static_cast<const void*>(scale_w), bias})
    WAN_CHECK(alignment_of(ptr) >= 16, "GemmRunner (fp8): every pointer must be 16-byte aligned (cuBLASLt FP8)");
  PlanKey key{M, N, K, DType::F8E4M3, out_type, bias != nullptr, act, alignment_of(xq), alignment_of(wq),
              alignment_of(y), CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F,
              impl_->fp8_accumulate == Fp8Accumulate::Fast};
  auto launch = [&](Plan& p, cudaStream_t on) {
    for (auto [attr, ptr] : {std::pair{CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(scale_w)},
                             std::pair{CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(scale_x)}})
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, attr, &ptr, sizeof(ptr)));
    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(impl_->handle, p.desc, &alpha, wq, p.a, xq, p.b, &beta, y, p.d, y, p.d, &p.algo,
                          impl_->workspace, impl_->workspace_bytes, on);
  };
  const bool epilogue = bias != nullptr || act != Act::None;
  if (epilogue && impl_->fp8_epilogue == Fp8Epilogue::Auto && !impl_->fp8_unfused.count(key)) {
    const bool tried = impl_->plans.count(key) != 0;
    if (Plan* p = impl_->plan_for(key, bias, scale_w, scale_x, true)) {
      if (bias)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
      // A new plan's first launch, while `stream` is captured, runs on the trial stream (the same
      // buffers, whose contents a capture does not care about); the captured launch follows it.
      cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
      if (!tried) CUDA_CHECK(cudaStreamIsCapturing(stream, &cap));
      const bool trial = cap != cudaStreamCaptureStatusNone;
      const cublasStatus_t st = launch(*p, trial ? impl_->trial_stream() : stream);
      if (st == CUBLAS_STATUS_SUCCESS) {
        if (trial) CUBLAS_CHECK(launch(*p, stream));
        return;
      }
      if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE) CUBLAS_CHECK(st);
      impl_->drop(key);  // planned, but refused at launch: the separate epilogue from now on
    }
    impl_->fp8_unfused.insert(key);
  }
  key.bias = false;
  key.act = Act::None;
  CUBLAS_CHECK(launch(*impl_->plan_for(key, nullptr, scale_w, scale_x, false), stream));
  if (!epilogue) return;
  const auto* b = static_cast<const __nv_bfloat16*>(bias);
  if (out_type == DType::BF16) bias_act_rows(static_cast<__nv_bfloat16*>(y), b, M, N, act == Act::GeluTanh, stream);
  else bias_act_rows(static_cast<float*>(y), b, M, N, act == Act::GeluTanh, stream);
  ++impl_->fp8_separate;
}

void GemmRunner::linear_fp8(const uint8_t* xq, const float* scale_x, const uint8_t* wq, const float* scale_w,
                            const __nv_bfloat16* bias, __nv_bfloat16* y, int64_t M, int64_t K, int64_t N, Act act,
                            cudaStream_t stream) {
  run_fp8(xq, scale_x, wq, scale_w, bias, y, M, K, N, DType::BF16, act, stream);
}
void GemmRunner::linear_fp8(const uint8_t* xq, const float* scale_x, const uint8_t* wq, const float* scale_w,
                            const __nv_bfloat16* bias, float* y, int64_t M, int64_t K, int64_t N, Act act,
                            cudaStream_t stream) {
  run_fp8(xq, scale_x, wq, scale_w, bias, y, M, K, N, DType::F32, act, stream);
}

void GemmRunner::set_fp8_epilogue(Fp8Epilogue e) { impl_->fp8_epilogue = e; }
void GemmRunner::set_fp8_accumulate(Fp8Accumulate a) { impl_->fp8_accumulate = a; }
Fp8Accumulate GemmRunner::fp8_accumulate() const { return impl_->fp8_accumulate; }
size_t GemmRunner::fp8_separate_epilogues() const { return impl_->fp8_separate; }

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

namespace {

// One 64x64x64 FP8 GEMM with outer-vector scales (no epilogue) through a GemmRunner on `device`, with its
// own buffers and stream; every failure, from the device check to the launch, reads as "no".
bool probe_fp8(int device) {
  int count = 0, major = 0, minor = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the non-sticky error of a failed query
    return false;
  }
  if (major * 10 + minor < 89) return false;
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return false;
  constexpr int64_t n = 64;
  constexpr size_t ws = GemmRunner::kWorkspaceBytes, op = n * n, vec = 256, total = ws + 2 * op + 2 * vec + 2 * n * n;
  uint8_t* mem = nullptr;
  cudaStream_t stream = nullptr;
  bool ok = false;
  try {
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaMalloc(&mem, total));
    CUDA_CHECK(cudaMemset(mem, 0, total));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    {
      GemmRunner runner(mem, ws);
      uint8_t* xq = mem + ws;
      uint8_t* wq = xq + op;
      auto* sx = reinterpret_cast<float*>(wq + op);
      auto* sw = reinterpret_cast<float*>(wq + op + vec);
      auto* y = reinterpret_cast<__nv_bfloat16*>(wq + op + 2 * vec);
      runner.linear_fp8(xq, sx, wq, sw, nullptr, y, n, n, n, Act::None, stream);
      CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    ok = true;
  } catch (const std::exception&) {
    ok = false;
  }
  if (stream) cudaStreamDestroy(stream);
  if (mem) cudaFree(mem);
  cudaSetDevice(previous);
  return ok;
}

}  // namespace

bool fp8_supported(int device) {
  static std::mutex mu;
  static std::map<int, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find(device);
  if (it != known.end()) return it->second;
  return known[device] = probe_fp8(device);
}

}  // namespace wan::cuda
