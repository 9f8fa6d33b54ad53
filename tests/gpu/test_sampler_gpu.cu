// The fused guidance + solver kernel (sampler/sampler_gpu.h) against the CPU reference (cfg_combine +
// Sampler::step), bit for bit: full 40-step runs of every solver with the T2V expert switch and its
// two guide scales (including 1.0, run as the pipeline runs it: cond alone, and through the CFG formula),
// on fresh random model outputs; float4 and scalar paths (odd element counts, the [2, n] DiT output
// layout whose second half is misaligned, a misaligned cond, tiny sizes);
// the resumable state both ways (GPU -> host sampler, host sampler -> GPU); and the refusals.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "sampler/sampler_gpu.h"
#include "gpu_test_util.h"
#include "sampler/sampler.h"

using namespace wan;
using namespace wan::gpu_test;

namespace {

long first_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0) return static_cast<long>(i);
  return -1;
}

// Where the model outputs lie on the device.
enum class Layout {
  DitBatch,     // one [2, n] buffer, uncond = cond + n (the DiT's output): misaligned when n % 4 != 0
  Separate,     // two cudaMalloc'ed buffers (aligned; odd n gives a scalar tail after the float4 body)
  Misaligned,   // cond one float past an aligned address
};
const char* layout_name(Layout l) {
  return l == Layout::DitBatch ? "dit-batch" : l == Layout::Separate ? "separate" : "misaligned";
}

struct Outputs {
  DevBuf<float> buf;
  float* cond;
  float* uncond;
  Outputs(size_t n, Layout l) : buf(2 * n + 16) {
    cond = buf.p + (l == Layout::Misaligned ? 1 : 0);
    uncond = l == Layout::DitBatch ? cond + n : buf.p + ((n + 7) / 4) * 4 + 4;  // 16-byte aligned
  }
  void upload(const std::vector<float>& c, const std::vector<float>& u) {
    CUDA_CHECK(cudaMemcpy(cond, c.data(), c.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(uncond, u.data(), u.size() * 4, cudaMemcpyHostToDevice));
  }
};

// Model outputs for one step: a velocity towards a fixed random x0 plus noise (cond), uncond a
// different one; fresh values every step, never zero.
void model_outputs(const std::vector<float>& x, uint64_t seed, int step, std::vector<float>* c, std::vector<float>* u) {
  const size_t n = x.size();
  const std::vector<float> x0 = randn(seed, n, 0.8f);
  const std::vector<float> e1 = randn(seed * 131 + static_cast<uint64_t>(step) * 2 + 1, n, 0.3f);
  const std::vector<float> e2 = randn(seed * 131 + static_cast<uint64_t>(step) * 2 + 2, n, 0.2f);
  c->resize(n);
  u->resize(n);
  for (size_t j = 0; j < n; ++j) {
    (*c)[j] = 1.1f * (x[j] - x0[j]) + e1[j];
    (*u)[j] = (*c)[j] * 0.9f + e2[j];
  }
}

struct RunSpec {
  SolverKind solver;
  ScheduleKind schedule;
  float guide_low, guide_high;
  bool force_cfg;  // guide 1 through the CFG formula instead of cond alone
  size_t n;
  Layout layout;
};

// One full run: the CPU reference and the GPU sampler fed the same model outputs; x compared after
// every step, the state at the end.
void run_and_compare(const RunSpec& r) {
  SCOPED_TRACE(std::string(solver_name(r.solver)) + " " + schedule_name(r.schedule) + " guides " +
               std::to_string(r.guide_low) + "/" + std::to_string(r.guide_high) + (r.force_cfg ? " forced-cfg" : "") +
               " n " + std::to_string(r.n) + " " + layout_name(r.layout));
  SamplerConfig cfg;
  cfg.solver = r.solver;
  cfg.schedule = r.schedule;
  cfg.steps = 40;
  cfg.shift = 12.0;
  Sampler cpu(cfg), plan(cfg);
  const ExpertSchedule es = ExpertSchedule::make(cpu.timesteps(), 0.875, r.guide_low, r.guide_high);
  ASSERT_GT(es.num_high(), 0);
  ASSERT_LT(es.num_high(), 40);  // the switch happens mid-run

  const uint64_t seed = 1000 + r.n + static_cast<uint64_t>(r.solver) * 17;
  std::vector<float> x = randn(seed + 5, r.n, 1.0f);
  cuda::SamplerGpu gpu(r.solver, r.n);
  gpu.set_x(x.data());
  Outputs out(r.n, r.layout);
  std::vector<float> c, u, v(r.n), got(r.n);
  int cfg_steps = 0, plain_steps = 0;
  for (int i = 0; i < 40; ++i) {
    const ExpertStep& st = es.steps[size_t(i)];
    const bool use_cfg = st.guide != 1.0f || r.force_cfg;
    model_outputs(x, seed, i, &c, &u);
    out.upload(c, u);
    // CPU reference: exactly the pipeline's host path.
    if (use_cfg) cfg_combine(c.data(), u.data(), st.guide, v.data(), r.n);
    else v = c;
    cpu.step(v.data(), x.data(), r.n);
    // GPU: the fused kernel.
    gpu.step(plan.take_step(), out.cond, use_cfg ? out.uncond : nullptr, st.guide);
    (use_cfg ? cfg_steps : plain_steps)++;
    gpu.get_x(got.data());
    ASSERT_EQ(first_diff(got, x), -1) << "step " << i << " (" << (st.expert == Expert::High ? "high" : "low")
                                      << ", guide " << st.guide << ")";
  }
  EXPECT_EQ(gpu.index(), 40);
  if (r.guide_low == 1.0f && !r.force_cfg) EXPECT_GT(plain_steps, 0);
  EXPECT_GT(cfg_steps, 0);
  // The history equals the CPU sampler's, element for element.
  const SamplerState a = gpu.download_state(), b = cpu.state();
  EXPECT_EQ(a.index, b.index);
  EXPECT_EQ(a.n, b.n);
  EXPECT_EQ(first_diff(a.m_last, b.m_last), -1);
  EXPECT_EQ(first_diff(a.m_prev, b.m_prev), -1);
  EXPECT_EQ(first_diff(a.last_sample, b.last_sample), -1);
  for (float f : x) ASSERT_TRUE(std::isfinite(f));
}

}  // namespace

