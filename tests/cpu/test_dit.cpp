// The CPU DiT forward against the diffusers oracle (tests/fixtures/tiny_dit, written by
// tools/make_fixtures.py): final velocity and per-block intermediates for T2V with CFG-like batch 2,
// an odd non-square grid, I2V (in_dim 36), per-token (TI2V) timesteps and a single-frame latent;
// sequence padding, batch independence, shape errors, and the official-name copy of the weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "ckpt/layout.h"
#include "ckpt/names.h"
#include "models/config.h"
#include "models/dit/dit_cpu.h"
#include "formats/safetensors.h"

namespace {

namespace fs = std::filesystem;
const std::string kDir = std::string(WAN_FIXTURES) + "/tiny_dit";
constexpr double kRelTol = 1e-4;

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Fixture {
  wan::DiTConfig cfg;
  wan::SafetensorsSet weights = wan::SafetensorsSet::open(kDir + "/transformer");
  wan::SafetensorsSet i2v_patch = wan::SafetensorsSet::open(kDir + "/i2v_patch_embedding.safetensors");
  wan::SafetensorsSet cases = wan::SafetensorsSet::open(kDir + "/cases.safetensors");
  wan::DiTWeights t2v, i2v;
  wan::DiTConfig i2v_cfg;

  Fixture() {
    cfg = wan::dit_config_from_json(read_text(kDir + "/transformer/config.json"));
    t2v = wan::load_dit_weights(cfg, [&](const std::string& n) { return get(n, false); });
    i2v_cfg = cfg;
    i2v_cfg.in_dim = 36;
    i2v = wan::load_dit_weights(i2v_cfg, [&](const std::string& n) { return get(n, true); });
  }
  // official name -> diffusers name -> tensor (the I2V variant replaces only the patch embedding)
  wan::Tensor get(const std::string& official, bool i2v_variant) const {
    const std::string d = wan::dit_official_to_diffusers(official);
    EXPECT_FALSE(d.empty()) << official;
    if (i2v_variant && official.rfind("patch_embedding.", 0) == 0) return i2v_patch.get(d).to_f32();
    return weights.get(d).to_f32();
  }
  wan::Tensor input(const std::string& name) const { return cases.get(name).to_f32(); }
  std::vector<int64_t> lens(const std::string& c) const {
    wan::Tensor t = cases.get(c + ".context_lens");
    EXPECT_EQ(t.dtype(), wan::DType::I64);
    const int64_t* p = static_cast<const int64_t*>(t.data());
    return std::vector<int64_t>(p, p + t.numel());
  }
};

const Fixture& fixture() {
  static Fixture f;
  return f;
}

// Compares got [B, Sg, ...] with want [B, Sw, ...] on the first Sw rows of dim 1 (the fixture
// stores fewer rows for hooks such as text_embed; the engine may carry padding rows).
// Relative error = max|a - b| / max|b|; elementwise |a - b| <= kRelTol·(|b| + 0.05·max|b|).
double compare(const wan::Tensor& got, const wan::Tensor& want, const std::string& what) {
  EXPECT_EQ(got.ndim(), want.ndim()) << what;
  if (got.ndim() != want.ndim()) return INFINITY;
  for (int i = 0; i < got.ndim(); ++i) {
    if (i != 1) {
      EXPECT_EQ(got.dim(i), want.dim(i)) << what << " dim " << i;
    }
  }
  EXPECT_GE(got.dim(1), want.dim(1)) << what;
  const int64_t B = want.dim(0), Sw = want.dim(1), Sg = got.dim(1), inner = want.numel() / (B * Sw);
  const float* a = got.f32();
  const float* b = want.f32();
  double maxref = 0, maxdiff = 0;
  for (int64_t i = 0; i < want.numel(); ++i) maxref = std::max(maxref, std::fabs(static_cast<double>(b[i])));
  int64_t bad = 0;
  for (int64_t s = 0; s < B; ++s)
    for (int64_t r = 0; r < Sw; ++r)
      for (int64_t j = 0; j < inner; ++j) {
        const double x = a[(s * Sg + r) * inner + j], y = b[(s * Sw + r) * inner + j];
        const double d = std::fabs(x - y);
        maxdiff = std::max(maxdiff, d);
        if (!(d <= kRelTol * (std::fabs(y) + 0.05 * maxref))) ++bad;
      }
  const double rel = maxdiff / maxref;
  std::printf("  %-34s max rel err %.2e  (max|ref| %.3g)\n", what.c_str(), rel, maxref);
  EXPECT_GT(maxref, 0.0) << what;
  EXPECT_LE(rel, kRelTol) << what;
  EXPECT_EQ(bad, 0) << what << ": elements outside tolerance";
  return rel;
}

struct CaseMeta {
  std::string name, model;
  int64_t seq_len;
};
std::vector<CaseMeta> case_list() {
  const auto& md = fixture().cases.files()[0]->metadata();
  auto it = md.find("cases");
  EXPECT_NE(it, md.end());
  std::vector<CaseMeta> out;
  for (const auto& c : nlohmann::json::parse(it->second))
    out.push_back({c["name"].get<std::string>(), c["model"].get<std::string>(), c["seq_len"].get<int64_t>()});
  return out;
}

TEST(DiT, MatchesDiffusersOracle) {
  const Fixture& fx = fixture();
  EXPECT_EQ(fx.cfg.num_heads, 2);
  EXPECT_EQ(fx.cfg.head_dim(), 128);
  const auto cases = case_list();
  ASSERT_EQ(cases.size(), 5u);
  for (const CaseMeta& c : cases) {
    std::printf("case %s (%s)\n", c.name.c_str(), c.model.c_str());
    const bool i2v = c.model == "i2v";
    std::map<std::string, wan::Tensor> hooks;
    wan::Tensor out = wan::dit_forward(i2v ? fx.i2v_cfg : fx.cfg, i2v ? fx.i2v : fx.t2v, fx.input(c.name + ".x"),
                                       fx.input(c.name + ".t"), fx.input(c.name + ".context"), fx.lens(c.name),
                                       c.seq_len, [&](const std::string& n, const wan::Tensor& v) { hooks[n] = v; });
    compare(out, fx.input(c.name + ".out"), c.name + " velocity");
    int n_hooks = 0;
    const std::string prefix = c.name + ".hook.";
    for (const std::string& n : fx.cases.names()) {
      if (n.rfind(prefix, 0) != 0) continue;
      const std::string h = n.substr(prefix.size());
      ASSERT_TRUE(hooks.count(h)) << "engine emitted no hook '" << h << "'";
      compare(hooks[h], fx.input(n), c.name + " " + h);
      ++n_hooks;
    }
    if (c.name == "t2v_cfg") {
      EXPECT_EQ(n_hooks, 7);  // patch, time, proj, text, 2 blocks, head
    }
  }
}

// seq_len > f·h·w (sequence-parallel padding): padded tokens are computed but never attended to,
// so the real tokens' velocity is unchanged. Also for per-token timesteps (padded with the last t).
TEST(DiT, SequencePaddingDoesNotChangeOutput) {
  const Fixture& fx = fixture();
  for (const char* name : {"t2v_cfg", "ti2v_tokens"}) {
    const std::string c = name;
    wan::Tensor t = fx.input(c + ".t");
    wan::Tensor x = fx.input(c + ".x");
    const int64_t L = x.dim(2) * (x.dim(3) / 2) * (x.dim(4) / 2), S = L + 5;
    if (t.ndim() == 2) {
      wan::Tensor tp = wan::Tensor::empty(wan::DType::F32, {t.dim(0), S});
      for (int64_t b = 0; b < t.dim(0); ++b)
        for (int64_t i = 0; i < S; ++i) tp.f32()[b * S + i] = t.f32()[b * L + std::min(i, L - 1)];
      t = tp;
    }
    int blocks_seen = 0;
    wan::Tensor out = wan::dit_forward(fx.cfg, fx.t2v, x, t, fx.input(c + ".context"), fx.lens(c), S,
                                       [&](const std::string& n, const wan::Tensor& v) {
                                         if (n.rfind("block.", 0) == 0) {
                                           EXPECT_EQ(v.dim(1), S);
                                           ++blocks_seen;
                                         }
                                       });
    EXPECT_EQ(blocks_seen, fx.cfg.num_layers);
    compare(out, fx.input(c + ".out"), c + " velocity, seq_len = L + 5");
  }
}

// Each sample of a CFG batch is computed independently: bit-identical to running it alone.
TEST(DiT, BatchSamplesAreIndependent) {
  const Fixture& fx = fixture();
  wan::Tensor x = fx.input("t2v_cfg.x"), t = fx.input("t2v_cfg.t"), ctx = fx.input("t2v_cfg.context");
  const auto lens = fx.lens("t2v_cfg");
  wan::Tensor both = wan::dit_forward(fx.cfg, fx.t2v, x, t, ctx, lens);
  const int64_t per_x = x.numel() / 2, per_ctx = ctx.numel() / 2, per_out = both.numel() / 2;
  wan::Tensor x1 = wan::Tensor::empty(wan::DType::F32, {1, x.dim(1), x.dim(2), x.dim(3), x.dim(4)});
  wan::Tensor t1 = wan::Tensor::empty(wan::DType::F32, {1});
  wan::Tensor c1 = wan::Tensor::empty(wan::DType::F32, {1, ctx.dim(1), ctx.dim(2)});
  std::memcpy(x1.data(), x.f32() + per_x, per_x * 4);
  t1.f32()[0] = t.f32()[1];
  std::memcpy(c1.data(), ctx.f32() + per_ctx, per_ctx * 4);
  wan::Tensor one = wan::dit_forward(fx.cfg, fx.t2v, x1, t1, c1, {lens[1]});
  ASSERT_EQ(one.numel(), per_out);
  EXPECT_EQ(std::memcmp(one.data(), both.f32() + per_out, per_out * 4), 0);
  // and the two samples really differ (different latents, timesteps and prompts)
  EXPECT_NE(std::memcmp(both.data(), both.f32() + per_out, per_out * 4), 0);
}

TEST(DiT, ShapeErrorsAreReported) {
  const Fixture& fx = fixture();
  wan::Tensor x = fx.input("i2v.x");  // 36 channels into the 16-channel model
  try {
    wan::dit_forward(fx.cfg, fx.t2v, x, fx.input("i2v.t"), fx.input("i2v.context"), fx.lens("i2v"));
    FAIL() << "expected wan::Error";
  } catch (const wan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("in_dim 16"), std::string::npos) << e.what();
  }
  wan::Tensor x2 = fx.input("t2v_cfg.x");
  EXPECT_THROW(wan::dit_forward(fx.cfg, fx.t2v, x2, fx.input("t2v_cfg.t"), fx.input("t2v_cfg.context"), {7, 8}),
               wan::Error);  // length beyond the given context rows
  EXPECT_THROW(wan::dit_forward(fx.cfg, fx.t2v, x2, fx.input("t2v_cfg.t"), fx.input("t2v_cfg.context"), {7, 3}, 5),
               wan::Error);  // seq_len below the token count
  // a weight with the wrong shape names the tensor
  try {
    wan::load_dit_weights(fx.i2v_cfg, [&](const std::string& n) { return fx.get(n, false); });
    FAIL() << "expected wan::Error";
  } catch (const wan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("patch_embedding.weight"), std::string::npos) << e.what();
  }
}

