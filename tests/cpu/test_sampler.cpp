// Tests for the flow-matching samplers (src/sampler): the task timestep lists of spec §7.2 regenerated
// from the formula, the diffusers schedule, UniPC / DPM++ / Euler step by step against fixtures made
// with diffusers (tools/make_sampler_fixtures.py; committed under tests/fixtures/sampler and also
// regenerated here through WAN_PYTHON), CFG, the expert schedule across the switch, the final
// step onto sigma 0, exactness on a straight flow path, and the error paths.
#include <gtest/gtest.h>
#include <unistd.h>

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
#include "sampler/sampler.h"
#include "test_util.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace wan;

namespace {

const std::string kFixtures = std::string(WAN_FIXTURES) + "/sampler";

// The cases tools/make_sampler_fixtures.py writes (kept in sync with its CASES list).
const std::vector<std::string> kCases = {
    "unipc_official_t2v_n10",  "unipc_official_t2v_n40", "unipc_official_i2v_n40", "unipc_official_ti2v_n10",
    "unipc_official_ti2v_n50", "unipc_official_n1",      "unipc_official_n2",      "unipc_official_n3",
    "unipc_diffusers_n10",     "unipc_diffusers_n40",    "dpmpp_official_n10",     "dpmpp_official_n40",
    "dpmpp_official_n2",       "dpmpp_diffusers_n10",    "euler_official_n10",     "euler_diffusers_n40",
};

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

struct Fixture {
  json meta;
  size_t n = 0;
  int steps = 0;
  std::vector<float> data;  // x0, then per step: v_cond, v_uncond, v, x_next
  const float* x0() const { return data.data(); }
  const float* at(int step, int which) const { return data.data() + n + (size_t(step) * 4 + which) * n; }
};

Fixture load_fixture(const std::string& dir, const std::string& name) {
  Fixture f;
  std::ifstream js(dir + "/" + name + ".json");
  if (!js) throw std::runtime_error("missing fixture " + dir + "/" + name + ".json");
  f.meta = json::parse(js);
  f.n = f.meta.at("n").get<size_t>();
  f.steps = f.meta.at("steps").get<int>();
  const size_t count = f.n * (1 + 4 * size_t(f.steps));
  std::ifstream bin(dir + "/" + name + ".bin", std::ios::binary | std::ios::ate);
  if (!bin) throw std::runtime_error("missing fixture " + dir + "/" + name + ".bin");
  if (size_t(bin.tellg()) != count * 4) throw std::runtime_error("fixture " + name + ".bin has the wrong size");
  bin.seekg(0);
  f.data.resize(count);
  bin.read(reinterpret_cast<char*>(f.data.data()), std::streamsize(count * 4));
  return f;
}

SamplerConfig config_of(const json& m) {
  SamplerConfig c;
  c.solver = solver_from_name(m.at("solver").get<std::string>());
  c.schedule = schedule_from_name(m.at("schedule").get<std::string>());
  c.steps = m.at("steps").get<int>();
  c.shift = m.at("shift").get<double>();
  c.num_train_timesteps = m.at("num_train_timesteps").get<int>();
  return c;
}

// Replays one fixture: schedule, expert/guide per step, CFG and every solver step.
void check_fixture(const std::string& dir, const std::string& name) {
  SCOPED_TRACE(name);
  const Fixture f = load_fixture(dir, name);
  const json& m = f.meta;
  const SamplerConfig cfg = config_of(m);
  Sampler s(cfg);
  ASSERT_EQ(s.steps(), f.steps);

  // Schedule: float32 sigmas bit for bit, integer timesteps exactly.
  const auto& sb = m.at("sigmas_bits");
  ASSERT_EQ(s.sigmas().size(), sb.size());
  for (size_t i = 0; i < sb.size(); ++i) EXPECT_EQ(bits(s.sigmas()[i]), sb[i].get<uint32_t>()) << "sigma " << i;
  EXPECT_EQ(s.timesteps(), m.at("timesteps").get<std::vector<int64_t>>());

  const double boundary = m.at("boundary").is_null() ? 0.0 : m.at("boundary").get<double>();
  const ExpertSchedule es = ExpertSchedule::make(s.timesteps(), boundary, m.at("guide_low").get<float>(),
                                                 m.at("guide_high").get<float>());
  ASSERT_EQ(es.steps.size(), size_t(f.steps));

  std::vector<float> x(f.x0(), f.x0() + f.n), v(f.n);
  double worst = 0;
  int exact_steps = 0;
  for (int i = 0; i < f.steps; ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    const std::string want_expert = m.at("experts")[size_t(i)].get<std::string>();
    EXPECT_EQ(es.steps[size_t(i)].expert == Expert::High ? "high" : "low", want_expert);
    EXPECT_EQ(es.steps[size_t(i)].guide, m.at("guides")[size_t(i)].get<float>());
    EXPECT_EQ(s.index(), i);
    EXPECT_EQ(s.timestep(), s.timesteps()[size_t(i)]);

    cfg_combine(f.at(i, 0), f.at(i, 1), es.steps[size_t(i)].guide, v.data(), f.n);
    for (size_t j = 0; j < f.n; ++j) ASSERT_EQ(bits(v[j]), bits(f.at(i, 2)[j])) << "CFG element " << j;

    s.step(v.data(), x.data(), f.n);
    const float* want = f.at(i, 3);
    double scale = 1.0, err = 0;
    bool exact = true;
    for (size_t j = 0; j < f.n; ++j) {
      ASSERT_TRUE(std::isfinite(x[j]));
      scale = std::max(scale, double(std::fabs(want[j])));
      err = std::max(err, double(std::fabs(x[j] - want[j])));
      exact = exact && bits(x[j]) == bits(want[j]);
    }
    EXPECT_LE(err, 1e-5 * scale) << "max abs error " << err;
    worst = std::max(worst, err / scale);
    exact_steps += exact;
  }
  EXPECT_TRUE(s.done());
  std::printf("  %-26s %2d steps, max rel error %.3g, bit-exact steps %d/%d\n", name.c_str(), f.steps, worst,
              exact_steps, f.steps);
}

using wan::test::TempDir;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Schedules

TEST(SamplerSchedule, TaskTimestepListsMatchSpec) {
  const std::vector<int64_t> t2v = {999, 997, 995, 993, 990, 988, 985, 982, 979, 976, 972, 969, 965, 961,
                                    956, 952, 947, 941, 936, 929, 922, 915, 907, 898, 888, 877, 865, 852,
                                    837, 819, 799, 776, 749, 717, 678, 631, 571, 492, 386, 235};
  const std::vector<int64_t> i2v = {999, 994, 989, 983, 978, 972, 965, 959, 952, 944, 937, 929, 920, 911,
                                    902, 892, 882, 870, 859, 846, 833, 818, 803, 786, 768, 749, 728, 706,
                                    681, 654, 624, 591, 555, 514, 468, 416, 356, 288, 208, 113};
  const std::vector<int64_t> ti2v = {999, 995, 991, 987, 982, 978, 973, 968, 963, 957, 952, 946, 940,
                                     934, 927, 920, 913, 906, 898, 890, 882, 873, 863, 854, 843, 833,
                                     821, 809, 796, 783, 768, 753, 737, 720, 701, 681, 660, 636, 611,
                                     584, 555, 522, 487, 448, 405, 356, 302, 241, 172, 92};
  struct Case {
    const char* task;
    const std::vector<int64_t>* want;
    int high;
    double sigma0;
  };
  for (const Case& c : {Case{"t2v-A14B", &t2v, 26, 0.999917}, Case{"i2v-A14B", &i2v, 15, 0.999800},
                        Case{"ti2v-5B", &ti2v, 50, 0.999800}}) {
    SCOPED_TRACE(c.task);
    const SamplingDefaults d = sampling_defaults(c.task);
    SamplerConfig cfg;
    cfg.steps = d.steps;
    cfg.shift = d.shift;
    for (SolverKind k : {SolverKind::UniPC, SolverKind::Euler}) {
      cfg.solver = k;
      const SigmaSchedule s = make_schedule(cfg);
      EXPECT_EQ(s.timesteps, *c.want);
      ASSERT_EQ(s.sigmas.size(), c.want->size() + 1);
      EXPECT_EQ(s.sigmas.back(), 0.0f);
      EXPECT_NEAR(s.sigmas[0], c.sigma0, 5e-7);
      const ExpertSchedule es = ExpertSchedule::make(s.timesteps, d.boundary, d.guide_low, d.guide_high);
      EXPECT_EQ(es.num_high(), c.high);
      for (size_t i = 0; i < es.steps.size(); ++i) {
        const bool high = es.steps[i].expert == Expert::High;
        EXPECT_EQ(high, int(i) < c.high) << i;  // the high-noise steps come first, then the switch
        EXPECT_EQ(es.steps[i].guide, high ? d.guide_high : d.guide_low);
      }
    }
  }
  const SamplingDefaults t = sampling_defaults("t2v-A14B");
  EXPECT_EQ(t.guide_low, 3.0f);
  EXPECT_EQ(t.guide_high, 4.0f);
  EXPECT_EQ(t.boundary, 0.875);
  EXPECT_EQ(sampling_defaults("i2v-A14B").boundary, 0.9);
  EXPECT_EQ(sampling_defaults("ti2v-5B").guide_high, 5.0f);
  EXPECT_THROW(sampling_defaults("t2v-1.3B"), Error);
}

TEST(SamplerSchedule, OfficialDpmAndDiffusersGrids) {
  SamplerConfig c;
  c.solver = SolverKind::DpmPP;
  c.steps = 40;
  c.shift = 12.0;
  SigmaSchedule s = make_schedule(c);
  EXPECT_EQ(s.sigmas[0], 1.0f);  // get_sampling_sigmas starts at 1: t = 1000
  EXPECT_EQ(s.timesteps[0], 1000);
  EXPECT_EQ(s.sigmas.back(), 0.0f);

  // diffusers: linspace(1, 1/1000) shifted puts sigma_0 at exactly 1, lowered by 1e-6.
  c.solver = SolverKind::UniPC;
  c.schedule = ScheduleKind::Diffusers;
  c.steps = 10;
  c.shift = 3.0;
  s = make_schedule(c);
  EXPECT_EQ(s.sigmas[0], static_cast<float>(1.0 - 1e-6));
  EXPECT_EQ(s.timesteps, (std::vector<int64_t>{999, 964, 923, 875, 818, 750, 667, 563, 429, 251}));
  // The last grid point is 1/1000 + one step: shift(0.1009) for N = 10.
  const double g = 1.0 + 9 * ((0.001 - 1.0) / 10);
  EXPECT_EQ(s.sigmas[9], static_cast<float>(3.0 * g / (1 + 2.0 * g)));

  // t = 875 sits exactly on the T2V boundary: >= selects the high-noise expert.
  const ExpertSchedule es = ExpertSchedule::make(s.timesteps, 0.875, 3.0f, 4.0f);
  EXPECT_EQ(es.steps[3].expert, Expert::High);
  EXPECT_EQ(es.steps[4].expert, Expert::Low);
  EXPECT_EQ(es.steps[4].guide, 3.0f);
}

TEST(SamplerSchedule, NamesAndBadConfigs) {
  for (SolverKind k : {SolverKind::UniPC, SolverKind::DpmPP, SolverKind::Euler})
    EXPECT_EQ(solver_from_name(solver_name(k)), k);
  for (ScheduleKind k : {ScheduleKind::Official, ScheduleKind::Diffusers})
    EXPECT_EQ(schedule_from_name(schedule_name(k)), k);
  EXPECT_THROW(solver_from_name("ddim"), Error);
  EXPECT_THROW(schedule_from_name("karras"), Error);

  SamplerConfig c;
  c.steps = 0;
  EXPECT_THROW(make_schedule(c), Error);
  c.steps = 4;
  c.shift = 0;
  EXPECT_THROW(make_schedule(c), Error);
  c.shift = 5;
  c.num_train_timesteps = 0;
  EXPECT_THROW(make_schedule(c), Error);

  auto custom = [](std::vector<float> sig, std::vector<int64_t> t) {
    return SigmaSchedule{std::move(sig), std::move(t)};
  };
  EXPECT_NO_THROW(Sampler(SolverKind::UniPC, custom({0.9f, 0.5f, 0.0f}, {900, 500})));
  EXPECT_THROW(Sampler(SolverKind::UniPC, custom({1.0f, 0.5f, 0.0f}, {1000, 500})), Error);  // log(0) in UniC
  EXPECT_NO_THROW(Sampler(SolverKind::DpmPP, custom({1.0f, 0.5f, 0.0f}, {1000, 500})));
  EXPECT_THROW(Sampler(SolverKind::DpmPP, custom({0.5f, 0.9f, 0.0f}, {500, 900})), Error);   // increasing
  EXPECT_THROW(Sampler(SolverKind::DpmPP, custom({0.9f, 0.5f, 0.1f}, {900, 500})), Error);   // last != 0
  EXPECT_THROW(Sampler(SolverKind::DpmPP, custom({0.9f, 0.5f, 0.0f}, {900})), Error);        // count
  EXPECT_THROW(Sampler(SolverKind::Euler, custom({1.5f, 0.5f, 0.0f}, {900, 500})), Error);   // > 1
  EXPECT_THROW(Sampler(SolverKind::Euler, custom({NAN, 0.5f, 0.0f}, {900, 500})), Error);
  EXPECT_THROW(ExpertSchedule::make({999, 500}, 1.5, 3.0f, 4.0f), Error);
}

// ---------------------------------------------------------------------------------------------
// Against diffusers, step by step

class SamplerFixture : public testing::TestWithParam<std::string> {};

TEST_P(SamplerFixture, MatchesDiffusersStepByStep) { check_fixture(kFixtures, GetParam()); }

INSTANTIATE_TEST_SUITE_P(Committed, SamplerFixture, testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

// The committed fixtures must be what the oracle produces now: regenerate them and replay.
TEST(SamplerOracle, RegeneratedFixturesMatch) {
  ASSERT_TRUE(fs::exists(WAN_PYTHON)) << "python oracle missing: " << WAN_PYTHON;
  TempDir tmp;
  const std::string cmd = std::string("'") + WAN_PYTHON + "' '" + WAN_SOURCE_DIR +
                          "/tools/make_sampler_fixtures.py' --out '" + tmp.str() + "' > '" + tmp.str() +
                          "/log' 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    std::ifstream log(tmp.str() + "/log");
    FAIL() << "make_sampler_fixtures.py failed (rc " << rc << "):\n"
           << std::string(std::istreambuf_iterator<char>(log), {});
  }
  for (const std::string& name : kCases) check_fixture(tmp.str(), name);
}

// ---------------------------------------------------------------------------------------------
// Semantics on fresh random inputs

// On a straight flow path (constant velocity v = eps - x0) every data prediction is x0, so every
// solver must follow x_sigma = (1 - sigma) x0 + sigma eps and end on x0.
TEST(SamplerSemantics, StraightPathIsExactForEverySolver) {
  const size_t n = 257;
  const std::vector<float> x0 = randn(n, 11), eps = randn(n, 12);
  std::vector<float> v(n);
  for (size_t j = 0; j < n; ++j) v[j] = eps[j] - x0[j];
  for (SolverKind k : {SolverKind::UniPC, SolverKind::DpmPP, SolverKind::Euler}) {
    for (ScheduleKind sk : {ScheduleKind::Official, ScheduleKind::Diffusers}) {
      SCOPED_TRACE(std::string(solver_name(k)) + " " + schedule_name(sk));
      SamplerConfig c;
      c.solver = k;
      c.schedule = sk;
      c.steps = 12;
      c.shift = 5.0;
      Sampler s(c);
      std::vector<float> x(n);
      const float s0 = s.sigmas()[0];
      for (size_t j = 0; j < n; ++j) x[j] = (1 - s0) * x0[j] + s0 * eps[j];
      while (!s.done()) {
        s.step(v.data(), x.data(), n);
        const double sig = s.sigmas()[size_t(s.index())];
        for (size_t j = 0; j < n; ++j)
          ASSERT_NEAR(x[j], (1 - sig) * x0[j] + sig * eps[j], 2e-5) << "after step " << s.index() - 1;
      }
    }
  }
}

// The step onto sigma = 0 returns the data prediction of the sample it was given, x - sigma v,
// exactly (lambda = +inf there); the corrector of that step cannot change it.
TEST(SamplerSemantics, FinalStepLandsOnDataPrediction) {
  const size_t n = 300;
  for (SolverKind k : {SolverKind::UniPC, SolverKind::DpmPP}) {
    for (int steps : {1, 2, 7}) {
      SCOPED_TRACE(std::string(solver_name(k)) + " N=" + std::to_string(steps));
      SamplerConfig c;
      c.solver = k;
      c.steps = steps;
      c.shift = 12.0;
      Sampler s(c);
      std::vector<float> x = randn(n, 21);
      for (int i = 0; i < steps; ++i) {
        const std::vector<float> v = randn(n, 100 + uint32_t(i), 1.3f);
        const std::vector<float> in = x;
        s.step(v.data(), x.data(), n);
        for (size_t j = 0; j < n; ++j) ASSERT_TRUE(std::isfinite(x[j]));
        if (i == steps - 1) {
          const float sig = s.sigmas()[size_t(i)];
          for (size_t j = 0; j < n; ++j) ASSERT_EQ(bits(x[j]), bits(in[j] - sig * v[j])) << j;
        }
      }
      EXPECT_TRUE(s.done());
      EXPECT_THROW(s.timestep(), Error);
      std::vector<float> v(n, 0.5f);
      EXPECT_THROW(s.step(v.data(), x.data(), n), Error);
    }
  }
}

// Official DPM++ starts at sigma = 1 (lambda = -inf): the first step is sigma_1 x + alpha_1 x0_hat,
// and the second step's history term vanishes (r0 = inf) instead of turning into NaN.
TEST(SamplerSemantics, DpmFromSigmaOne) {
  const size_t n = 64;
  SamplerConfig c;
  c.solver = SolverKind::DpmPP;
  c.steps = 6;
  c.shift = 5.0;
  Sampler s(c);
  ASSERT_EQ(s.sigmas()[0], 1.0f);
  std::vector<float> x = randn(n, 31);
  const std::vector<float> v = randn(n, 32);
  const std::vector<float> in = x;
  s.step(v.data(), x.data(), n);
  const float s1 = s.sigmas()[1], a1 = 1.0f - s1;
  for (size_t j = 0; j < n; ++j) {
    const float m = in[j] - 1.0f * v[j];
    ASSERT_EQ(bits(x[j]), bits(s1 * in[j] - (a1 * -1.0f) * m)) << j;
  }
  const std::vector<float> v2 = randn(n, 33);
  s.step(v2.data(), x.data(), n);
  for (float e : x) ASSERT_TRUE(std::isfinite(e));
}

TEST(SamplerSemantics, ResetReplaysAndSizeIsChecked) {
  const size_t n = 100;
  SamplerConfig c;
  c.steps = 9;
  Sampler s(c);
  auto run = [&](Sampler& smp) {
    std::vector<float> x = randn(n, 41);
    for (int i = 0; !smp.done(); ++i) {
      const std::vector<float> v = randn(n, 200 + uint32_t(i));
      smp.step(v.data(), x.data(), n);
    }
    return x;
  };
  const std::vector<float> a = run(s);
  s.reset();
  EXPECT_EQ(s.index(), 0);
  const std::vector<float> b = run(s);
  EXPECT_EQ(a, b);

  s.reset();
  std::vector<float> x = randn(n, 1), v = randn(n, 2);
  s.step(v.data(), x.data(), n);
  EXPECT_THROW(s.step(v.data(), x.data(), n - 1), Error);  // the latent size cannot change mid-run
  EXPECT_THROW(s.step(nullptr, x.data(), n), Error);
}

TEST(SamplerGuidance, CfgCombine) {
  const size_t n = 1000;
  const std::vector<float> vc = randn(n, 51), vu = randn(n, 52);
  std::vector<float> out(n);
  for (float g : {0.0f, 1.0f, 3.5f, 5.0f}) {
    cfg_combine(vc.data(), vu.data(), g, out.data(), n);
    for (size_t j = 0; j < n; ++j) {
      const float d = vc[j] - vu[j];
      ASSERT_EQ(bits(out[j]), bits(vu[j] + g * d));
      ASSERT_NEAR(out[j], double(vu[j]) + g * (double(vc[j]) - vu[j]), 1e-5);
    }
    if (g == 0.0f) {
      EXPECT_EQ(out, vu);
    }
  }
  std::vector<float> alias = vc;
  cfg_combine(alias.data(), vu.data(), 4.0f, alias.data(), n);
  cfg_combine(vc.data(), vu.data(), 4.0f, out.data(), n);
  EXPECT_EQ(alias, out);
}

TEST(SamplerGuidance, SingleModelAndSwitch) {
  const ExpertSchedule one = ExpertSchedule::make({999, 500, 100}, 0.0, 5.0f, 5.0f);
  EXPECT_EQ(one.num_high(), 3);
  for (const ExpertStep& e : one.steps) EXPECT_EQ(e.guide, 5.0f);
  const ExpertSchedule two = ExpertSchedule::make({950, 900, 899, 10}, 0.9, 3.5f, 4.5f);
  EXPECT_EQ(two.num_high(), 2);
  EXPECT_EQ(two.steps[1].expert, Expert::High);  // 900 >= 0.9 * 1000
  EXPECT_EQ(two.steps[1].guide, 4.5f);
  EXPECT_EQ(two.steps[2].expert, Expert::Low);
  EXPECT_EQ(two.steps[2].guide, 3.5f);
}
