// The solvers (spec §7.3, §7.4, §7.6): flow UniPC (bh2, order 2, predict-x0, UniC corrector at every
// step but the first, lower order at the last step), flow DPM++ (2M midpoint, first order at the
// first and last steps) and Euler.
// Invariants: scalar coefficients are computed in float32 with the reference's operations and
// grouping (each Python sub-expression on 0-dim float32 tensors becomes one rounded float op);
// elementwise updates follow the reference's evaluation order term by term. The step onto the
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

Sampler::Sampler(const SamplerConfig& c) : Sampler(c.solver, make_schedule(c)) {}

Sampler::Sampler(SolverKind solver, SigmaSchedule schedule) : solver_(solver), sched_(std::move(schedule)) {
  const auto& s = sched_.sigmas;
  WAN_CHECK(!sched_.timesteps.empty() && s.size() == sched_.timesteps.size() + 1,
            "sampler: a schedule needs steps >= 1 timesteps and steps + 1 sigmas (got ",
            sched_.timesteps.size(), " timesteps, ", s.size(), " sigmas)");
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

void Sampler::reset() {
  index_ = 0;
  n_ = 0;
  lower_order_nums_ = 0;
  this_order_ = 0;
  m_prev_.clear();
  m_last_.clear();
  m_new_.clear();
  last_sample_.clear();
}

void Sampler::step(const float* v, float* x, size_t n) {
  WAN_CHECK(!done(), "sampler: step() called after all ", steps(), " steps");
  WAN_CHECK(v != nullptr && x != nullptr && n > 0, "sampler: step() needs non-empty v and x");
  if (index_ == 0) {
    n_ = n;
    m_prev_.assign(n, 0.0f);
    m_last_.assign(n, 0.0f);
    m_new_.assign(n, 0.0f);
    if (solver_ == SolverKind::UniPC) last_sample_.assign(n, 0.0f);
  }
  WAN_CHECK(n == n_, "sampler: step ", index_, " got ", n, " elements, the run started with ", n_);
  switch (solver_) {
    case SolverKind::UniPC: step_unipc(v, x); break;
    case SolverKind::DpmPP: step_dpmpp(v, x); break;
    case SolverKind::Euler: step_euler(v, x); break;
  }
  ++index_;
}

void Sampler::step_unipc(const float* v, float* x) {
  const size_t n = n_;
  const auto& sg = sched_.sigmas;
  const int i = index_;
  const int N = steps();
  const float sigma = sg[static_cast<size_t>(i)];
  float* m = m_new_.data();
  for (size_t j = 0; j < n; ++j) m[j] = x[j] - sigma * v[j];  // data prediction x0_hat

  // UniC: correct the sample that the last predictor produced, using this step's prediction.
  if (i > 0) {
    const float sigma_s0 = sg[static_cast<size_t>(i - 1)];
    const BhCoeffs c = bh2_coeffs(sigma, sigma_s0);
    const float* m0 = m_last_.data();
    const float* xs = last_sample_.data();
    if (this_order_ == 2) {
      const float g1 = c.phi1 / c.hh - 1.0f;
      const float b1 = g1 * 1.0f / c.B;
      const float g2 = g1 / c.hh - 0.5f;
      const float b2 = g2 * 2.0f / c.B;
      const float lambda_s0 = lambda_of(sigma_s0);
      const float r = (lambda_of(sg[static_cast<size_t>(i - 2)]) - lambda_s0) / c.h;
      float rho0, rho1;
      solve_2x2(r, b1, b2, rho0, rho1);
      const float* m1 = m_prev_.data();
      for (size_t j = 0; j < n; ++j) {
        const float xt = c.c_x * xs[j] - c.c_m * m0[j];
        const float d1 = (m1[j] - m0[j]) / r;
        const float res = rho0 * d1 + rho1 * (m[j] - m0[j]);
        x[j] = xt - c.c_res * res;
      }
    } else {
      WAN_ASSERT(this_order_ == 1, "UniPC corrector order ", this_order_);
      for (size_t j = 0; j < n; ++j) {
        const float xt = c.c_x * xs[j] - c.c_m * m0[j];
        x[j] = xt - c.c_res * (0.5f * (m[j] - m0[j]));
      }
    }
  }

  // History: M = [M[-1], m]; the corrected sample is what the predictor (and the next corrector) use.
  std::swap(m_prev_, m_last_);
  std::swap(m_last_, m_new_);
  const int order = std::min(std::min(2, N - i), lower_order_nums_ + 1);
  this_order_ = order;
  std::copy(x, x + n, last_sample_.begin());

  // UniP to sigma_{i+1}.
  const float* m0 = m_last_.data();
  const float sigma_t = sg[static_cast<size_t>(i + 1)];
  if (sigma_t == 0.0f) {
    WAN_ASSERT(order == 1, "UniPC final step with order ", order);
    std::copy(m0, m0 + n, x);
  } else {
    const BhCoeffs c = bh2_coeffs(sigma_t, sigma);
    if (order == 2) {
      const float r = (lambda_of(sg[static_cast<size_t>(i - 1)]) - lambda_of(sigma)) / c.h;
      const float* m1 = m_prev_.data();
      for (size_t j = 0; j < n; ++j) {
        const float xt = c.c_x * x[j] - c.c_m * m0[j];
        const float d1 = (m1[j] - m0[j]) / r;
        x[j] = xt - c.c_res * (0.5f * d1);
      }
    } else {
      for (size_t j = 0; j < n; ++j) x[j] = c.c_x * x[j] - c.c_m * m0[j];
    }
  }
  lower_order_nums_ = std::min(lower_order_nums_ + 1, 2);
}

void Sampler::step_dpmpp(const float* v, float* x) {
  const size_t n = n_;
  const auto& sg = sched_.sigmas;
  const int i = index_;
  const float sigma_s0 = sg[static_cast<size_t>(i)];
  const float sigma_t = sg[static_cast<size_t>(i + 1)];
  float* m = m_new_.data();
  for (size_t j = 0; j < n; ++j) m[j] = x[j] - sigma_s0 * v[j];
  std::swap(m_prev_, m_last_);
  std::swap(m_last_, m_new_);
  const float* m0 = m_last_.data();

  // final_sigmas_type "zero" forces first order at the last step; it lands on m0.
  const bool first_order = lower_order_nums_ < 1 || i == steps() - 1;
  if (sigma_t == 0.0f) {
    std::copy(m0, m0 + n, x);
  } else {
    const float alpha_t = 1.0f - sigma_t;
    const float lambda_t = lambda_of(sigma_t);
    const float lambda_s0 = lambda_of(sigma_s0);  // -inf when sigma_0 = 1: then h = +inf, e^-h = 0
    const float h = lambda_t - lambda_s0;
    const float c_x = sigma_t / sigma_s0;
    const float c_m = alpha_t * (expf_cr(-h) - 1.0f);
    if (first_order) {
      for (size_t j = 0; j < n; ++j) x[j] = c_x * x[j] - c_m * m0[j];
    } else {
      // sigma_{i-1} = 1 gives h_0 = +inf, r0 = +inf, 1/r0 = 0: the history term vanishes, as in
      // the reference.
      const float h0 = lambda_s0 - lambda_of(sg[static_cast<size_t>(i - 1)]);
      const float r0 = h0 / h;
      const float inv_r0 = 1.0f / r0;
      const float c_half = 0.5f * c_m;
      const float* m1 = m_prev_.data();
      for (size_t j = 0; j < n; ++j) {
        const float d1 = inv_r0 * (m0[j] - m1[j]);
        x[j] = (c_x * x[j] - c_m * m0[j]) - c_half * d1;
      }
    }
  }
  lower_order_nums_ = std::min(lower_order_nums_ + 1, 2);
}

void Sampler::step_euler(const float* v, float* x) {
  const auto& sg = sched_.sigmas;
  const float dt = sg[static_cast<size_t>(index_ + 1)] - sg[static_cast<size_t>(index_)];
  for (size_t j = 0; j < n_; ++j) x[j] = x[j] + dt * v[j];
}

}  // namespace wan
