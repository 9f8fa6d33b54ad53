// Wan 2.1 / 2.2 VAE on the CPU against the diffusers oracle (tests/fixtures/vae, written by
// tools/make_vae_fixtures.py: AutoencoderKLWan at narrow widths, seeded random weights stored in
// the diffusers layout), plus the ops against direct loop definitions on fresh random inputs.
// Model-level criterion: max|ours - oracle| / max|oracle| <= 1e-4 for decode (clamped and not)
// and encode at 1, 5 and 9 pixel frames (1, 2, 3 latent frames).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "ckpt/names.h"
#include "models/config.h"
#include "core/error.h"
#include "formats/safetensors.h"
#include "models/vae/vae_cpu.h"
#include "ops/vae_ops.h"

namespace wan {
namespace {

const std::string kDir = std::string(WAN_FIXTURES) + "/vae/";

Tensor random_tensor(Shape s, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::f32(s);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = u(rng);
  return t;
}

// max|a - b| / max|b|
double rel_err(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape().str(), b.shape().str());
  if (!(a.shape() == b.shape())) return 1e30;
  Tensor fa = a.to_f32(), fb = b.to_f32();
  double diff = 0.0, ref = 0.0;
  for (int64_t i = 0; i < fa.numel(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(fa.f32()[i] - fb.f32()[i])));
    ref = std::max(ref, static_cast<double>(std::fabs(fb.f32()[i])));
  }
  EXPECT_GT(ref, 0.0);
  return diff / ref;
}

// Frames [0, t) of a [C, T, H, W] tensor.
Tensor first_frames(const Tensor& x, int64_t t) {
  Tensor f = x.to_f32();
  const int64_t C = f.dim(0), T = f.dim(1), hw = f.dim(2) * f.dim(3);
  Tensor out = Tensor::f32({C, t, f.dim(2), f.dim(3)});
  for (int64_t c = 0; c < C; ++c)
    std::copy(f.f32() + c * T * hw, f.f32() + (c * T + t) * hw, out.f32() + c * t * hw);
  return out;
}

// The fixture's diffusers config.json -> VaeConfig (checked against the released tables).
VaeConfig fixture_config(const std::string& name) {
  std::ifstream in(kDir + name + "/config.json");
  EXPECT_TRUE(in.good()) << "missing fixture " << kDir << name << "; run tools/make_vae_fixtures.py";
  const nlohmann::json j = nlohmann::json::parse(in);
  const bool v22 = j.value("is_residual", false);
  VaeConfig c = vae_preset(v22 ? "wan2.2" : "wan2.1");
  c.base_dim = j.at("base_dim").get<int>();
  c.dec_dim = j["decoder_base_dim"].is_null() ? c.base_dim : j["decoder_base_dim"].get<int>();
  c.z_dim = j.at("z_dim").get<int>();
  c.dim_mult = j.at("dim_mult").get<std::vector<int>>();
  c.num_res_blocks = j.at("num_res_blocks").get<int>();
  c.temporal_downsample = j.at("temperal_downsample").get<std::vector<bool>>();
  c.patch = j["patch_size"].is_null() ? 1 : j["patch_size"].get<int>();
  const auto mean = j.at("latents_mean").get<std::vector<float>>();
  const auto std = j.at("latents_std").get<std::vector<float>>();
  EXPECT_EQ(mean, c.latents_mean) << "fixture uses the released latent mean table";
  EXPECT_EQ(std, c.latents_std) << "fixture uses the released latent std table";
  return c;
}

struct Fixture {
  VaeConfig config;
  VaeWeights weights;
  Tensor video, latents, encoded, decoded;
};

