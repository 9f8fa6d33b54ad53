// Tests for the few-step distilled sampling (src/sampler): schedules from explicit timestep lists and
// the Lightning grid (values bit for bit against torch, validation errors), the step-distill solver
// and Euler replayed step by step against fixtures that re-implement Wan2.2-Lightning's and
// LightX2V's loops (tools/make_distill_fixtures.py; committed under tests/fixtures/sampler and also
// regenerated here through WAN_PYTHON), the presets and how they combine with user options, the
// expert split of the 4-step list, and the guide-1 / default paths left as they were.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "sampler/presets.h"
#include "sampler/sampler.h"
#include "test_util.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace wan;
using wan::test::error_of;

namespace {

const std::string kFixtures = std::string(WAN_FIXTURES) + "/sampler";

// The cases tools/make_distill_fixtures.py writes (kept in sync with its CASES list).
const std::vector<std::string> kCases = {
    "distill_lightning_t2v_n4", "distill_lightning_i2v_n4",    "distill_lightning_n7_s3",
    "distill_lightx2v_4step",   "distill_lightx2v_4step_bf16", "distill_lightx2v_list7",
    "distill_lightx2v_list7_bf16",
};

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

json read_json(const std::string& path) {
  std::ifstream js(path);
  if (!js) throw std::runtime_error("missing fixture " + path);
  return json::parse(js);
}

std::vector<float> read_bin(const std::string& path, size_t count) {
  std::ifstream bin(path, std::ios::binary | std::ios::ate);
  if (!bin) throw std::runtime_error("missing fixture " + path);
  if (size_t(bin.tellg()) != count * 4) throw std::runtime_error(path + " has the wrong size");
  bin.seekg(0);
  std::vector<float> d(count);
  bin.read(reinterpret_cast<char*>(d.data()), std::streamsize(count * 4));
  return d;
}

// The sampler the fixture's reference corresponds to.
SamplerConfig config_of(const json& m) {
  SamplerConfig c;
  c.steps = m.at("steps").get<int>();
  c.shift = m.at("shift").get<double>();
  c.num_train_timesteps = m.at("num_train_timesteps").get<int>();
  if (m.at("kind") == "lightning") {
    c.solver = SolverKind::Euler;  // Wan2.2-Lightning's EulerScheduler.step is the existing Euler
    c.schedule = ScheduleKind::Lightning;
  } else {
    c.solver = SolverKind::StepDistill;
    c.timesteps = m.at("timesteps_given").get<std::vector<int64_t>>();
    c.bf16_latents = m.at("bf16").get<bool>();
  }
  return c;
}

// Replays one fixture: schedule (sigmas, DiT t), experts and every step, all bit for bit.
void check_fixture(const std::string& dir, const std::string& name) {
  SCOPED_TRACE(name);
  const json m = read_json(dir + "/" + name + ".json");
  const size_t n = m.at("n").get<size_t>();
  const int steps = m.at("steps").get<int>();
  const std::vector<float> d = read_bin(dir + "/" + name + ".bin", n * (1 + 2 * size_t(steps)));
  Sampler s(config_of(m));
  ASSERT_EQ(s.steps(), steps);
  const auto sb = m.at("sigmas_bits").get<std::vector<uint32_t>>();
  const auto tb = m.at("model_t_bits").get<std::vector<uint32_t>>();
  ASSERT_EQ(s.sigmas().size(), sb.size());
  ASSERT_EQ(s.model_timesteps().size(), tb.size());
  for (size_t i = 0; i < sb.size(); ++i) EXPECT_EQ(bits(s.sigmas()[i]), sb[i]) << "sigma " << i;
  for (size_t i = 0; i < tb.size(); ++i) EXPECT_EQ(bits(s.model_timesteps()[i]), tb[i]) << "DiT t " << i;
  EXPECT_EQ(s.timesteps(), m.at("timesteps").get<std::vector<int64_t>>());

  // Experts: the recorded rule (Lightning: t >= boundary * T; LightX2V: step < boundary_step_index)
  // must be what ExpertSchedule gives with the boundary the fixture names.
  const auto want_experts = m.at("experts").get<std::vector<std::string>>();
  if (!m.at("boundary").is_null()) {
    const SigmaSchedule sc = make_schedule(config_of(m));
    const double b = m.at("boundary").get<double>();
    const ExpertSchedule ef = ExpertSchedule::make(sc, b, 1.0f, 1.0f);
    const ExpertSchedule ei = ExpertSchedule::make(sc.timesteps, b, 1.0f, 1.0f);
    for (int i = 0; i < steps; ++i) {
      EXPECT_EQ(ef.steps[size_t(i)].expert == Expert::High ? "high" : "low", want_experts[size_t(i)]) << i;
      EXPECT_EQ(ei.steps[size_t(i)].expert, ef.steps[size_t(i)].expert) << i;
      EXPECT_EQ(ef.steps[size_t(i)].guide, 1.0f);
    }
  }

  std::vector<float> x(d.begin(), d.begin() + long(n));
  int exact_steps = 0;
  for (int i = 0; i < steps; ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    EXPECT_EQ(bits(s.model_timestep()), tb[size_t(i)]);
    const float* v = d.data() + n + size_t(2 * i) * n;
    const float* want = v + n;
    s.step(v, x.data(), n);
    bool exact = true;
    for (size_t j = 0; j < n; ++j) exact = exact && bits(x[j]) == bits(want[j]);
    EXPECT_TRUE(exact) << "x differs from the reference at step " << i;
    exact_steps += exact;
  }
  EXPECT_TRUE(s.done());
  std::printf("  %-28s %d steps, bit-exact steps %d/%d\n", name.c_str(), steps, exact_steps, steps);
}

void check_grid(const std::string& dir) {
  const json g = read_json(dir + "/distill_lightx2v_grid.json");
  const int T = g.at("num_train_timesteps").get<int>();
  std::vector<int64_t> all;  // T, T-1, ..., 1: grid entries k = T - t = 0 .. T-1 in order
  for (int t = T; t >= 1; --t) all.push_back(t);
  for (const json& e : g.at("grids")) {
    const double shift = e.at("shift").get<double>();
    SCOPED_TRACE("shift " + std::to_string(shift));
    const SigmaSchedule sc = make_schedule_from_timesteps(all, shift, T);
    const auto sb = e.at("sigmas_bits").get<std::vector<uint32_t>>();
    const auto tb = e.at("model_t_bits").get<std::vector<uint32_t>>();
    ASSERT_EQ(sc.sigmas.size(), size_t(T) + 1);
    int bad = 0;
    for (int k = 0; k < T; ++k) {
      bad += bits(sc.sigmas[size_t(k)]) != sb[size_t(k)];
      bad += bits(sc.model_t[size_t(k)]) != tb[size_t(k)];
    }
    EXPECT_EQ(bad, 0) << "grid entries differing from torch";
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Schedules

TEST(DistillSchedule, FourStepListValues) {
  const SigmaSchedule s = make_schedule_from_timesteps({1000, 750, 500, 250}, 5.0);
  EXPECT_EQ(s.sigmas, (std::vector<float>{1.0f, 0.9375f, from_bits(0x3f555555u), 0.625f, 0.0f}));
  EXPECT_EQ(s.model_t, (std::vector<float>{1000.0f, 937.5f, from_bits(0x44505555u), 625.0f}));
  EXPECT_EQ(s.timesteps, (std::vector<int64_t>{1000, 937, 833, 625}));
  // Lightning's own 4-step grid is the same schedule.
  SamplerConfig c;
  c.steps = 4;
  c.shift = 5.0;
  c.schedule = ScheduleKind::Lightning;
  const SigmaSchedule l = make_schedule(c);
  EXPECT_EQ(l.sigmas, s.sigmas);
  EXPECT_EQ(l.model_t, s.model_t);
  EXPECT_EQ(l.timesteps, s.timesteps);
  // Through SamplerConfig::timesteps as well.
  c.timesteps = {1000, 750, 500, 250};
  EXPECT_EQ(make_schedule(c).model_t, s.model_t);
  // shift 1: the listed values themselves.
  EXPECT_EQ(make_schedule_from_timesteps({1000, 750, 500, 250}, 1.0).model_t,
            (std::vector<float>{1000.0f, 750.0f, 500.0f, 250.0f}));
}

TEST(DistillSchedule, TaskGridsCarryIntegerModelT) {
  SamplerConfig c;  // official T2V grid
  const SigmaSchedule s = make_schedule(c);
  ASSERT_EQ(s.model_t.size(), s.timesteps.size());
  for (size_t i = 0; i < s.timesteps.size(); ++i) EXPECT_EQ(s.model_t[i], float(s.timesteps[i]));
  Sampler sm(c);
  EXPECT_EQ(sm.model_timestep(), float(sm.timestep()));
  // A custom schedule without model_t gets it from the integer timesteps.
  Sampler cu(SolverKind::Euler, SigmaSchedule{{0.9f, 0.5f, 0.0f}, {900, 500}});
  EXPECT_EQ(cu.model_timesteps(), (std::vector<float>{900.0f, 500.0f}));
}

TEST(DistillSchedule, ValidationErrors) {
  auto kind_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.kind();
    }
    return ErrorKind::Internal;
  };
  auto bad = [&](std::vector<int64_t> ts, double shift = 5.0) {
    EXPECT_EQ(kind_of([&] { make_schedule_from_timesteps(ts, shift); }), ErrorKind::BadInput);
    return error_of([&] { make_schedule_from_timesteps(ts, shift); });
  };
  EXPECT_NE(bad({}).find("empty"), std::string::npos);
  EXPECT_NE(bad({1000, 0}).find("outside [1, 1000]"), std::string::npos);
  EXPECT_NE(bad({1001, 500}).find("entry 1 (1001)"), std::string::npos);
  EXPECT_NE(bad({-5}).find("outside"), std::string::npos);
  EXPECT_NE(bad({1000, 750, 750}).find("decrease strictly (750 after 750"), std::string::npos);
  EXPECT_NE(bad({250, 500}).find("decrease strictly"), std::string::npos);
  EXPECT_NE(bad({1000}, 0.0).find("shift"), std::string::npos);
  EXPECT_NE(bad({1000}, NAN).find("shift"), std::string::npos);
  EXPECT_NO_THROW(make_schedule_from_timesteps({1}, 5.0));
  EXPECT_NO_THROW(make_schedule_from_timesteps({1000}, 5.0));
  // Every message is one line.
  EXPECT_EQ(bad({1000, 750, 750}).find('\n'), std::string::npos);

  SamplerConfig c;
  c.timesteps = {1000, 750, 500, 250};
  c.steps = 40;
  EXPECT_NE(error_of([&] { make_schedule(c); }).find("steps (40) differs from the 4 timesteps"), std::string::npos);

  EXPECT_EQ(parse_timesteps("1000,750,500,250"), (std::vector<int64_t>{1000, 750, 500, 250}));
  EXPECT_EQ(parse_timesteps(" 1000 , 750 "), (std::vector<int64_t>{1000, 750}));
  EXPECT_EQ(parse_timesteps("999"), (std::vector<int64_t>{999}));
  EXPECT_NE(error_of([] { parse_timesteps("1000,abc"); }).find("entry 2 ('abc') is not an integer"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_timesteps("1000,,500"); }).find("entry 2"), std::string::npos);
  EXPECT_NE(error_of([] { parse_timesteps("937.5"); }).find("not an integer"), std::string::npos);
  EXPECT_NE(error_of([] { parse_timesteps(""); }).find("entry 1"), std::string::npos);
  EXPECT_NE(error_of([] { parse_timesteps("99999999999999999999"); }).find("not an integer"), std::string::npos);
}