// The script writes the fixture weights under official names (its own implementation of the spec
// §3.3 map); both layouts must load to bit-identical tensors through wan's layout code.
TEST(DiT, OfficialAndDiffusersLayoutsLoadIdentically) {
  const fs::path tmp = fs::temp_directory_path() / ("wan_test_dit_official_" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  const std::string cmd = std::string(WAN_PYTHON) + " " + WAN_SOURCE_DIR + "/tools/make_fixtures.py --official " +
                          tmp.string() + " --src " + kDir + " > " + tmp.string() + ".log 2>&1";
  const int rc = std::system(cmd.c_str());
  ASSERT_EQ(rc, 0) << cmd << "\n" << read_text(tmp.string() + ".log");

  wan::CheckpointInfo off = wan::detect_checkpoint(tmp.string());
  wan::CheckpointInfo dif = wan::detect_checkpoint(kDir + "/transformer");
  EXPECT_EQ(off.layout, wan::Layout::Official);
  EXPECT_EQ(dif.layout, wan::Layout::Diffusers);
  EXPECT_TRUE(off.dit == dif.dit) << "configs differ";
  ASSERT_FALSE(off.components.empty());
  ASSERT_FALSE(dif.components.empty());
  auto so = wan::open_weights(off, off.components[0].role);
  auto sd = wan::open_weights(dif, dif.components[0].role);
  EXPECT_TRUE(so->unexpected().empty());
  EXPECT_TRUE(sd->unexpected().empty());
  const auto names = so->names();
  EXPECT_EQ(names, sd->names());
  EXPECT_EQ(names.size(), wan::dit_expected_shapes(fixture().cfg).size());
  for (const std::string& n : names) {
    wan::Tensor a = so->get(n), b = sd->get(n);
    ASSERT_EQ(a.dtype(), wan::DType::BF16) << n;
    ASSERT_TRUE(a.shape() == b.shape()) << n;
    ASSERT_EQ(a.dtype(), b.dtype()) << n;
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << n;
  }
  // and the official copy drives the forward to the same velocity
  wan::DiTWeights w = wan::load_dit_weights(off.dit, [&](const std::string& n) { return so->get_f32(n); });
  const Fixture& fx = fixture();
  wan::Tensor out = wan::dit_forward(off.dit, w, fx.input("odd_grid.x"), fx.input("odd_grid.t"),
                                     fx.input("odd_grid.context"), fx.lens("odd_grid"));
  compare(out, fx.input("odd_grid.out"), "odd_grid via official layout");
  fs::remove_all(tmp);
  fs::remove(tmp.string() + ".log");
}

}  // namespace