Fixture load_fixture(const std::string& name) {
  Fixture f;
  f.config = fixture_config(name);
  const SafetensorsSet st = SafetensorsSet::open(kDir + name + "/diffusion_pytorch_model.safetensors");
  const int version = f.config.version;
  std::set<std::string> requested;
  f.weights = load_vae_weights(f.config, [&](const std::string& official) {
    const std::string d = vae_official_to_diffusers(official, version);
    requested.insert(official);
    WAN_CHECK(!d.empty(), "no diffusers name for ", official);
    return st.get(d);
  });
  // Every stored tensor is one the model uses (nothing silently ignored).
  for (const std::string& d : st.names()) {
    const std::string o = vae_diffusers_to_official(d, version);
    EXPECT_TRUE(requested.count(o)) << d << " (official '" << o << "') is not used by the model";
  }
  EXPECT_EQ(requested.size(), st.names().size());
  const SafetensorsSet cases = SafetensorsSet::open(kDir + name + "/cases.safetensors");
  f.video = cases.get("video");
  f.latents = cases.get("latents");
  f.encoded = cases.get("encoded");
  f.decoded = cases.get("decoded");
  return f;
}

void check_against_oracle(const std::string& name) {
  const Fixture f = load_fixture(name);
  ASSERT_TRUE(f.decoded.defined());
  const int64_t T = f.latents.dim(1);
  ASSERT_EQ(T, 3);
  for (int64_t tl = 1; tl <= T; ++tl) {
    const int64_t frames = 1 + 4 * (tl - 1);
    SCOPED_TRACE(name + ": " + std::to_string(tl) + " latent frames");
    const Tensor z = first_frames(f.latents, tl);
    const Tensor ref_raw = first_frames(f.decoded, frames);
    Tensor ref_clamped = ref_raw.clone();
    int64_t saturated = 0;
    for (int64_t i = 0; i < ref_clamped.numel(); ++i) {
      float& v = ref_clamped.f32()[i];
      saturated += std::fabs(v) > 1.0f;
      v = std::min(std::max(v, -1.0f), 1.0f);
    }
    EXPECT_GT(saturated, 0) << "the fixture should exercise the clamp";

    int chunks_seen = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const Tensor raw = vae_decode(f.config, f.weights, z, /*clamp=*/false, [&](int done, int total) {
      EXPECT_EQ(total, tl);
      chunks_seen = done;
    });
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(chunks_seen, tl);
    ASSERT_EQ(raw.shape().str(), ref_raw.shape().str());
    EXPECT_LE(rel_err(raw, ref_raw), 1e-4);
    std::printf("[ %s ] decode %lld latent frames -> %s: %.1f ms, rel err %.2e\n", name.c_str(),
                static_cast<long long>(tl), raw.shape().str().c_str(), ms, rel_err(raw, ref_raw));

    const Tensor clamped = vae_decode(f.config, f.weights, z);
    EXPECT_LE(rel_err(clamped, ref_clamped), 1e-4);
    for (int64_t i = 0; i < clamped.numel(); ++i) ASSERT_LE(std::fabs(clamped.f32()[i]), 1.0f);

    const Tensor enc = vae_encode(f.config, f.weights, first_frames(f.video, frames));
    const Tensor ref_enc = first_frames(f.encoded, tl);
    EXPECT_LE(rel_err(enc, ref_enc), 1e-4);
    std::printf("[ %s ] encode %lld frames -> %s: rel err %.2e\n", name.c_str(), static_cast<long long>(frames),
                enc.shape().str().c_str(), rel_err(enc, ref_enc));
  }
}

TEST(VaeOracle, Wan21) { check_against_oracle("wan21"); }
TEST(VaeOracle, Wan22) { check_against_oracle("wan22"); }

