// One solver step in coefficient form (spec §7.3, §7.4, §7.6): the scalar coefficients of a step,
// computed on the host by Sampler::plan_step() from the schedule and the step index alone, and the
// per-element update that applies them. The CPU sampler (sampler.cpp) and the fused GPU kernel
// (sampler_gpu.cu) both run step_element(), so the two share one definition of the arithmetic.
// Header-only plain data, so device code can include it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/rn_math.h"

#if defined(__CUDACC__)
#define WAN_SAMPLER_HD __host__ __device__ __forceinline__
#else
#define WAN_SAMPLER_HD inline
#endif

namespace wan {

// Numerics: every operation is one IEEE float32 op rounded to nearest, in the reference's order:
// no fused multiply-add, no reassociation. Host code is built with -ffp-contract=off; device code
// spells each op as an explicit _rn intrinsic, which nvcc never contracts. Divisions stay divisions.
//
// The state a step reads and writes, per element (the sampler's multistep history):
//   x       the sample the model saw (in), the sample at the next sigma (out)
//   m_last  M[-1], the last step's data prediction (UniPC, DPM++)
//   m_prev  M[-2] (UniPC, DPM++); its slot receives this step's data prediction m, after which the
//           caller swaps the roles of the m_prev and m_last buffers (M = [M[-1], m])
//   xs      UniPC only: the (corrected) sample that entered the last predictor (in), this step's (out)
// Before the first step the history is all zeros (none of it is read then).

// StepDistill: LightX2V's WanStepDistillScheduler.step_post (few-step distilled models): the data
// prediction m = x - v * sigma, re-noised to the next sigma as m + v * sigma_next (m itself on the
// last step). Same limit as Euler, different float32 rounding. No history.
enum class SolverKind { UniPC, DpmPP, Euler, StepDistill };

// "unipc", "dpm++", "euler", "step-distill" (the CLI's --sampler names; solver_from_name reads them).
inline const char* solver_name(SolverKind k) {
  switch (k) {
    case SolverKind::UniPC: return "unipc";
    case SolverKind::DpmPP: return "dpm++";
    case SolverKind::Euler: return "euler";
    case SolverKind::StepDistill: return "step-distill";
  }
  return "?";
}

// Whether the solver keeps the multistep history m_last / m_prev (UniPC also last_sample).
WAN_SAMPLER_HD constexpr bool solver_has_history(SolverKind k) {
  return k == SolverKind::UniPC || k == SolverKind::DpmPP;
}

// The scalars of one step. Orders: 0 = none (corrector) / land on the data prediction (update onto
// sigma = 0), 1 = first order, 2 = second order.
struct StepCoeffs {
  SolverKind solver = SolverKind::UniPC;
  int32_t index = 0;  // the step these coefficients perform
  float sigma = 0;    // data prediction m = x - sigma * v (UniPC, DPM++)
  float dt = 0;       // Euler: x + dt * v
  // StepDistill: x = m + v * renoise (sigma_{i+1}) with pred_order 1, x = m with pred_order 0 (last
  // step); round_bf16: the latent is rounded to bf16 on the way in and out (LightX2V's DTYPE=BF16).
  float renoise = 0;
  int32_t round_bf16 = 0;
  // UniPC corrector (UniC) of the sample the last predictor produced.
  int32_t corr_order = 0;
  float cc_x = 0, cc_m = 0, cc_res = 0;  // c_x * xs - c_m * m_last, minus c_res * residual
  float cc_r = 0;                        // order 2: D1 = (m_prev - m_last) / r
  float rho0 = 0, rho1 = 0;              // order 2: residual = rho0 * D1 + rho1 * (m - m_last)
  // UniPC predictor (UniP) / DPM++ update to the next sigma.
  int32_t pred_order = 0;
  float pc_x = 0, pc_m = 0;  // c_x * x - c_m * m
  float pc_res = 0;          // UniPC: c_res (times 0.5 * D1); DPM++: 0.5 * c_m (times D1)
  float pc_r = 0;            // UniPC: D1 = (m_last - m) / r; DPM++: D1 = (1 / r0) * (m - m_last)
};

// The resumable state of a run: the step index and the multistep history (host copies, roles as
// above). At index 0 every vector is empty; after it, UniPC has all three (each n floats), DPM++
// m_last and m_prev, Euler and StepDistill none. Sampler::state() / set_state() and cuda::SamplerGpu's
// download_state() / upload_state() use this one layout, so either can resume the other's run.
struct SamplerState {
  int index = 0;
  size_t n = 0;  // elements of the sample (0 at index 0)
  std::vector<float> m_last, m_prev, last_sample;
};

namespace sampler_math {

// One rounded float32 operation each (never contracted into an fma): core/rn_math.h.
using rn::add;
using rn::div;
using rn::mul;
using rn::sub;

// float32 -> bfloat16 -> float32, rounding to nearest even (torch's .to(torch.bfloat16); NaN stays NaN).
WAN_SAMPLER_HD float round_bf16(float a) {
#if defined(__CUDA_ARCH__)
  uint32_t u = __float_as_uint(a);
#else
  uint32_t u;
  __builtin_memcpy(&u, &a, 4);
#endif
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    u = 0x7fc00000u;
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
  }
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float r;
  __builtin_memcpy(&r, &u, 4);
  return r;
#endif
}

}  // namespace sampler_math