TEST(SamplerGpu, FusedStepMatchesCpuBitForBitOverFullRuns) {
  REQUIRE_GPU();
  int runs = 0;
  for (SolverKind k : {SolverKind::UniPC, SolverKind::DpmPP, SolverKind::Euler}) {
    // The T2V guides (3 low / 4 high), a guide of 1 on either expert (cond alone), and guide 1
    // pushed through the CFG formula.
    for (auto [gl, gh, force] : {std::tuple{3.0f, 4.0f, false}, std::tuple{1.0f, 4.0f, false},
                                 std::tuple{3.0f, 1.0f, false}, std::tuple{1.0f, 5.5f, true}}) {
      run_and_compare({k, ScheduleKind::Official, gl, gh, force, 65539, Layout::Separate});  // float4 + tail 3
      run_and_compare({k, ScheduleKind::Official, gl, gh, force, 4096, Layout::DitBatch});   // all float4
      runs += 2;
    }
    run_and_compare({k, ScheduleKind::Diffusers, 3.0f, 4.0f, false, 1031, Layout::DitBatch});   // scalar
    run_and_compare({k, ScheduleKind::Diffusers, 3.0f, 4.0f, false, 1030, Layout::Misaligned});  // scalar
    run_and_compare({k, ScheduleKind::Official, 3.0f, 4.0f, false, 7, Layout::Separate});        // 1 vec + 3
    run_and_compare({k, ScheduleKind::Official, 3.0f, 4.0f, false, 1, Layout::DitBatch});        // tail only
    run_and_compare({k, ScheduleKind::Official, 1.0f, 4.0f, false, 3, Layout::DitBatch});
    runs += 5;
  }
  EXPECT_EQ(runs, 3 * 13);
}