TEST(VaeWeights, SpecsMatchPresetsAndReleasedNames) {
  for (const char* preset : {"wan2.1", "wan2.2"}) {
    const VaeConfig c = vae_preset(preset);
    const auto specs = vae_tensor_specs(c);
    std::map<std::string, Shape> by_name(specs.begin(), specs.end());
    EXPECT_EQ(by_name.size(), specs.size()) << "duplicate names";
    for (const auto& [name, shape] : specs)
      EXPECT_FALSE(vae_official_to_diffusers(name, c.version).empty()) << preset << ": " << name;
    if (c.version == 21) {  // spot checks from spec §5.3
      EXPECT_EQ(by_name.at("encoder.downsamples.3.residual.2.weight").str(), Shape({192, 96, 3, 3, 3}).str());
      EXPECT_EQ(by_name.at("encoder.downsamples.3.shortcut.weight").str(), Shape({192, 96, 1, 1, 1}).str());
      EXPECT_EQ(by_name.at("encoder.downsamples.5.time_conv.weight").str(), Shape({192, 192, 3, 1, 1}).str());
      EXPECT_EQ(by_name.at("encoder.middle.1.to_qkv.weight").str(), Shape({1152, 384, 1, 1}).str());
      EXPECT_EQ(by_name.at("encoder.middle.1.norm.gamma").str(), Shape({384, 1, 1}).str());
      EXPECT_EQ(by_name.at("encoder.head.0.gamma").str(), Shape({384, 1, 1, 1}).str());
      EXPECT_EQ(by_name.at("decoder.upsamples.3.time_conv.weight").str(), Shape({768, 384, 3, 1, 1}).str());
      EXPECT_EQ(by_name.at("decoder.upsamples.3.resample.1.weight").str(), Shape({192, 384, 3, 3}).str());
      EXPECT_EQ(by_name.at("decoder.upsamples.4.shortcut.weight").str(), Shape({384, 192, 1, 1, 1}).str());
      EXPECT_EQ(by_name.at("decoder.upsamples.11.resample.1.weight").str(), Shape({96, 192, 3, 3}).str());
      EXPECT_EQ(by_name.at("decoder.head.2.weight").str(), Shape({3, 96, 3, 3, 3}).str());
      EXPECT_EQ(by_name.at("conv1.weight").str(), Shape({32, 32, 1, 1, 1}).str());
      EXPECT_EQ(by_name.at("conv2.weight").str(), Shape({16, 16, 1, 1, 1}).str());
      EXPECT_EQ(vae_spatial_factor(c), 8);
    } else {  // spec §6.2
      EXPECT_EQ(by_name.at("encoder.conv1.weight").str(), Shape({160, 12, 3, 3, 3}).str());
      EXPECT_EQ(by_name.at("encoder.downsamples.1.downsamples.0.shortcut.weight").str(),
                Shape({320, 160, 1, 1, 1}).str());
      EXPECT_EQ(by_name.at("encoder.downsamples.2.downsamples.2.time_conv.weight").str(),
                Shape({640, 640, 3, 1, 1}).str());
      EXPECT_EQ(by_name.count("encoder.downsamples.0.downsamples.2.time_conv.weight"), 0u);
      EXPECT_EQ(by_name.at("encoder.head.2.weight").str(), Shape({96, 640, 3, 3, 3}).str());
      EXPECT_EQ(by_name.at("decoder.conv1.weight").str(), Shape({1024, 48, 3, 3, 3}).str());
      EXPECT_EQ(by_name.at("decoder.upsamples.0.upsamples.3.time_conv.weight").str(),
                Shape({2048, 1024, 3, 1, 1}).str());
      EXPECT_EQ(by_name.at("decoder.upsamples.0.upsamples.3.resample.1.weight").str(),
                Shape({1024, 1024, 3, 3}).str());
      EXPECT_EQ(by_name.at("decoder.upsamples.2.upsamples.0.shortcut.weight").str(),
                Shape({512, 1024, 1, 1, 1}).str());
      EXPECT_EQ(by_name.count("decoder.upsamples.2.upsamples.3.time_conv.weight"), 0u);
      EXPECT_EQ(by_name.at("decoder.head.2.weight").str(), Shape({12, 256, 3, 3, 3}).str());
      EXPECT_EQ(by_name.at("conv1.weight").str(), Shape({96, 96, 1, 1, 1}).str());
      EXPECT_EQ(vae_spatial_factor(c), 16);
    }
    EXPECT_EQ(vae_temporal_factor(c), 4);
  }
}

