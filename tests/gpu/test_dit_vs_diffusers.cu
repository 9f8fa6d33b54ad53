// The GPU DiT (src/models/dit/dit_gpu.h, bf16) against diffusers' WanTransformer3DModel on the GPU in bf16 at
// full width for each task (issue 4 item 12, issue 23), 2 blocks of random weights written by `wan
// make-checkpoint --config C --layout diffusers --layers 2 --dtype bf16 --dit-only` (transformer/; the
// engine's name mapping and diffusers' strict loading read the same files): T2V-A14B and I2V-A14B (dim 5120,
// ffn 13824; I2V: 36 input channels, the 20 condition channels random too) on latent 2 x 30 x 52, and
// TI2V-5B (dim 3072, ffn 14336, 48 channels) on 2 x 22 x 40 with per-token timesteps (frame 0 at 0 and 35;
// diffusers' [B, seq_len] timestep, the engine's DiTShape::first_frame_t). tools/dit_vs_diffusers.py draws
// fixed inputs (batch 2: timesteps 937 and 413, a full 512-row prompt and a 37-row one zero-padded to 512)
// and runs diffusers in bf16 and fp32; the engine runs DiTGpu (eager, then a graph replay: bit for bit).
// Precision rule: engine vs diffusers bf16 within 2e-2 relative L2, overall and per sample (rel L2 and
// max abs printed); engine vs diffusers fp32 within 2e-2 too. The two samples must differ (so a swapped
// or shared timestep/context could not pass).
// Skips (GTEST_SKIP) without a CUDA device, or when WAN_PYTHON cannot import torch + diffusers +
// safetensors or sees no GPU (on the lent device: PYTHONPATH=/tmp/site, the carried diffusers wheel).
// Needs the `wan` binary of the same build (WAN_BINARY; tests/CMakeLists.txt adds the dependency).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/names.h"
#include "models/config.h"
#include "models/dit/dit_gpu.h"
#include "gpu_test_util.h"
#include "formats/safetensors.h"

using namespace wan;
using namespace wan::gpu_test;
namespace fs = std::filesystem;

namespace {

constexpr double kRelL2Bound = 2e-2;

int run(const std::string& cmd) {
  std::printf("$ %s\n", cmd.c_str());
  std::fflush(stdout);
  const int s = std::system(cmd.c_str());
  return s == -1 ? -1 : (WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s));
}
std::string q(const std::string& s) { return "'" + s + "'"; }
using gpu_test::slurp;
double secs(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
std::vector<float> floats(const Tensor& t) {
  const Tensor f = t.to_f32();
  return std::vector<float>(f.f32(), f.f32() + f.numel());
}
std::vector<float> slice(const std::vector<float>& v, size_t b, size_t per) {
  return std::vector<float>(v.begin() + b * per, v.begin() + (b + 1) * per);
}
void report(const char* what, const Err& e, const std::vector<float>& ref) {
  std::printf("  %-44s rel L2 %.3e  max abs %.3e  (max|ref| %.3g)\n", what, e.rel_l2, e.max_abs, max_abs_of(ref));
}

// A fresh folder under $TMPDIR (or /tmp), removed when the test ends.
struct TempDir {
  fs::path path;
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") + "/wan-dit-vs-diffusers-XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) != nullptr) path = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};


// One task's check: the make-checkpoint config, the latent size, and for TI2V's per-token timesteps the
// timestep of latent frame 0 per sample (the others at the script's 937 and 413).
struct Case {
  const char* config;
  int64_t frames, height, width;
  bool per_token = false;
  float t_first[2] = {0, 0};
};