// The few-step distilled recipes: LightX2V's step-distill update on explicit timestep lists (fp32 and
// bf16 latents) and Euler on the Wan2.2-Lightning grid, guided or not, equal the CPU bit for bit.
TEST(SamplerGpu, DistillSolversMatchCpuBitForBit) {
  REQUIRE_GPU();
  struct Case {
    SolverKind solver;
    std::vector<int64_t> list;  // empty: the Lightning grid of `steps`
    int steps;
    bool bf16;
    float guide;
  };
  const Case cases[] = {{SolverKind::StepDistill, {1000, 750, 500, 250}, 4, false, 1.0f},
                        {SolverKind::StepDistill, {1000, 750, 500, 250}, 4, true, 1.0f},
                        {SolverKind::StepDistill, {999, 880, 700, 512, 400, 130, 20}, 7, true, 3.0f},
                        {SolverKind::Euler, {}, 4, false, 1.0f},
                        {SolverKind::Euler, {}, 7, false, 2.5f}};
  for (const Case& k : cases) {
    SCOPED_TRACE(std::string(solver_name(k.solver)) + " steps " + std::to_string(k.steps) + (k.bf16 ? " bf16" : ""));
    SamplerConfig cfg;
    cfg.solver = k.solver;
    cfg.steps = k.steps;
    cfg.shift = 5.0;
    cfg.timesteps = k.list;
    cfg.schedule = ScheduleKind::Lightning;
    cfg.bf16_latents = k.bf16;
    Sampler cpu(cfg), plan(cfg);
    const size_t n = 4099;
    std::vector<float> x = randn(4242 + static_cast<uint64_t>(k.steps), n, 1.0f);
    cuda::SamplerGpu gpu(k.solver, n);
    gpu.set_x(x.data());
    Outputs out(n, Layout::DitBatch);
    std::vector<float> c, u, v(n), got(n);
    for (int i = 0; i < k.steps; ++i) {
      model_outputs(x, 77, i, &c, &u);
      out.upload(c, u);
      const bool use_cfg = k.guide != 1.0f;
      if (use_cfg) cfg_combine(c.data(), u.data(), k.guide, v.data(), n);
      else v = c;
      cpu.step(v.data(), x.data(), n);
      gpu.step(plan.take_step(), out.cond, use_cfg ? out.uncond : nullptr, k.guide);
      gpu.get_x(got.data());
      ASSERT_EQ(first_diff(got, x), -1) << "step " << i;
    }
    for (float f : x) ASSERT_TRUE(std::isfinite(f));
  }
}