TEST(VaeWeights, ErrorsNameTheTensor) {
  const VaeConfig c = vae_preset("tiny2.1");
  const auto specs = vae_tensor_specs(c);
  const std::string bad = "decoder.upsamples.3.time_conv.weight";
  auto source = [&](const std::string& name) {
    for (const auto& [n, s] : specs)
      if (n == name) {
        Shape shape = s;
        if (n == bad) shape[0] += 1;
        return Tensor(DType::F32, shape);
      }
    WAN_THROW("not found");
  };
  try {
    load_vae_weights(c, source);
    FAIL() << "a wrong shape must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
  try {
    load_vae_weights(c, [](const std::string&) -> Tensor { WAN_THROW("not in checkpoint"); });
    FAIL() << "a missing tensor must be reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("encoder.conv1.weight"), std::string::npos) << e.what();
  }
  VaeConfig broken = c;
  broken.latents_std.pop_back();
  EXPECT_THROW(vae_validate(broken), Error);
}

TEST(VaeApi, RejectsBadInputs) {
  const Fixture f = load_fixture("wan21");
  EXPECT_THROW(vae_encode(f.config, f.weights, Tensor::f32({3, 4, 40, 56})), Error);   // 4 frames
  EXPECT_THROW(vae_encode(f.config, f.weights, Tensor::f32({3, 1, 36, 56})), Error);   // 36 % 8
  EXPECT_THROW(vae_encode(f.config, f.weights, Tensor::f32({4, 1, 40, 56})), Error);   // channels
  EXPECT_THROW(vae_decode(f.config, f.weights, Tensor::f32({48, 1, 5, 7})), Error);    // z_dim
}

// ---- ops against direct definitions ----

// Direct conv over a frame list with explicit zero padding.
Tensor naive_conv(const std::vector<const float*>& fr, int64_t Cin, int64_t H, int64_t W, const Tensor& w,
                  const Tensor& b, const vae::ConvGeom& g) {
  const int64_t M = w.dim(0), kt = w.dim(2), kh = w.dim(3), kw = w.dim(4);
  const int64_t To = (static_cast<int64_t>(fr.size()) - kt) / g.st + 1;
  const int64_t Ho = (H + g.pad_top + g.pad_bottom - kh) / g.sh + 1, Wo = (W + g.pad_left + g.pad_right - kw) / g.sw + 1;
  Tensor out = Tensor::f32({To, M, Ho, Wo});
  for (int64_t t = 0; t < To; ++t)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t y = 0; y < Ho; ++y)
        for (int64_t x = 0; x < Wo; ++x) {
          double s = b.f32()[m];
          for (int64_t ci = 0; ci < Cin; ++ci)
            for (int64_t dt = 0; dt < kt; ++dt)
              for (int64_t dy = 0; dy < kh; ++dy)
                for (int64_t dx = 0; dx < kw; ++dx) {
                  const float* f = fr[t * g.st + dt];
                  const int64_t iy = y * g.sh + dy - g.pad_top, ix = x * g.sw + dx - g.pad_left;
                  if (!f || iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                  s += static_cast<double>(f[(ci * H + iy) * W + ix]) *
                       w.f32()[(((m * Cin + ci) * kt + dt) * kh + dy) * kw + dx];
                }
          out.f32()[((t * M + m) * Ho + y) * Wo + x] = static_cast<float>(s);
        }
  return out;
}

TEST(VaeOps, Conv3dMatchesDirectLoops) {
  // Cin * 27 > 256 (k blocking), 1000 positions > 256 (position tiles), Cout = 7 (row edge), a null
  // (zero) frame in front, and the stride-2 / asymmetric-padding down-sampling geometry.
  const int64_t Cin = 11, H = 20, W = 50;
  const Tensor x = random_tensor({4, Cin, H, W}, 1);
  const Tensor w = random_tensor({7, Cin, 3, 3, 3}, 2, -0.2f, 0.2f), b = random_tensor({7}, 3);
  std::vector<const float*> fr{nullptr};
  for (int64_t t = 0; t < 4; ++t) fr.push_back(vae::frame_ptr(x, t));
  for (const vae::ConvGeom& g : {vae::ConvGeom::same(1), vae::ConvGeom{2, 2, 2, 0, 1, 0, 1}}) {
    const Tensor ours = vae::conv3d(fr, Cin, H, W, w, b, g);
    EXPECT_LE(rel_err(ours, naive_conv(fr, Cin, H, W, w, b, g)), 1e-6);
  }
}

TEST(VaeOps, AttentionMatchesDirectLoops) {
  const int64_t T = 2, C = 12, H = 9, W = 11, N = H * W;  // 99 tokens: two query blocks
  const Tensor x = random_tensor({T, C, H, W}, 4);
  const Tensor gamma = random_tensor({C, 1, 1}, 5, 0.5f, 1.5f);
  const Tensor qw = random_tensor({3 * C, C, 1, 1}, 6, -0.5f, 0.5f), qb = random_tensor({3 * C}, 7);
  const Tensor pw = random_tensor({C, C, 1, 1}, 8, -0.5f, 0.5f), pb = random_tensor({C}, 9);
  const Tensor ours = vae::attention_block(x, gamma, qw, qb, pw, pb);
  Tensor ref = Tensor::f32(x.shape());
  for (int64_t t = 0; t < T; ++t) {
    const float* xf = vae::frame_ptr(x, t);
    std::vector<double> n(C * N), qkv(3 * C * N), o(C * N);
    for (int64_t p = 0; p < N; ++p) {
      double ss = 0;
      for (int64_t c = 0; c < C; ++c) ss += double(xf[c * N + p]) * xf[c * N + p];
      for (int64_t c = 0; c < C; ++c) n[c * N + p] = xf[c * N + p] / std::sqrt(ss) * std::sqrt(double(C)) * gamma.f32()[c];
    }
    for (int64_t r = 0; r < 3 * C; ++r)
      for (int64_t p = 0; p < N; ++p) {
        double s = qb.f32()[r];
        for (int64_t c = 0; c < C; ++c) s += qw.f32()[r * C + c] * n[c * N + p];
        qkv[r * N + p] = s;
      }
    for (int64_t i = 0; i < N; ++i) {
      std::vector<double> s(N);
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < N; ++j) {
        double d = 0;
        for (int64_t c = 0; c < C; ++c) d += qkv[c * N + i] * qkv[(C + c) * N + j];
        s[j] = d / std::sqrt(double(C));
        mx = std::max(mx, s[j]);
      }
      for (int64_t j = 0; j < N; ++j) sum += (s[j] = std::exp(s[j] - mx));
      for (int64_t c = 0; c < C; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < N; ++j) acc += s[j] / sum * qkv[(2 * C + c) * N + j];
        o[c * N + i] = acc;
      }
    }
    for (int64_t r = 0; r < C; ++r)
      for (int64_t p = 0; p < N; ++p) {
        double s = pb.f32()[r];
        for (int64_t c = 0; c < C; ++c) s += pw.f32()[r * C + c] * o[c * N + p];
        ref.f32()[(t * C + r) * N + p] = static_cast<float>(s + xf[r * N + p]);
      }
  }
  EXPECT_LE(rel_err(ours, ref), 1e-5);
}