// The engine on the files in `tdir` and the inputs in `cases`: eager into `out`, then a graph replay
// that must agree bit for bit.
void engine_forward(const DiTConfig& cfg, const std::string& tdir, const SafetensorsSet& cases, bool per_token,
                    std::vector<float>& out) {
  const Tensor x = cases.get("x").to_f32(), t = cases.get("t").to_f32(), ctx = cases.get("context");
  const Tensor lens_t = cases.get("context_lens");
  ASSERT_EQ(ctx.dtype(), DType::BF16);
  ASSERT_EQ(lens_t.dtype(), DType::I64);
  ASSERT_EQ(x.dim(0), 2);
  ASSERT_EQ(x.dim(1), cfg.in_dim);
  const std::vector<int64_t> lens(static_cast<const int64_t*>(lens_t.data()),
                                  static_cast<const int64_t*>(lens_t.data()) + lens_t.numel());
  const Tensor t_first = per_token ? cases.get("t_first").to_f32() : t;
  std::printf("x [2, %lld, %lld, %lld, %lld], t {%.0f, %.0f}", (long long)x.dim(1), (long long)x.dim(2),
              (long long)x.dim(3), (long long)x.dim(4), t.f32()[0], t.f32()[1]);
  if (per_token) std::printf(" (latent frame 0 at {%.0f, %.0f})", t_first.f32()[0], t_first.f32()[1]);
  std::printf(", context rows {%lld, %lld} of %lld\n", (long long)lens[0], (long long)lens[1],
              (long long)ctx.dim(1));

  // Official name -> diffusers name -> tensor (bf16 as stored).
  const SafetensorsSet weights = SafetensorsSet::open(tdir);
  auto getter = [&weights](const std::string& official) {
    const std::string d = dit_official_to_diffusers(official);
    WAN_CHECK(!d.empty(), "no diffusers name for ", official);
    return weights.get(d);
  };
  cuda::DiTShape shape{x.dim(0), x.dim(2), x.dim(3), x.dim(4)};
  shape.first_frame_t = per_token;
  const auto t0 = std::chrono::steady_clock::now();
  cuda::DiTGpu gpu = cuda::DiTGpu::create(cfg, {cuda::DiTWeightSource::from(getter)}, shape);
  std::printf("engine create (upload %.2f GiB of weights): %.1f s\n", gpu.memory_plan().weight_bytes / 1073741824.0,
              secs(t0));
  cuda::DiTInputs in;
  in.x = x.f32();
  in.t = t.f32();
  in.t_first = per_token ? t_first.f32() : nullptr;
  in.context = ctx.data();
  in.context_dtype = DType::BF16;
  in.ctx_rows = ctx.dim(1);
  in.ctx_lens = lens.data();
  std::vector<float> again(out.size());
  std::memset(out.data(), 0xFF, out.size() * sizeof(float));  // NaN: every element must be written
  std::memset(again.data(), 0xFF, again.size() * sizeof(float));
  gpu.forward(0, shape, in, out.data(), nullptr);    // eager
  gpu.forward(0, shape, in, again.data(), nullptr);  // captured and replayed
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(std::memcmp(out.data(), again.data(), out.size() * sizeof(float)), 0) << "graph replay != eager";
}

// The precision rule: overall and per sample vs diffusers bf16, overall vs fp32; the samples differ.
void expect_close(const std::vector<float>& out, const std::vector<float>& ref, const std::vector<float>& ref32) {
  const Err e = error_vs(out, ref), e32 = error_vs(out, ref32), d32 = error_vs(ref, ref32);
  report("engine bf16 vs diffusers bf16", e, ref);
  report("engine bf16 vs diffusers fp32", e32, ref32);
  report("diffusers bf16 vs diffusers fp32 (for scale)", d32, ref32);
  EXPECT_EQ(e.nonfinite, 0u) << "unwritten or non-finite engine outputs";
  EXPECT_GT(max_abs_of(ref), 0.0);
  EXPECT_LE(e.rel_l2, kRelL2Bound) << "engine vs diffusers bf16";
  EXPECT_LE(e32.rel_l2, kRelL2Bound) << "engine vs diffusers fp32";
  const size_t per = ref.size() / 2;
  for (size_t b = 0; b < 2; ++b) {
    const std::vector<float> o = slice(out, b, per), r = slice(ref, b, per);
    const Err eb = error_vs(o, r);
    const std::string what = "sample " + std::to_string(b) + " vs diffusers bf16";
    report(what.c_str(), eb, r);
    EXPECT_LE(eb.rel_l2, kRelL2Bound) << what;
  }
  // The samples differ far beyond the bound: a swapped or shared timestep/context would fail above.
  const Err between = error_vs(slice(ref, 0, per), slice(ref, 1, per));
  std::printf("  diffusers sample 0 vs sample 1: rel L2 %.3f\n", between.rel_l2);
  EXPECT_GT(between.rel_l2, 10 * kRelL2Bound);
}

