// The fused guidance + solver step on the GPU (see sampler_gpu.h): one kernel template per (solver,
// CFG or not, float4 or scalar), each element run through step_element() of sampler/sampler_step.h,
// whose device branch uses __fmul_rn/__fadd_rn/__fsub_rn/__fdiv_rn, so nvcc cannot contract or
// reorder anything and the bits equal the CPU sampler's.
#include <algorithm>
#include <cstdint>
#include <utility>

#include "kernels/check.h"
#include "sampler/sampler_gpu.h"

namespace wan::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;  // grid-stride beyond

struct Args {
  StepCoeffs c;
  float guide;
  const float* cond;
  const float* uncond;  // kCfg only
  float* x;
  const float* m_last;  // UniPC, DPM++
  float* m_prev;        // in (UniPC) / out (this step's data prediction)
  float* xs;            // UniPC
  int64_t n;
};

template <SolverKind K, bool kCfg>
__device__ __forceinline__ void element(const StepCoeffs& c, float guide, float cond, float uncond, float& x,
                                        float m_last, float& m_prev, float& xs) {
  const float v = kCfg ? cfg_element(cond, uncond, guide) : cond;
  step_element(c, v, x, m_last, m_prev, xs, &x, &m_prev, &xs);
}

template <SolverKind K, bool kCfg, bool kVec>
__global__ void __launch_bounds__(kThreads) fused_step_kernel(const Args a) {
  StepCoeffs c = a.c;
  c.solver = K;  // a compile-time constant: the other solvers' branches fold away
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  constexpr bool kHist = solver_has_history(K);
  constexpr bool kUni = K == SolverKind::UniPC;
  int64_t tail = 0;
  if constexpr (kVec) {
    const int64_t groups = a.n / 4;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int64_t g = tid; g < groups; g += stride) {
      const float4 cv = reinterpret_cast<const float4*>(a.cond)[g];
      const float4 uv = kCfg ? reinterpret_cast<const float4*>(a.uncond)[g] : zero;
      float4 xv = reinterpret_cast<const float4*>(a.x)[g];
      const float4 ml = kHist ? reinterpret_cast<const float4*>(a.m_last)[g] : zero;
      float4 mp = kUni ? reinterpret_cast<const float4*>(a.m_prev)[g] : zero;  // DPM++ only writes it
      float4 sv = kUni ? reinterpret_cast<const float4*>(a.xs)[g] : zero;
      element<K, kCfg>(c, a.guide, cv.x, uv.x, xv.x, ml.x, mp.x, sv.x);
      element<K, kCfg>(c, a.guide, cv.y, uv.y, xv.y, ml.y, mp.y, sv.y);
      element<K, kCfg>(c, a.guide, cv.z, uv.z, xv.z, ml.z, mp.z, sv.z);
      element<K, kCfg>(c, a.guide, cv.w, uv.w, xv.w, ml.w, mp.w, sv.w);
      reinterpret_cast<float4*>(a.x)[g] = xv;
      if constexpr (kHist) reinterpret_cast<float4*>(a.m_prev)[g] = mp;
      if constexpr (kUni) reinterpret_cast<float4*>(a.xs)[g] = sv;
    }
    tail = groups * 4;
  }
  for (int64_t j = tail + tid; j < a.n; j += stride) {
    float xv = a.x[j];
    float mp = kUni ? a.m_prev[j] : 0.0f;
    float sv = kUni ? a.xs[j] : 0.0f;
    element<K, kCfg>(c, a.guide, a.cond[j], kCfg ? a.uncond[j] : 0.0f, xv, kHist ? a.m_last[j] : 0.0f, mp, sv);
    a.x[j] = xv;
    if constexpr (kHist) a.m_prev[j] = mp;
    if constexpr (kUni) a.xs[j] = sv;
  }
}