TEST(VaeOps, RmsNormEpsIsOnTheNorm) {
  Tensor x = random_tensor({1, 4, 2, 3}, 10);
  for (int64_t c = 0; c < 4; ++c) x.f32()[c * 6] = 0.0f;  // one all-zero position: 0 / max(0, eps) = 0
  const Tensor g = random_tensor({4}, 11, 0.5f, 1.5f);
  const Tensor y = vae::rms_norm(x, g, false);
  for (int64_t p = 0; p < 6; ++p) {
    double ss = 0;
    for (int64_t c = 0; c < 4; ++c) ss += double(x.f32()[c * 6 + p]) * x.f32()[c * 6 + p];
    for (int64_t c = 0; c < 4; ++c) {
      const double ref = ss == 0 ? 0.0 : x.f32()[c * 6 + p] / std::sqrt(ss) * 2.0 * g.f32()[c];
      EXPECT_NEAR(y.f32()[c * 6 + p], ref, 1e-6);
    }
  }
}

TEST(VaeOps, PatchifyLayoutAndInverse) {
  const Tensor x = random_tensor({2, 3, 4, 6}, 12);
  const Tensor p = vae::patchify(x, 2);
  ASSERT_EQ(p.shape().str(), Shape({2, 12, 2, 3}).str());
  // channel c*4 + r*2 + q holds pixel (row 2y + q, column 2x + r)
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t r = 0; r < 2; ++r)
        for (int64_t q = 0; q < 2; ++q)
          for (int64_t y = 0; y < 2; ++y)
            for (int64_t xx = 0; xx < 3; ++xx)
              ASSERT_EQ(p.f32()[((t * 12 + c * 4 + r * 2 + q) * 2 + y) * 3 + xx],
                        x.f32()[((t * 3 + c) * 4 + 2 * y + q) * 6 + 2 * xx + r]);
  EXPECT_EQ(rel_err(vae::unpatchify(p, 2), x), 0.0);
}