TEST(DistillSchedule, NamesAndOptions) {
  EXPECT_EQ(solver_from_name("step-distill"), SolverKind::StepDistill);
  EXPECT_STREQ(solver_name(SolverKind::StepDistill), "step-distill");
  EXPECT_EQ(schedule_from_name("lightning"), ScheduleKind::Lightning);
  EXPECT_STREQ(schedule_name(ScheduleKind::Lightning), "lightning");
  EXPECT_NE(error_of([] { solver_from_name("lcm"); }).find("step-distill"), std::string::npos);
  // bf16 latents are a step-distill option only.
  SamplerConfig c;
  c.solver = SolverKind::Euler;
  c.schedule = ScheduleKind::Lightning;
  c.steps = 4;
  c.bf16_latents = true;
  EXPECT_NE(error_of([&] { Sampler s(c); }).find("bf16 latents"), std::string::npos);
  // UniPC cannot start at sigma 1 (the list's t = 1000).
  c.solver = SolverKind::UniPC;
  c.bf16_latents = false;
  EXPECT_THROW(Sampler s(c), Error);
}

// ---------------------------------------------------------------------------------------------
// Against the references, step by step

class DistillFixture : public testing::TestWithParam<std::string> {};

TEST_P(DistillFixture, MatchesReferenceStepByStep) { check_fixture(kFixtures, GetParam()); }