// make-checkpoint (2 blocks) -> diffusers -> engine -> compare, everything in a temporary folder.
void check_vs_diffusers(const Case& c) {
  REQUIRE_GPU();
  const std::string py = std::string(q(WAN_PYTHON)) + " " + q(std::string(WAN_SOURCE_DIR) + "/tools/dit_vs_diffusers.py");
  const int probe = run(py + " --check-only");
  if (probe != 0) GTEST_SKIP() << WAN_PYTHON << " cannot run diffusers on the GPU here (exit " << probe << ")";
  ASSERT_TRUE(fs::exists(WAN_BINARY)) << "the wan binary was not built: " << WAN_BINARY;
  TempDir tmp;
  ASSERT_FALSE(tmp.path.empty()) << "cannot create a temporary folder";
  const std::string ckpt = (tmp.path / "ckpt").string(), io = (tmp.path / "io.safetensors").string();

  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(run(q(WAN_BINARY) + " make-checkpoint --config " + c.config + " --layout diffusers --layers 2 " +
                "--dtype bf16 --dit-only --seed 12 --output " + q(ckpt)),
            0);
  std::printf("make-checkpoint: %.1f s\n", secs(t0));
  const std::string tdir = ckpt + "/transformer";
  std::string args = " --frames " + std::to_string(c.frames) + " --height " + std::to_string(c.height) +
                     " --width " + std::to_string(c.width);
  if (c.per_token)
    args += " --t-first0 " + std::to_string(c.t_first[0]) + " --t-first1 " + std::to_string(c.t_first[1]);
  t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(run(py + " --model " + q(tdir) + " --out " + q(io) + args + " --fp32-reference"), 0);
  std::printf("diffusers: %.1f s\n", secs(t0));

  // The file's config is the task's preset at 2 blocks (full width, the task's channel counts).
  const DiTConfig cfg = dit_config_from_json(slurp(tdir + "/config.json")), want = dit_preset(c.config);
  ASSERT_EQ(cfg.dim, want.dim);
  ASSERT_EQ(cfg.num_heads, want.num_heads);
  ASSERT_EQ(cfg.ffn_dim, want.ffn_dim);
  ASSERT_EQ(cfg.text_dim, want.text_dim);
  ASSERT_EQ(cfg.in_dim, want.in_dim);
  ASSERT_EQ(cfg.out_dim, want.out_dim);
  ASSERT_EQ(cfg.num_layers, 2);
  const SafetensorsSet cases = SafetensorsSet::open(io);
  const std::vector<float> ref = floats(cases.get("out_bf16")), ref32 = floats(cases.get("out_fp32"));
  std::vector<float> out(ref.size());
  engine_forward(cfg, tdir, cases, c.per_token, out);
  if (::testing::Test::HasFatalFailure()) return;
  expect_close(out, ref, ref32);
}

}  // namespace

TEST(GpuDitVsDiffusers, FullWidth14BTwoBlocksBf16) { check_vs_diffusers({"t2v-A14B", 2, 30, 52}); }

TEST(GpuDitVsDiffusers, FullWidthI2vTwoBlocksBf16) { check_vs_diffusers({"i2v-A14B", 2, 30, 52}); }

TEST(GpuDitVsDiffusers, FullWidthTi2v5BTwoBlocksPerTokenBf16) {
  check_vs_diffusers({"ti2v-5B", 2, 22, 40, true, {0, 35}});
}