template <SolverKind K, bool kCfg>
void launch(const Args& a, bool vec, cudaStream_t s) {
  const int64_t work = vec ? a.n / 4 + a.n % 4 : a.n;
  const unsigned blocks = static_cast<unsigned>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, kMaxBlocks));
  if (vec) fused_step_kernel<K, kCfg, true><<<blocks, kThreads, 0, s>>>(a);
  else fused_step_kernel<K, kCfg, false><<<blocks, kThreads, 0, s>>>(a);
}

template <SolverKind K>
void launch(const Args& a, bool cfg, bool vec, cudaStream_t s) {
  if (cfg) launch<K, true>(a, vec, s);
  else launch<K, false>(a, vec, s);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// [a, a + an) and [b, b + bn) (floats) overlap.
bool overlaps(const float* a, size_t an, const float* b, size_t bn) {
  if (!a || !b) return false;
  return a < b + bn && b < a + an;
}

}  // namespace

SamplerGpu::SamplerGpu(SolverKind solver, size_t n, int device) : solver_(solver), n_(n), device_(device) {
  WAN_CHECK(n > 0, "sampler GPU: the sample needs at least one element");
  CUDA_CHECK(cudaSetDevice(device_));
  try {
    CUDA_CHECK(cudaMalloc(&x_, n_ * 4));
    CUDA_CHECK(cudaMemset(x_, 0, n_ * 4));
    if (solver_has_history(solver_)) {
      CUDA_CHECK(cudaMalloc(&m_last_, n_ * 4));
      CUDA_CHECK(cudaMalloc(&m_prev_, n_ * 4));
    }
    if (solver_ == SolverKind::UniPC) CUDA_CHECK(cudaMalloc(&xs_, n_ * 4));
    upload_state(SamplerState{});  // zero history
  } catch (...) {
    release();
    throw;
  }
}

SamplerGpu::SamplerGpu(SamplerGpu&& o) noexcept
    : solver_(o.solver_), n_(o.n_), device_(o.device_), index_(o.index_), x_(o.x_),
      m_last_(o.m_last_), m_prev_(o.m_prev_), xs_(o.xs_) {
  o.x_ = o.m_last_ = o.m_prev_ = o.xs_ = nullptr;
}

SamplerGpu& SamplerGpu::operator=(SamplerGpu&& o) noexcept {
  if (this != &o) {
    release();
    solver_ = o.solver_, n_ = o.n_, device_ = o.device_, index_ = o.index_;
    x_ = o.x_, m_last_ = o.m_last_, m_prev_ = o.m_prev_, xs_ = o.xs_;
    o.x_ = o.m_last_ = o.m_prev_ = o.xs_ = nullptr;
  }
  return *this;
}

SamplerGpu::~SamplerGpu() { release(); }

void SamplerGpu::release() noexcept {
  // No throws; cudaFree waits for the work queued on the buffers.
  if (x_ || m_last_ || m_prev_ || xs_) cudaSetDevice(device_);
  for (float* p : {x_, m_last_, m_prev_, xs_})
    if (p) cudaFree(p);
  x_ = m_last_ = m_prev_ = xs_ = nullptr;
}