INSTANTIATE_TEST_SUITE_P(Committed, DistillFixture, testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

TEST(DistillFixtureGrid, WholeLightX2VGridMatchesTorch) { check_grid(kFixtures); }

// The two updates agree in the limit but round differently, so the fixtures tell them apart: each
// reference's run replayed with the other solver is not bit-exact (hence a solver of its own).
TEST(DistillFixtureGrid, FixturesTellEulerAndStepDistillApart) {
  for (const char* name : {"distill_lightning_t2v_n4", "distill_lightx2v_4step"}) {
    SCOPED_TRACE(name);
    const json m = read_json(kFixtures + "/" + name + ".json");
    const size_t n = m.at("n").get<size_t>();
    const std::vector<float> d = read_bin(kFixtures + "/" + name + ".bin", n * 9);
    SamplerConfig c = config_of(m);
    c.solver = c.solver == SolverKind::Euler ? SolverKind::StepDistill : SolverKind::Euler;
    Sampler s(c);
    std::vector<float> x(d.begin(), d.begin() + long(n));
    size_t differ = 0;
    for (int i = 0; i < 4; ++i) {
      s.step(d.data() + n + size_t(2 * i) * n, x.data(), n);
      const float* want = d.data() + n + size_t(2 * i + 1) * n;
      for (size_t j = 0; j < n; ++j) differ += bits(x[j]) != bits(want[j]);
    }
    EXPECT_GT(differ, 0u);
  }
}

// The committed fixtures must be what the oracle produces now: regenerate them and replay.
TEST(DistillOracle, RegeneratedFixturesMatch) {
  ASSERT_TRUE(fs::exists(WAN_PYTHON)) << "python oracle missing: " << WAN_PYTHON;
  wan::test::TempDir tmp;
  const std::string cmd = std::string("'") + WAN_PYTHON + "' '" + WAN_SOURCE_DIR +
                          "/tools/make_distill_fixtures.py' --out '" + tmp.str() + "' > '" + tmp.str() +
                          "/log' 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    std::ifstream log(tmp.str() + "/log");
    FAIL() << "make_distill_fixtures.py failed (rc " << rc << "):\n"
           << std::string(std::istreambuf_iterator<char>(log), {});
  }
  for (const std::string& name : kCases) check_fixture(tmp.str(), name);
  check_grid(tmp.str());
}

