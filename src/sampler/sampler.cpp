// The solvers (spec §7.3, §7.4, §7.6): flow UniPC (bh2, order 2, predict-x0, UniC corrector at every
// step but the first, lower order at the last step), flow DPM++ (2M midpoint, first order at the
// first and last steps), Euler and LightX2V's step-distill update.
// Invariants: scalar coefficients are computed in float32 with the reference's operations and
// grouping (each Python sub-expression on 0-dim float32 tensors becomes one rounded float op) by
// plan_step(); elementwise updates (step_element, sampler_step.h) follow the reference's evaluation
// order term by term. The step onto the
// final sigma 0 (lambda = +inf) is taken explicitly as x = data prediction, which is what the
// reference's IEEE arithmetic yields there (sigma_t/sigma_s = 0, alpha_t * (e^-inf - 1) = -1).
#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "sampler/sampler.h"

namespace wan {

namespace {

// float32 log / expm1 / exp rounded from double. The reference evaluates these on 0-dim float32 CPU
// tensors, i.e. with PyTorch's vectorized kernels, which agree with the correctly rounded value far
// more often than glibc's logf / expm1f do (measured: log 3 vs 17, expm1 1 vs 219 mismatches in 2000
// random arguments); with this choice every fixture step matches the reference bit for bit.
inline float logf_cr(float x) { return static_cast<float>(std::log(static_cast<double>(x))); }
inline float expm1f_cr(float x) { return static_cast<float>(std::expm1(static_cast<double>(x))); }
inline float expf_cr(float x) { return static_cast<float>(std::exp(static_cast<double>(x))); }

// Log-SNR of the flow parameterisation, lambda = ln(1 - sigma) - ln(sigma), in float32.
inline float lambda_of(float sigma) {
  const float alpha = 1.0f - sigma;
  return logf_cr(alpha) - logf_cr(sigma);
}

// Solves [[1, 1], [r, 1]] rho = [b1, b2] the way torch.linalg.solve does on the CPU (MKL sgesv):
// partial pivoting (rows swapped only when |r| > 1), pivots applied as reciprocals, and the
// right-hand side eliminated with a fused multiply-add. Matching it bit for bit keeps the corrector
// weights identical to the reference (a 1-ulp change would move x by ~1e-7 relative).
void solve_2x2(float r, float b1, float b2, float& rho0, float& rho1) {
  float a00 = 1.0f, a10 = r, c0 = b1, c1 = b2;  // the second column is all ones
  if (std::fabs(r) > 1.0f) {
    std::swap(a00, a10);
    std::swap(c0, c1);
  }
  const float l = a10 * (1.0f / a00);
  const float u11 = 1.0f - l;
  const float y1 = std::fma(-l, c0, c1);
  rho1 = y1 * (1.0f / u11);
  rho0 = (c0 - rho1) * (1.0f / a00);
}

// Coefficients of one B(h) = expm1(-h) (bh2) update from sigma_s to sigma_t, predict-x0 form:
// x_t = c_x * x - c_m * m0 - c_res * (weighted differences).
struct BhCoeffs {
  float c_x, c_m, c_res;
  float hh, phi1, B, h;
};

BhCoeffs bh2_coeffs(float sigma_t, float sigma_s0) {
  BhCoeffs c;
  const float alpha_t = 1.0f - sigma_t;
  c.h = lambda_of(sigma_t) - lambda_of(sigma_s0);
  c.hh = -c.h;
  c.phi1 = expm1f_cr(c.hh);
  c.B = expm1f_cr(c.hh);
  c.c_x = sigma_t / sigma_s0;
  c.c_m = alpha_t * c.phi1;
  c.c_res = alpha_t * c.B;
  return c;
}

}  // namespace

Sampler::Sampler(const SamplerConfig& c) : Sampler(c.solver, make_schedule(c), c.bf16_latents) {}

Sampler::Sampler(SolverKind solver, SigmaSchedule schedule, bool bf16_latents)
    : solver_(solver), sched_(std::move(schedule)), bf16_latents_(bf16_latents) {
  const auto& s = sched_.sigmas;
  WAN_CHECK(!sched_.timesteps.empty() && s.size() == sched_.timesteps.size() + 1,
            "sampler: a schedule needs steps >= 1 timesteps and steps + 1 sigmas (got ",
            sched_.timesteps.size(), " timesteps, ", s.size(), " sigmas)");
  if (sched_.model_t.empty())
    for (int64_t t : sched_.timesteps) sched_.model_t.push_back(static_cast<float>(t));
  WAN_CHECK(sched_.model_t.size() == sched_.timesteps.size(), "sampler: ", sched_.model_t.size(),
            " model timesteps for ", sched_.timesteps.size(), " steps");
  WAN_CHECK(!bf16_latents_ || solver_ == SolverKind::StepDistill,
            "sampler: bf16 latents are a step-distill option (solver is ", solver_name(solver_), ")");
  for (size_t i = 0; i < s.size(); ++i) {
    WAN_CHECK(std::isfinite(s[i]) && s[i] >= 0.0f && s[i] <= 1.0f, "sampler: sigma[", i, "] = ", s[i],
              " is outside [0, 1]");
    if (i > 0) WAN_CHECK(s[i] < s[i - 1], "sampler: sigmas must decrease strictly (sigma[", i, "] = ", s[i],
                         " after ", s[i - 1], ")");
  }
  WAN_CHECK(s.back() == 0.0f, "sampler: the last sigma must be 0 (got ", s.back(), ")");
  WAN_CHECK(solver_ != SolverKind::UniPC || s[0] < 1.0f,
            "sampler: UniPC needs sigma_0 < 1 (its corrector would take log(0)); got sigma_0 = 1");
}

int64_t Sampler::timestep() const {
  WAN_CHECK(!done(), "sampler: all ", steps(), " steps are done");
  return sched_.timesteps[static_cast<size_t>(index_)];
}

float Sampler::model_timestep() const {
  WAN_CHECK(!done(), "sampler: all ", steps(), " steps are done");
  return sched_.model_t[static_cast<size_t>(index_)];
}

void Sampler::reset() {
  index_ = 0;
  n_ = 0;
  history_external_ = false;
  m_prev_.clear();
  m_last_.clear();
  last_sample_.clear();
}

namespace {

// Order of the UniPC predictor of step k (lower order at the start and at the last steps).
int unipc_order(int k, int steps) { return std::min(std::min(2, steps - k), std::min(k, 2) + 1); }

}  // namespace

StepCoeffs Sampler::plan_step() const {
  WAN_CHECK(!done(), "sampler: step() called after all ", steps(), " steps");
  const auto& sg = sched_.sigmas;
  const int i = index_;
  const int N = steps();
  auto sig = [&](int k) { return sg[static_cast<size_t>(k)]; };
  StepCoeffs c;
  c.solver = solver_;
  c.index = i;
  switch (solver_) {
    case SolverKind::Euler: {
      c.dt = sig(i + 1) - sig(i);
      break;
    }
    case SolverKind::StepDistill: {
      // LightX2V step_post: sigma and sigma_next are .item() of float32 tensors, used as float32.
      c.sigma = sig(i);
      c.renoise = sig(i + 1);
      c.pred_order = i < N - 1 ? 1 : 0;  // its last step keeps the data prediction (sigma_N = 0)
      c.round_bf16 = bf16_latents_ ? 1 : 0;
      break;
    }
    case SolverKind::UniPC: {
      const float sigma = sig(i);
      c.sigma = sigma;
      // UniC: corrects the sample of step i-1's predictor, with that predictor's order.
      if (i > 0) {
        const float sigma_s0 = sig(i - 1);
        const BhCoeffs b = bh2_coeffs(sigma, sigma_s0);
        c.cc_x = b.c_x;
        c.cc_m = b.c_m;
        c.cc_res = b.c_res;
        c.corr_order = unipc_order(i - 1, N);
        if (c.corr_order == 2) {
          const float g1 = b.phi1 / b.hh - 1.0f;
          const float b1 = g1 * 1.0f / b.B;
          const float g2 = g1 / b.hh - 0.5f;
          const float b2 = g2 * 2.0f / b.B;
          const float lambda_s0 = lambda_of(sigma_s0);
          c.cc_r = (lambda_of(sig(i - 2)) - lambda_s0) / b.h;
          solve_2x2(c.cc_r, b1, b2, c.rho0, c.rho1);
        } else {
          WAN_ASSERT(c.corr_order == 1, "UniPC corrector order ", c.corr_order);
        }
      }
      // UniP to sigma_{i+1}.
      const int order = unipc_order(i, N);
      const float sigma_t = sig(i + 1);
      if (sigma_t == 0.0f) {
        WAN_ASSERT(order == 1, "UniPC final step with order ", order);
        c.pred_order = 0;
      } else {
        const BhCoeffs b = bh2_coeffs(sigma_t, sigma);
        c.pc_x = b.c_x;
        c.pc_m = b.c_m;
        c.pc_res = b.c_res;
        c.pred_order = order;
        if (order == 2) c.pc_r = (lambda_of(sig(i - 1)) - lambda_of(sigma)) / b.h;
      }
      break;
    }
    case SolverKind::DpmPP: {
      const float sigma_s0 = sig(i);
      const float sigma_t = sig(i + 1);
      c.sigma = sigma_s0;
      // final_sigmas_type "zero" forces first order at the last step; it lands on m0.
      const bool first_order = std::min(i, 2) < 1 || i == N - 1;
      if (sigma_t == 0.0f) {
        c.pred_order = 0;
      } else {
        const float alpha_t = 1.0f - sigma_t;
        const float lambda_t = lambda_of(sigma_t);
        const float lambda_s0 = lambda_of(sigma_s0);  // -inf when sigma_0 = 1: then h = +inf, e^-h = 0
        const float h = lambda_t - lambda_s0;
        c.pc_x = sigma_t / sigma_s0;
        c.pc_m = alpha_t * (expf_cr(-h) - 1.0f);
        if (first_order) {
          c.pred_order = 1;
        } else {
          // sigma_{i-1} = 1 gives h_0 = +inf, r0 = +inf, 1/r0 = 0: the history term vanishes, as in
          // the reference.
          const float h0 = lambda_s0 - lambda_of(sig(i - 1));
          const float r0 = h0 / h;
          c.pc_r = 1.0f / r0;
          c.pc_res = 0.5f * c.pc_m;
          c.pred_order = 2;
        }
      }
      break;
    }
  }
  return c;
}

StepCoeffs Sampler::take_step() {
  const StepCoeffs c = plan_step();
  ++index_;
  history_external_ = true;
  m_prev_ = {};
  m_last_ = {};
  last_sample_ = {};
  return c;
}

void Sampler::step(const float* v, float* x, size_t n) {
  WAN_CHECK(!done(), "sampler: step() called after all ", steps(), " steps");
  WAN_CHECK(v != nullptr && x != nullptr && n > 0, "sampler: step() needs non-empty v and x");
  WAN_CHECK(!history_external_, "sampler: step() after take_step(): the history is not on the host (set_state first)");
  if (index_ == 0) {
    n_ = n;
    if (solver_has_history(solver_)) {
      m_prev_.assign(n, 0.0f);
      m_last_.assign(n, 0.0f);
    }
    if (solver_ == SolverKind::UniPC) last_sample_.assign(n, 0.0f);
  }
  WAN_CHECK(n == n_, "sampler: step ", index_, " got ", n, " elements, the run started with ", n_);
  const StepCoeffs c = plan_step();
  float unused = 0.0f;
  switch (solver_) {
    case SolverKind::Euler:
    case SolverKind::StepDistill:
      for (size_t j = 0; j < n; ++j) step_element(c, v[j], x[j], 0.0f, 0.0f, 0.0f, &x[j], &unused, &unused);
      break;
    case SolverKind::DpmPP: {
      const float* ml = m_last_.data();
      float* mp = m_prev_.data();
      for (size_t j = 0; j < n; ++j) step_element(c, v[j], x[j], ml[j], mp[j], 0.0f, &x[j], &mp[j], &unused);
      break;
    }
    case SolverKind::UniPC: {
      const float* ml = m_last_.data();
      float* mp = m_prev_.data();
      float* xs = last_sample_.data();
      for (size_t j = 0; j < n; ++j) step_element(c, v[j], x[j], ml[j], mp[j], xs[j], &x[j], &mp[j], &xs[j]);
      break;
    }
  }
  // M = [M[-1], m]: the slot of M[-2] now holds m.
  std::swap(m_prev_, m_last_);
  ++index_;
}

SamplerState Sampler::state() const {
  WAN_CHECK(!history_external_, "sampler: the history of this run is kept outside the sampler (take_step)");
  SamplerState st;
  st.index = index_;
  if (index_ > 0) {
    st.n = n_;
    st.m_last = m_last_;
    st.m_prev = m_prev_;
    st.last_sample = last_sample_;
  }
  return st;
}

void Sampler::set_state(SamplerState st) {
  WAN_CHECK(st.index >= 0 && st.index <= steps(), "sampler state: step index ", st.index, " outside [0, ", steps(),
            "]");
  if (st.index == 0) {
    WAN_CHECK(st.m_last.empty() && st.m_prev.empty() && st.last_sample.empty(),
              "sampler state: step 0 has no history, but history vectors were given");
    reset();
    return;
  }
  WAN_CHECK(st.n > 0, "sampler state: step ", st.index, " needs the element count");
  const bool multistep = solver_has_history(solver_);
  const size_t want_m = multistep ? st.n : 0, want_s = solver_ == SolverKind::UniPC ? st.n : 0;
  WAN_CHECK(st.m_last.size() == want_m && st.m_prev.size() == want_m && st.last_sample.size() == want_s,
            "sampler state: ", solver_name(solver_), " at step ", st.index, " needs ", want_m, " + ", want_m, " + ",
            want_s, " history values (m_last, m_prev, last_sample), got ", st.m_last.size(), " + ", st.m_prev.size(),
            " + ", st.last_sample.size());
  index_ = st.index;
  n_ = st.n;
  history_external_ = false;
  m_last_ = std::move(st.m_last);
  m_prev_ = std::move(st.m_prev);
  last_sample_ = std::move(st.last_sample);
}

}  // namespace wan