// The resumable state: GPU -> host sampler and host sampler -> GPU, mid-run, ends bit-identical to an
// uninterrupted CPU run; download/upload round trip on the device too.
TEST(SamplerGpu, StateMovesBetweenHostAndDevice) {
  REQUIRE_GPU();
  const size_t n = 4099;
  for (SolverKind k : {SolverKind::UniPC, SolverKind::DpmPP, SolverKind::Euler}) {
    SCOPED_TRACE(solver_name(k));
    SamplerConfig cfg;
    cfg.solver = k;
    cfg.steps = 12;
    const std::vector<float> x0 = randn(77, n, 1.0f);
    // Model outputs depend only on the step here, so every path sees the same ones.
    std::vector<std::vector<float>> cs, us;
    for (int i = 0; i < 12; ++i) {
      std::vector<float> c, u;
      model_outputs(x0, 91, i, &c, &u);
      cs.push_back(c);
      us.push_back(u);
    }
    const float g = 4.0f;
    std::vector<float> want = x0, v(n);
    Sampler ref(cfg);
    for (int i = 0; i < 12; ++i) {
      cfg_combine(cs[size_t(i)].data(), us[size_t(i)].data(), g, v.data(), n);
      ref.step(v.data(), want.data(), n);
    }
    Outputs out(n, Layout::DitBatch);
    for (int stop : {1, 2, 5, 11}) {
      SCOPED_TRACE("stop " + std::to_string(stop));
      // GPU for `stop` steps, then a fresh GPU sampler from the downloaded state, then the host.
      Sampler s(cfg);
      cuda::SamplerGpu a(k, n);
      a.set_x(x0.data());
      for (int i = 0; i < stop; ++i) {
        out.upload(cs[size_t(i)], us[size_t(i)]);
        a.step(s.take_step(), out.cond, out.uncond, g);
      }
      std::vector<float> x(n);
      a.get_x(x.data());
      const SamplerState st = a.download_state();
      EXPECT_EQ(st.index, stop);
      cuda::SamplerGpu b(k, n);
      b.set_x(x.data());
      b.upload_state(st);
      const int mid = (stop + 12) / 2;
      for (int i = stop; i < mid; ++i) {
        out.upload(cs[size_t(i)], us[size_t(i)]);
        b.step(s.take_step(), out.cond, out.uncond, g);
      }
      b.get_x(x.data());
      s.set_state(b.download_state());  // back on the host
      for (int i = mid; i < 12; ++i) {
        cfg_combine(cs[size_t(i)].data(), us[size_t(i)].data(), g, v.data(), n);
        s.step(v.data(), x.data(), n);
      }
      EXPECT_EQ(first_diff(x, want), -1);

      // Host for `stop` steps, then the GPU.
      Sampler h(cfg);
      std::vector<float> xh = x0;
      for (int i = 0; i < stop; ++i) {
        cfg_combine(cs[size_t(i)].data(), us[size_t(i)].data(), g, v.data(), n);
        h.step(v.data(), xh.data(), n);
      }
      cuda::SamplerGpu d(k, n);
      d.set_x(xh.data());
      d.upload_state(h.state());
      for (int i = stop; i < 12; ++i) {
        out.upload(cs[size_t(i)], us[size_t(i)]);
        d.step(h.take_step(), out.cond, out.uncond, g);
      }
      d.get_x(xh.data());
      EXPECT_EQ(first_diff(xh, want), -1);
    }
  }
}

TEST(SamplerGpu, RefusesMismatchedInputs) {
  REQUIRE_GPU();
  const size_t n = 64;
  SamplerConfig cfg;
  cfg.steps = 4;
  Sampler s(cfg);
  cuda::SamplerGpu g(SolverKind::UniPC, n);
  Outputs out(n, Layout::DitBatch);
  out.upload(randn(1, n, 1.0f), randn(2, n, 1.0f));
  StepCoeffs c = s.plan_step();
  c.index = 1;
  EXPECT_THROW(g.step(c, out.cond, out.uncond, 3.0f), Error);  // coefficients of another step
  c = s.plan_step();
  c.solver = SolverKind::Euler;
  EXPECT_THROW(g.step(c, out.cond, out.uncond, 3.0f), Error);  // another solver
  EXPECT_THROW(g.step(s.plan_step(), nullptr, out.uncond, 3.0f), Error);
  EXPECT_THROW(g.step(s.plan_step(), g.x() + 1, out.uncond, 3.0f), Error);  // overlaps the state
  EXPECT_EQ(g.index(), 0);
  EXPECT_NO_THROW(g.step(s.take_step(), out.cond, out.uncond, 3.0f));
  EXPECT_EQ(g.index(), 1);
  SamplerState st = g.download_state();
  EXPECT_EQ(st.m_last.size(), n);
  st.m_prev.pop_back();
  EXPECT_THROW(g.upload_state(st), Error);
  st = g.download_state();
  st.n = n + 1;
  EXPECT_THROW(g.upload_state(st), Error);
  SamplerState zero;
  zero.m_last.assign(n, 1.0f);  // history at step 0
  EXPECT_THROW(g.upload_state(zero), Error);
  EXPECT_THROW(cuda::SamplerGpu(SolverKind::Euler, 0), Error);
}