// ---------------------------------------------------------------------------------------------
// The step-distill solver

TEST(StepDistill, CoefficientsAndStraightPath) {
  Sampler s(SolverKind::StepDistill, make_schedule_from_timesteps({1000, 750, 500, 250}, 5.0));
  const StepCoeffs c0 = s.plan_step();
  EXPECT_EQ(c0.sigma, 1.0f);
  EXPECT_EQ(c0.renoise, 0.9375f);
  EXPECT_EQ(c0.pred_order, 1);
  EXPECT_EQ(c0.round_bf16, 0);
  // On a straight flow path every data prediction is x0, so each step lands on the path.
  const size_t n = 97;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> x0(n), eps(n), v(n), x(n);
  for (size_t j = 0; j < n; ++j) x0[j] = nd(rng), eps[j] = nd(rng), v[j] = eps[j] - x0[j], x[j] = eps[j];
  for (int i = 0; i < 4; ++i) {
    s.step(v.data(), x.data(), n);
    const float sg = s.sigmas()[size_t(i) + 1];
    for (size_t j = 0; j < n; ++j) EXPECT_NEAR(x[j], (1 - sg) * x0[j] + sg * eps[j], 2e-6f) << i;
  }
  EXPECT_TRUE(s.done());
  // The last step is the data prediction itself: x - v * sigma.
  Sampler one(SolverKind::StepDistill, make_schedule_from_timesteps({600}, 5.0));
  std::vector<float> y = eps;
  one.step(v.data(), y.data(), n);
  const float sg = one.sigmas()[0];
  for (size_t j = 0; j < n; ++j) EXPECT_EQ(bits(y[j]), bits(eps[j] - v[j] * sg));
}