TEST(VaeOps, AvgDownDupUpDefinitions) {
  // AvgDown3D(4 -> 8, ft 2, fs 2) on 3 frames: one zero frame in front, groups of g = 2.
  const Tensor x = random_tensor({3, 4, 4, 6}, 13);
  const Tensor a = vae::avg_down3d(x, 8, 2, 2);
  ASSERT_EQ(a.shape().str(), Shape({2, 8, 2, 3}).str());
  for (int64_t to = 0; to < 2; ++to)
    for (int64_t o = 0; o < 8; ++o)
      for (int64_t y = 0; y < 2; ++y)
        for (int64_t xx = 0; xx < 3; ++xx) {
          double s = 0;
          for (int64_t j = o * 4; j < o * 4 + 4; ++j) {  // Cin*8/Cout = 4 channels of (c, dt, dh, dw)
            const int64_t c = j / 8, dt = (j / 4) % 2, dh = (j / 2) % 2, dw = j % 2, tt = to * 2 + dt - 1;
            if (tt >= 0) s += x.f32()[((tt * 4 + c) * 4 + 2 * y + dh) * 6 + 2 * xx + dw];
          }
          EXPECT_NEAR(a.f32()[((to * 8 + o) * 2 + y) * 3 + xx], s / 4, 1e-6);
        }
  // DupUp3D(8 -> 4, ft 2, fs 2): every output value is the input channel (c*8 + dt*4 + dh*2 + dw) / 4.
  const Tensor u = vae::dup_up3d(a, 4, 2, 2, /*first_chunk=*/false);
  const Tensor u1 = vae::dup_up3d(a, 4, 2, 2, /*first_chunk=*/true);
  ASSERT_EQ(u.shape().str(), Shape({4, 4, 4, 6}).str());
  ASSERT_EQ(u1.shape().str(), Shape({3, 4, 4, 6}).str());
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t c = 0; c < 4; ++c)
      for (int64_t y = 0; y < 4; ++y)
        for (int64_t xx = 0; xx < 6; ++xx) {
          const int64_t j = ((c * 2 + t % 2) * 2 + y % 2) * 2 + xx % 2;
          const float want = a.f32()[((t / 2 * 8 + j / 4) * 2 + y / 2) * 3 + xx / 2];
          ASSERT_EQ(u.f32()[((t * 4 + c) * 4 + y) * 6 + xx], want);
          if (t >= 1) {
            ASSERT_EQ(u1.f32()[(((t - 1) * 4 + c) * 4 + y) * 6 + xx], want);
          }
        }
}

}  // namespace
}  // namespace wan