// Classifier-free guidance of one element, exactly as wan::cfg_combine: u + g * (c - u).
WAN_SAMPLER_HD float cfg_element(float cond, float uncond, float guide) {
  using namespace sampler_math;
  return add(uncond, mul(guide, sub(cond, uncond)));
}

// One element of a step (see the header comment for the roles). Inputs are taken by value, so the
// outputs may alias them. Euler and StepDistill read and write x only.
WAN_SAMPLER_HD void step_element(const StepCoeffs& c, float v, float x, float m_last, float m_prev, float xs,
                                 float* x_out, float* m_out, float* xs_out) {
  using namespace sampler_math;
  if (c.solver == SolverKind::Euler) {
    *x_out = add(x, mul(c.dt, v));
    return;
  }
  if (c.solver == SolverKind::StepDistill) {
    const float xin = c.round_bf16 ? round_bf16(x) : x;
    const float m = sub(xin, mul(v, c.sigma));
    const float out = c.pred_order == 0 ? m : add(m, mul(v, c.renoise));
    *x_out = c.round_bf16 ? round_bf16(out) : out;
    return;
  }
  const float m = sub(x, mul(c.sigma, v));  // this step's data prediction x0_hat
  *m_out = m;
  if (c.solver == SolverKind::DpmPP) {
    if (c.pred_order == 0) {
      *x_out = m;
    } else if (c.pred_order == 1) {
      *x_out = sub(mul(c.pc_x, x), mul(c.pc_m, m));
    } else {
      const float d1 = mul(c.pc_r, sub(m, m_last));
      *x_out = sub(sub(mul(c.pc_x, x), mul(c.pc_m, m)), mul(c.pc_res, d1));
    }
    return;
  }
  // UniPC: UniC corrects the sample the last predictor produced, using this step's prediction.
  if (c.corr_order == 2) {
    const float xt = sub(mul(c.cc_x, xs), mul(c.cc_m, m_last));
    const float d1 = div(sub(m_prev, m_last), c.cc_r);
    const float res = add(mul(c.rho0, d1), mul(c.rho1, sub(m, m_last)));
    x = sub(xt, mul(c.cc_res, res));
  } else if (c.corr_order == 1) {
    const float xt = sub(mul(c.cc_x, xs), mul(c.cc_m, m_last));
    x = sub(xt, mul(c.cc_res, mul(0.5f, sub(m, m_last))));
  }
  *xs_out = x;  // the corrected sample enters the predictor (and the next corrector)
  // UniP to the next sigma with M = [m_last, m].
  if (c.pred_order == 0) {
    *x_out = m;
  } else if (c.pred_order == 1) {
    *x_out = sub(mul(c.pc_x, x), mul(c.pc_m, m));
  } else {
    const float xt = sub(mul(c.pc_x, x), mul(c.pc_m, m));
    const float d1 = div(sub(m_last, m), c.pc_r);
    *x_out = sub(xt, mul(c.pc_res, mul(0.5f, d1)));
  }
}

}  // namespace wan