TEST(StepDistill, StateHasNoHistory) {
  SamplerConfig c;
  c.solver = SolverKind::StepDistill;
  c.timesteps = {1000, 750, 500, 250};
  c.steps = 4;
  c.shift = 5.0;
  Sampler s(c);
  std::vector<float> v(8, 0.5f), x(8, 1.0f);
  s.step(v.data(), x.data(), 8);
  SamplerState st = s.state();
  EXPECT_EQ(st.index, 1);
  EXPECT_TRUE(st.m_last.empty() && st.m_prev.empty() && st.last_sample.empty());
  Sampler r(c);
  r.set_state(st);
  EXPECT_EQ(r.index(), 1);
  st.m_last.assign(8, 0.0f);
  EXPECT_THROW(r.set_state(st), Error);
  // take_step (the GPU path) yields the same coefficients as plan_step.
  Sampler g(c);
  for (int i = 0; i < 4; ++i) {
    const StepCoeffs p = g.plan_step(), t = g.take_step();
    EXPECT_EQ(p.sigma, t.sigma);
    EXPECT_EQ(p.renoise, t.renoise);
    EXPECT_EQ(t.pred_order, i < 3 ? 1 : 0);
  }
}

TEST(StepDistill, Bf16Rounding) {
  using sampler_math::round_bf16;
  EXPECT_EQ(round_bf16(1.0f), 1.0f);
  EXPECT_EQ(round_bf16(from_bits(0x3f808000u)), 1.0f);                     // tie -> even (down)
  EXPECT_EQ(bits(round_bf16(from_bits(0x3f818000u))), 0x3f820000u);        // tie -> even (up)
  EXPECT_EQ(bits(round_bf16(from_bits(0x3f808001u))), 0x3f810000u);        // above the tie
  EXPECT_EQ(bits(round_bf16(-from_bits(0x3f807fffu))), 0xbf800000u);       // below the tie
  EXPECT_EQ(round_bf16(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(round_bf16(NAN)));
  EXPECT_EQ(bits(round_bf16(from_bits(0x7f7fffffu))), 0x7f800000u);        // overflow to inf
  // With bf16 latents every output is a bf16 value and the input is rounded first.
  SamplerConfig c;
  c.solver = SolverKind::StepDistill;
  c.timesteps = {1000, 500};
  c.steps = 2;
  c.shift = 5.0;
  c.bf16_latents = true;
  Sampler s(c);
  EXPECT_TRUE(s.bf16_latents());
  EXPECT_EQ(s.plan_step().round_bf16, 1);
  std::vector<float> x = {1.00390625f + 1e-6f, -0.3f}, v = {0.25f, 0.1f};
  const std::vector<float> x_in = x;
  s.step(v.data(), x.data(), 2);
  for (size_t j = 0; j < 2; ++j) {
    EXPECT_EQ(bits(x[j]) & 0xffffu, 0u);
    const float m = round_bf16(x_in[j]) - v[j] * s.sigmas()[0];
    EXPECT_EQ(bits(x[j]), bits(round_bf16(m + v[j] * s.sigmas()[1])));
  }
}

// ---------------------------------------------------------------------------------------------
// Presets

TEST(Presets, TableAndLookup) {
  ASSERT_GE(presets().size(), 2u);
  EXPECT_EQ(preset_names(), "lightning-4step, lightx2v-4step");
  const Preset& l = find_preset("lightning-4step");
  EXPECT_EQ(l.steps, 4);
  EXPECT_TRUE(l.timesteps.empty());
  EXPECT_EQ(l.shift, 5.0);
  EXPECT_EQ(l.guide_low, 1.0f);
  EXPECT_EQ(l.guide_high, 1.0f);
  EXPECT_FALSE(l.boundary.has_value());  // the task's: 0.875 T2V, 0.900 I2V, as Lightning's configs
  EXPECT_EQ(l.solver, SolverKind::Euler);
  EXPECT_EQ(l.schedule, ScheduleKind::Lightning);
  EXPECT_FALSE(l.bf16_latents);
  EXPECT_TRUE(l.applies_to("t2v-A14B") && l.applies_to("i2v-A14B") && !l.applies_to("ti2v-5B"));
  const Preset& x = find_preset("lightx2v-4step");
  EXPECT_EQ(x.timesteps, (std::vector<int64_t>{1000, 750, 500, 250}));
  EXPECT_EQ(x.steps, 4);
  EXPECT_EQ(x.shift, 5.0);
  EXPECT_EQ(x.guide_low, 1.0f);
  EXPECT_EQ(x.guide_high, 1.0f);
  EXPECT_EQ(x.boundary, 0.875);
  EXPECT_EQ(x.solver, SolverKind::StepDistill);
  EXPECT_TRUE(x.bf16_latents);
  for (const Preset& p : presets()) EXPECT_FALSE(p.description.empty() || p.source.empty()) << p.name;
  const std::string e = error_of([] { find_preset("turbo"); });
  EXPECT_NE(e.find("unknown preset 'turbo'"), std::string::npos);
  EXPECT_NE(e.find("lightning-4step, lightx2v-4step"), std::string::npos);
}

TEST(Presets, ExpertSplitOfTheFourStepList) {
  // Lightning's boundaries (T2V 0.875, I2V 0.9) and LightX2V's boundary_step_index 2 agree.
  for (const char* name : {"lightning-4step", "lightx2v-4step"}) {
    for (const char* task : {"t2v-A14B", "i2v-A14B"}) {
      SCOPED_TRACE(std::string(name) + " " + task);
      const ResolvedSampling r = resolve_sampling(task, sampling_defaults(task), &find_preset(name), {});
      const SigmaSchedule sc = make_schedule(r.sampler);
      const ExpertSchedule es = ExpertSchedule::make(sc, r.boundary, r.guide_low, r.guide_high);
      ASSERT_EQ(es.steps.size(), 4u);
      EXPECT_EQ(es.num_high(), 2);
      EXPECT_EQ(es.steps[0].expert, Expert::High);
      EXPECT_EQ(es.steps[1].expert, Expert::High);
      EXPECT_EQ(es.steps[2].expert, Expert::Low);
      EXPECT_EQ(es.steps[3].expert, Expert::Low);
      // Guide exactly 1: the denoise loop's single-pass (no unconditional) path.
      for (const ExpertStep& s : es.steps) EXPECT_EQ(s.guide, 1.0f);
      EXPECT_EQ(ExpertSchedule::make(sc.timesteps, r.boundary, 1.0f, 1.0f).num_high(), 2);
    }
  }
}

TEST(Presets, ResolveUserOptionsWin) {
  const SamplingDefaults t2v = sampling_defaults("t2v-A14B");
  // No preset, no options: the task defaults, exactly as before.
  ResolvedSampling r = resolve_sampling("t2v-A14B", t2v, nullptr, {});
  EXPECT_EQ(r.sampler.solver, SolverKind::UniPC);
  EXPECT_EQ(r.sampler.schedule, ScheduleKind::Official);
  EXPECT_EQ(r.sampler.steps, 40);
  EXPECT_EQ(r.sampler.shift, 12.0);
  EXPECT_TRUE(r.sampler.timesteps.empty());
  EXPECT_FALSE(r.sampler.bf16_latents);
  EXPECT_EQ(r.boundary, 0.875);
  EXPECT_EQ(r.guide_low, 3.0f);
  EXPECT_EQ(r.guide_high, 4.0f);

  const Preset& l = find_preset("lightning-4step");
  const Preset& x = find_preset("lightx2v-4step");
  r = resolve_sampling("i2v-A14B", sampling_defaults("i2v-A14B"), &l, {});
  EXPECT_EQ(r.sampler.solver, SolverKind::Euler);
  EXPECT_EQ(r.sampler.schedule, ScheduleKind::Lightning);
  EXPECT_EQ(r.sampler.steps, 4);
  EXPECT_EQ(r.sampler.shift, 5.0);
  EXPECT_EQ(r.boundary, 0.9);
  EXPECT_EQ(r.guide_low, 1.0f);

  SamplingOptions u;
  u.steps = 8;
  u.shift = 3.0;
  u.guide_high = 2.0f;
  u.boundary = 0.8;
  r = resolve_sampling("t2v-A14B", t2v, &l, u);
  EXPECT_EQ(r.sampler.steps, 8);
  EXPECT_EQ(r.sampler.shift, 3.0);
  EXPECT_EQ(r.guide_high, 2.0f);
  EXPECT_EQ(r.guide_low, 1.0f);
  EXPECT_EQ(r.boundary, 0.8);
  EXPECT_EQ(make_schedule(r.sampler).sigmas.size(), 9u);

  // The list preset: its list, its solver, bf16 latents.
  r = resolve_sampling("t2v-A14B", t2v, &x, {});
  EXPECT_EQ(r.sampler.timesteps, x.timesteps);
  EXPECT_EQ(r.sampler.steps, 4);
  EXPECT_TRUE(r.sampler.bf16_latents);
  EXPECT_NO_THROW(Sampler s(r.sampler));
  // --steps other than the list's size is an error; equal is fine.
  SamplingOptions st;
  st.steps = 6;
  EXPECT_NE(error_of([&] { resolve_sampling("t2v-A14B", t2v, &x, st); }).find("fixes 4 timesteps"),
            std::string::npos);
  st.steps = 4;
  EXPECT_EQ(resolve_sampling("t2v-A14B", t2v, &x, st).sampler.timesteps.size(), 4u);
  // --timesteps replace the preset's list; --schedule drops it.
  SamplingOptions ts;
  ts.timesteps = {1000, 900, 600};
  r = resolve_sampling("t2v-A14B", t2v, &x, ts);
  EXPECT_EQ(r.sampler.timesteps, ts.timesteps);
  EXPECT_EQ(r.sampler.steps, 3);
  SamplingOptions sch;
  sch.schedule = ScheduleKind::Lightning;
  sch.steps = 6;
  r = resolve_sampling("t2v-A14B", t2v, &x, sch);
  EXPECT_TRUE(r.sampler.timesteps.empty());
  EXPECT_EQ(r.sampler.steps, 6);
  // A user solver other than step-distill turns bf16 latents off.
  SamplingOptions eu;
  eu.solver = SolverKind::Euler;
  r = resolve_sampling("t2v-A14B", t2v, &x, eu);
  EXPECT_EQ(r.sampler.solver, SolverKind::Euler);
  EXPECT_FALSE(r.sampler.bf16_latents);
  EXPECT_NO_THROW(Sampler s(r.sampler));
  // --timesteps alone select step-distill; with --sampler the user's solver.
  r = resolve_sampling("t2v-A14B", t2v, nullptr, ts);
  EXPECT_EQ(r.sampler.solver, SolverKind::StepDistill);
  EXPECT_EQ(r.sampler.shift, 12.0);  // the task's shift: nothing else changes
  EXPECT_EQ(r.guide_high, 4.0f);
  ts.solver = SolverKind::Euler;
  EXPECT_EQ(resolve_sampling("t2v-A14B", t2v, nullptr, ts).sampler.solver, SolverKind::Euler);
  // A preset for another task.
  EXPECT_NE(error_of([&] { resolve_sampling("ti2v-5B", sampling_defaults("ti2v-5B"), &l, {}); })
                .find("preset lightning-4step is for t2v-A14B, i2v-A14B, not ti2v-5B"),
            std::string::npos);
}
