// The coefficient form of the solvers (sampler/sampler_step.h: Sampler::plan_step() + step_element())
// against the sampler as it was written before the refactor (a verbatim copy below, the reference):
// bit for bit over full runs of every solver and schedule on fresh random model outputs, both through
// Sampler::step() and through take_step() with the history in caller-owned buffers (what the GPU
// sampler does); the resumable state (state / set_state) round trip; and the error paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "sampler/sampler.h"

using namespace wan;

namespace {

// ---------------------------------------------------------------------------------------------
// The pre-refactor sampler (src/sampler/sampler.cpp at 6313b53), kept verbatim as the reference.
namespace legacy {

inline float logf_cr(float x) { return static_cast<float>(std::log(static_cast<double>(x))); }
inline float expm1f_cr(float x) { return static_cast<float>(std::expm1(static_cast<double>(x))); }
inline float expf_cr(float x) { return static_cast<float>(std::exp(static_cast<double>(x))); }

inline float lambda_of(float sigma) {
  const float alpha = 1.0f - sigma;
  return logf_cr(alpha) - logf_cr(sigma);
}

void solve_2x2(float r, float b1, float b2, float& rho0, float& rho1) {
  float a00 = 1.0f, a10 = r, c0 = b1, c1 = b2;
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

class Sampler {
 public:
  Sampler(SolverKind solver, SigmaSchedule schedule) : solver_(solver), sched_(std::move(schedule)) {}
  int steps() const { return static_cast<int>(sched_.timesteps.size()); }

  void step(const float* v, float* x, size_t n) {
    if (index_ == 0) {
      n_ = n;
      m_prev_.assign(n, 0.0f);
      m_last_.assign(n, 0.0f);
      m_new_.assign(n, 0.0f);
      if (solver_ == SolverKind::UniPC) last_sample_.assign(n, 0.0f);
    }
    switch (solver_) {
      case SolverKind::UniPC: step_unipc(v, x); break;
      case SolverKind::DpmPP: step_dpmpp(v, x); break;
      case SolverKind::Euler: step_euler(v, x); break;
      case SolverKind::StepDistill: break;  // replayed against its references in test_presets.cpp
    }
    ++index_;
  }

 private:
  void step_unipc(const float* v, float* x) {
    const size_t n = n_;
    const auto& sg = sched_.sigmas;
    const int i = index_;
    const int N = steps();
    const float sigma = sg[static_cast<size_t>(i)];
    float* m = m_new_.data();
    for (size_t j = 0; j < n; ++j) m[j] = x[j] - sigma * v[j];
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
        for (size_t j = 0; j < n; ++j) {
          const float xt = c.c_x * xs[j] - c.c_m * m0[j];
          x[j] = xt - c.c_res * (0.5f * (m[j] - m0[j]));
        }
      }
    }
    std::swap(m_prev_, m_last_);
    std::swap(m_last_, m_new_);
    const int order = std::min(std::min(2, N - i), lower_order_nums_ + 1);
    this_order_ = order;
    std::copy(x, x + n, last_sample_.begin());
    const float* m0 = m_last_.data();
    const float sigma_t = sg[static_cast<size_t>(i + 1)];
    if (sigma_t == 0.0f) {
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

  void step_dpmpp(const float* v, float* x) {
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
    const bool first_order = lower_order_nums_ < 1 || i == steps() - 1;
    if (sigma_t == 0.0f) {
      std::copy(m0, m0 + n, x);
    } else {
      const float alpha_t = 1.0f - sigma_t;
      const float lambda_t = lambda_of(sigma_t);
      const float lambda_s0 = lambda_of(sigma_s0);
      const float h = lambda_t - lambda_s0;
      const float c_x = sigma_t / sigma_s0;
      const float c_m = alpha_t * (expf_cr(-h) - 1.0f);
      if (first_order) {
        for (size_t j = 0; j < n; ++j) x[j] = c_x * x[j] - c_m * m0[j];
      } else {
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

  void step_euler(const float* v, float* x) {
    const auto& sg = sched_.sigmas;
    const float dt = sg[static_cast<size_t>(index_ + 1)] - sg[static_cast<size_t>(index_)];
    for (size_t j = 0; j < n_; ++j) x[j] = x[j] + dt * v[j];
  }

  SolverKind solver_;
  SigmaSchedule sched_;
  int index_ = 0;
  size_t n_ = 0;
  int lower_order_nums_ = 0;
  int this_order_ = 0;
  std::vector<float> m_prev_, m_last_, m_new_, last_sample_;
};

}  // namespace legacy
// ---------------------------------------------------------------------------------------------

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Index of the first element whose bits differ, or -1.
long first_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0) return static_cast<long>(i);
  return -1;
}

// Model output for step i: the velocity of a straight path to a random x0 plus a random deviation,
// so that data predictions differ from step to step (never zero, never constant).
std::vector<float> model_output(const std::vector<float>& x, size_t n, int i, uint32_t seed) {
  std::vector<float> v = randn(n, seed * 1000 + static_cast<uint32_t>(i), 0.3f);
  const std::vector<float> x0 = randn(n, seed * 7 + 1, 0.8f);
  for (size_t j = 0; j < n; ++j) v[j] += (x[j] - x0[j]) * 1.1f;
  return v;
}

// A run held outside the Sampler, as the GPU sampler holds it: x and three history buffers, the
// coefficients from take_step(), the m_prev/m_last roles swapped after each step.
struct ExternalRun {
  std::vector<float> x, a, b, xs;
  std::vector<float>*m_last = &a, *m_prev = &b;
  explicit ExternalRun(std::vector<float> x0) : x(std::move(x0)), a(x.size()), b(x.size()), xs(x.size()) {}
  void apply(const StepCoeffs& c, const std::vector<float>& v) {
    float* ml = m_last->data();
    float* mp = m_prev->data();
    for (size_t j = 0; j < x.size(); ++j) step_element(c, v[j], x[j], ml[j], mp[j], xs[j], &x[j], &mp[j], &xs[j]);
    if (c.solver != SolverKind::Euler) std::swap(m_last, m_prev);
  }
};

struct Case {
  SolverKind solver;
  ScheduleKind schedule;
  int steps;
  double shift;
};

std::vector<Case> all_cases() {
  std::vector<Case> cs;
  for (SolverKind k : {SolverKind::UniPC, SolverKind::DpmPP, SolverKind::Euler})
    for (ScheduleKind s : {ScheduleKind::Official, ScheduleKind::Diffusers})
      for (int n : {1, 2, 3, 4, 10, 40, 50})
        for (double shift : {12.0, 5.0, 1.0}) cs.push_back({k, s, n, shift});
  return cs;
}

SamplerConfig config_of(const Case& c) {
  SamplerConfig cfg;
  cfg.solver = c.solver;
  cfg.schedule = c.schedule;
  cfg.steps = c.steps;
  cfg.shift = c.shift;
  return cfg;
}

}  // namespace

// Sampler::step() (plan_step + step_element), the external coefficient form and the pre-refactor
// sampler agree bit for bit after every step of every run.
TEST(SamplerCoeffs, FullRunsMatchThePreRefactorSamplerBitForBit) {
  const size_t n = 1031;  // odd on purpose
  int runs = 0;
  for (const Case& cs : all_cases()) {
    SCOPED_TRACE(std::string(solver_name(cs.solver)) + " " + schedule_name(cs.schedule) + " steps " +
                 std::to_string(cs.steps) + " shift " + std::to_string(cs.shift));
    const SamplerConfig cfg = config_of(cs);
    const uint32_t seed = static_cast<uint32_t>(cs.steps * 31 + static_cast<int>(cs.solver) * 7 + int(cs.shift));
    const std::vector<float> x0 = randn(n, seed, 1.0f);
    legacy::Sampler ref(cs.solver, make_schedule(cfg));
    Sampler s(cfg), ext_s(cfg);
    std::vector<float> x_ref = x0, x = x0;
    ExternalRun ext(x0);
    for (int i = 0; i < s.steps(); ++i) {
      const std::vector<float> v = model_output(x_ref, n, i, seed);
      ref.step(v.data(), x_ref.data(), n);
      s.step(v.data(), x.data(), n);
      const StepCoeffs c = ext_s.take_step();
      ASSERT_EQ(c.index, i);
      ext.apply(c, v);
      ASSERT_EQ(first_diff(x, x_ref), -1) << "Sampler::step differs at step " << i;
      ASSERT_EQ(first_diff(ext.x, x_ref), -1) << "coefficient form differs at step " << i;
    }
    EXPECT_TRUE(s.done());
    EXPECT_TRUE(ext_s.done());
    // The run really moved the sample and stayed finite.
    EXPECT_GT(first_diff(x, x0), -1);
    for (float f : x) ASSERT_TRUE(std::isfinite(f));
    ++runs;
  }
  EXPECT_EQ(runs, 3 * 2 * 7 * 3);
}

// Custom schedules: DPM++ from sigma 1 (inf/0 coefficients), UniPC with sigma_0 close to 1.
TEST(SamplerCoeffs, CustomSchedulesMatch) {
  const size_t n = 257;
  const std::vector<std::pair<SolverKind, SigmaSchedule>> cases = {
      {SolverKind::DpmPP, {{1.0f, 0.8f, 0.5f, 0.2f, 0.0f}, {1000, 800, 500, 200}}},
      {SolverKind::UniPC, {{0.9999f, 0.7f, 0.4f, 0.1f, 0.05f, 0.0f}, {999, 700, 400, 100, 50}}},
      {SolverKind::Euler, {{1.0f, 0.3f, 0.0f}, {1000, 300}}},
  };
  for (const auto& [k, sched] : cases) {
    SCOPED_TRACE(solver_name(k));
    legacy::Sampler ref(k, sched);
    Sampler s(k, sched);
    std::vector<float> x_ref = randn(n, 3), x = x_ref;
    for (int i = 0; i < s.steps(); ++i) {
      const std::vector<float> v = model_output(x_ref, n, i, 9);
      ref.step(v.data(), x_ref.data(), n);
      s.step(v.data(), x.data(), n);
      ASSERT_EQ(first_diff(x, x_ref), -1) << "step " << i;
    }
    for (float f : x) ASSERT_TRUE(std::isfinite(f));
  }
}

// plan_step() is pure and depends on the index alone; the coefficients have the expected shape.
TEST(SamplerCoeffs, PlanStepIsPureAndShaped) {
  SamplerConfig cfg;
  cfg.steps = 6;
  Sampler s(cfg);
  const size_t n = 33;
  std::vector<float> x = randn(n, 1);
  for (int i = 0; i < 6; ++i) {
    const StepCoeffs a = s.plan_step(), b = s.plan_step();
    EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0);
    EXPECT_EQ(a.index, i);
    EXPECT_EQ(s.index(), i);
    EXPECT_EQ(a.corr_order, i == 0 ? 0 : (i == 1 ? 1 : 2));    // UniC from step 1, order of the last UniP
    EXPECT_EQ(a.pred_order, i == 5 ? 0 : (i == 0 ? 1 : 2));    // first order first, land on m0 at sigma 0
    const std::vector<float> v = model_output(x, n, i, 4);
    s.step(v.data(), x.data(), n);
  }
  EXPECT_THROW(s.plan_step(), Error);
  EXPECT_THROW(s.take_step(), Error);
}

// state() / set_state(): a run stopped anywhere and resumed in a fresh sampler (host history, or the
// history from caller-owned buffers after take_step) ends bit-identical to an uninterrupted one.
TEST(SamplerCoeffs, StateRoundTripResumesBitIdentically) {
  const size_t n = 515;
  for (SolverKind k : {SolverKind::UniPC, SolverKind::DpmPP, SolverKind::Euler}) {
    SamplerConfig cfg;
    cfg.solver = k;
    cfg.steps = 8;
    SCOPED_TRACE(solver_name(k));
    const std::vector<float> x0 = randn(n, 17);
    std::vector<std::vector<float>> vs;
    std::vector<float> want = x0;
    {
      Sampler s(cfg);
      for (int i = 0; i < 8; ++i) {
        vs.push_back(model_output(want, n, i, 21));
        s.step(vs.back().data(), want.data(), n);
      }
    }
    for (int stop = 0; stop <= 8; ++stop) {
      SCOPED_TRACE("stop at " + std::to_string(stop));
      // Host history.
      Sampler a(cfg);
      std::vector<float> x = x0;
      for (int i = 0; i < stop; ++i) a.step(vs[size_t(i)].data(), x.data(), n);
      const SamplerState st = a.state();
      EXPECT_EQ(st.index, stop);
      EXPECT_EQ(st.n, stop > 0 ? n : 0u);
      EXPECT_EQ(st.m_last.size(), stop > 0 && k != SolverKind::Euler ? n : 0u);
      EXPECT_EQ(st.last_sample.size(), stop > 0 && k == SolverKind::UniPC ? n : 0u);
      Sampler b(cfg);
      b.set_state(st);
      EXPECT_EQ(b.index(), stop);
      for (int i = stop; i < 8; ++i) b.step(vs[size_t(i)].data(), x.data(), n);
      EXPECT_EQ(first_diff(x, want), -1);

      // External history (take_step), handed back to a host sampler.
      Sampler e(cfg);
      ExternalRun ext(x0);
      for (int i = 0; i < stop; ++i) ext.apply(e.take_step(), vs[size_t(i)]);
      if (stop > 0) {
        EXPECT_THROW(e.state(), Error);
        EXPECT_THROW(e.step(vs[0].data(), ext.x.data(), n), Error);
      }
      SamplerState es;
      es.index = e.index();
      if (stop > 0) {
        es.n = n;
        if (k != SolverKind::Euler) {
          es.m_last = *ext.m_last;
          es.m_prev = *ext.m_prev;
        }
        if (k == SolverKind::UniPC) es.last_sample = ext.xs;
      }
      e.set_state(es);
      for (int i = stop; i < 8; ++i) e.step(vs[size_t(i)].data(), ext.x.data(), n);
      EXPECT_EQ(first_diff(ext.x, want), -1);
    }
  }
}

TEST(SamplerCoeffs, SetStateRejectsBadStates) {
  SamplerConfig cfg;
  cfg.steps = 4;
  Sampler s(cfg);
  const size_t n = 10;
  std::vector<float> x = randn(n, 2), v = randn(n, 3);
  s.step(v.data(), x.data(), n);
  const SamplerState good = s.state();
  auto bad = [&](auto edit) {
    SamplerState st = good;
    edit(st);
    Sampler t(cfg);
    EXPECT_THROW(t.set_state(st), Error);
  };
  bad([](SamplerState& st) { st.index = 5; });
  bad([](SamplerState& st) { st.index = -1; });
  bad([](SamplerState& st) { st.n = 0; });
  bad([](SamplerState& st) { st.m_last.pop_back(); });
  bad([](SamplerState& st) { st.last_sample.clear(); });
  bad([](SamplerState& st) { st.index = 0; });  // history given at step 0
  Sampler e(SamplerConfig{SolverKind::Euler, 4});
  SamplerState st = good;  // UniPC history is not Euler's
  EXPECT_THROW(e.set_state(st), Error);
  // A restored state checks the element count of the next step.
  Sampler t(cfg);
  t.set_state(good);
  std::vector<float> x2(n + 1), v2(n + 1, 0.5f);
  EXPECT_THROW(t.step(v2.data(), x2.data(), n + 1), Error);
  EXPECT_NO_THROW(t.step(v.data(), x.data(), n));
}