void SamplerGpu::set_x(const float* src, cudaStream_t stream) {
  WAN_CHECK(src != nullptr, "sampler GPU: set_x from null");
  CUDA_CHECK(cudaSetDevice(device_));
  CUDA_CHECK(cudaMemcpyAsync(x_, src, n_ * 4, cudaMemcpyDefault, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

void SamplerGpu::get_x(float* dst, cudaStream_t stream) const {
  WAN_CHECK(dst != nullptr, "sampler GPU: get_x into null");
  CUDA_CHECK(cudaSetDevice(device_));
  CUDA_CHECK(cudaMemcpyAsync(dst, x_, n_ * 4, cudaMemcpyDefault, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

void SamplerGpu::step(const StepCoeffs& c, const float* cond, const float* uncond, float guide, cudaStream_t stream) {
  WAN_CHECK(c.solver == solver_, "sampler GPU: ", solver_name(c.solver), " coefficients given to a ",
            solver_name(solver_), " sampler");
  WAN_CHECK(c.index == index_, "sampler GPU: the coefficients are for step ", c.index, ", the state is at step ",
            index_);
  WAN_CHECK(cond != nullptr, "sampler GPU: step() needs the model output");
  for (const float* in : {cond, uncond})
    WAN_CHECK(!overlaps(in, n_, x_, n_) && !overlaps(in, n_, m_last_, n_) &&
                  !overlaps(in, n_, m_prev_, n_) && !overlaps(in, n_, xs_, n_),
              "sampler GPU: the model output overlaps the sampler state");
  Args a;
  a.c = c;
  a.guide = guide;
  a.cond = cond;
  a.uncond = uncond;
  a.x = x_;
  a.m_last = m_last_;
  a.m_prev = m_prev_;
  a.xs = xs_;
  a.n = static_cast<int64_t>(n_);
  const bool cfg = uncond != nullptr;
  // The state buffers are cudaMalloc'ed (256-byte aligned).
  const bool vec = aligned16(cond) && (uncond == nullptr || aligned16(uncond));
  CUDA_CHECK(cudaSetDevice(device_));
  switch (solver_) {
    case SolverKind::UniPC: launch<SolverKind::UniPC>(a, cfg, vec, stream); break;
    case SolverKind::DpmPP: launch<SolverKind::DpmPP>(a, cfg, vec, stream); break;
    case SolverKind::Euler: launch<SolverKind::Euler>(a, cfg, vec, stream); break;
    case SolverKind::StepDistill: launch<SolverKind::StepDistill>(a, cfg, vec, stream); break;
  }
  CUDA_CHECK(cudaGetLastError());
  if (solver_has_history(solver_)) std::swap(m_last_, m_prev_);  // M = [M[-1], m]
  ++index_;
}

SamplerState SamplerGpu::download_state(cudaStream_t stream) const {
  SamplerState st;
  st.index = index_;
  if (index_ == 0) return st;
  st.n = n_;
  CUDA_CHECK(cudaSetDevice(device_));
  auto get = [&](std::vector<float>& v, const float* p) {
    v.resize(n_);
    CUDA_CHECK(cudaMemcpyAsync(v.data(), p, n_ * 4, cudaMemcpyDeviceToHost, stream));
  };
  if (solver_has_history(solver_)) {
    get(st.m_last, m_last_);
    get(st.m_prev, m_prev_);
  }
  if (solver_ == SolverKind::UniPC) get(st.last_sample, xs_);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return st;
}

void SamplerGpu::upload_state(const SamplerState& st, cudaStream_t stream) {
  WAN_CHECK(st.index >= 0, "sampler GPU state: negative step index ", st.index);
  CUDA_CHECK(cudaSetDevice(device_));
  if (st.index == 0) {
    WAN_CHECK(st.m_last.empty() && st.m_prev.empty() && st.last_sample.empty(),
              "sampler GPU state: step 0 has no history, but history vectors were given");
    for (float* p : {m_last_, m_prev_, xs_})
      if (p) CUDA_CHECK(cudaMemsetAsync(p, 0, n_ * 4, stream));
  } else {
    const size_t want_m = solver_has_history(solver_) ? n_ : 0, want_s = solver_ == SolverKind::UniPC ? n_ : 0;
    WAN_CHECK(st.n == n_, "sampler GPU state: ", st.n, " elements, this sampler has ", n_);
    WAN_CHECK(st.m_last.size() == want_m && st.m_prev.size() == want_m && st.last_sample.size() == want_s,
              "sampler GPU state: ", solver_name(solver_), " at step ", st.index, " needs ", want_m, " + ", want_m,
              " + ", want_s, " history values (m_last, m_prev, last_sample), got ", st.m_last.size(), " + ",
              st.m_prev.size(), " + ", st.last_sample.size());
    auto put = [&](float* p, const std::vector<float>& v) {
      if (p) CUDA_CHECK(cudaMemcpyAsync(p, v.data(), n_ * 4, cudaMemcpyHostToDevice, stream));
    };
    put(m_last_, st.m_last);
    put(m_prev_, st.m_prev);
    put(xs_, st.last_sample);
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
  index_ = st.index;
}

}  // namespace wan::cuda
