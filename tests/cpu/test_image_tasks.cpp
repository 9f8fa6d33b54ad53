// The image-to-video tasks through the pipeline library on the CPU (float32 reference) against their
// oracles: I2V-A14B against diffusers' WanImageToVideoPipeline (tests/fixtures/i2v,
// tools/make_i2v_fixtures.py), first frame only and first + last frame; TI2V-5B against a loop written
// from the official WanTI2V code around diffusers' models (tests/fixtures/ti2v), text-only and image
// mode. Final latents, decoded frames and the condition (I2V's y) within 1e-4 max relative error; plus
// the sizing rules of each task (official formulas) and the condition's mask.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "formats/image.h"
#include "formats/safetensors.h"
#include "pipeline/conditioning.h"
#include "pipeline/models.h"
#include "pipeline/pipeline.h"
#include "tensor_compare.h"
#include "models/vae/vae_cpu.h"

using namespace wan;

namespace {

using wan::test::load_tensor;
using wan::test::max_rel;

constexpr double kTol = 1e-4;
const std::string kI2v = std::string(WAN_FIXTURES) + "/i2v";
const std::string kTi2v = std::string(WAN_FIXTURES) + "/ti2v";

GenerateOptions common(const std::string& fix) {
  GenerateOptions o;
  o.model = fix + "/model";
  o.prompt_embeds_file = fix + "/prompt_embeds.safetensors";
  o.negative_embeds_file = fix + "/negative_prompt_embeds.safetensors";
  o.init_latents_file = fix + "/init_latents.safetensors";
  return o;
}

// tests/fixtures/i2v/README.md: 64x48, 9 frames, 4 UniPC steps on diffusers' grid (flow_shift 5),
// guidance 4 (high-noise expert, t >= 900) and 3 (low).
GenerateOptions i2v_options(bool last) {
  GenerateOptions o = common(kI2v);
  o.image_file = kI2v + "/image.png";
  if (last) o.last_image_file = kI2v + "/last_image.png";
  o.steps = 4;
  o.schedule = ScheduleKind::Diffusers;
  o.guide_low = 3.0f;
  o.guide_high = 4.0f;
  o.width = 64;
  o.height = 48;
  o.frames = 9;
  return o;
}

// tests/fixtures/ti2v/README.md: 96x64, 9 frames, 5 UniPC steps on the official grid, shift 5, guide 5.
GenerateOptions ti2v_options(bool image) {
  GenerateOptions o = common(kTi2v);
  if (image) o.image_file = kTi2v + "/image.png";
  o.steps = 5;
  o.schedule = ScheduleKind::Official;
  o.shift = 5.0;
  o.guide_low = o.guide_high = 5.0f;
  o.width = 96;
  o.height = 64;
  o.frames = 9;
  return o;
}

void check_run(const GenerateOptions& o, const std::string& expected_file, const char* what) {
  const GeneratePlan plan = plan_generate(o);
  const GenerateResult r = run_generate(plan, RunHooks{});
  const double lat = max_rel(r.latents, load_tensor(expected_file, "latents"));
  const double vid = max_rel(r.video, load_tensor(expected_file, "video"));
  printf("  %s: final latents max rel err %.2e, video %.2e\n", what, lat, vid);
  EXPECT_LE(lat, kTol) << what;
  EXPECT_LE(vid, kTol) << what;
}

}  // namespace

TEST(ImageTasks, I2vSizeFollowsTheOfficialFormula) {
  // image2video.py: lat_h = floor(floor(sqrt(area * h / w) / 8) / 2) * 2, lat_w likewise; pixels 8 lat.
  EXPECT_EQ(i2v_video_size(1280, 720, 1280 * 720), (std::pair<int, int>{1280, 720}));
  EXPECT_EQ(i2v_video_size(720, 1280, 1280 * 720), (std::pair<int, int>{720, 1280}));
  EXPECT_EQ(i2v_video_size(1000, 1000, 1280 * 720), (std::pair<int, int>{960, 960}));
  EXPECT_EQ(i2v_video_size(64, 48, 64 * 48), (std::pair<int, int>{64, 48}));
  EXPECT_EQ(i2v_video_size(1920, 1080, 832 * 480), (std::pair<int, int>{832, 464}));
  EXPECT_THROW(i2v_video_size(100000, 1, 1280 * 720), Error);  // no latent rows
}

TEST(ImageTasks, Ti2vSizeIsTheOfficialBestOutputSize) {
  // textimage2video.py best_output_size(w, h, 32, 32, area).
  EXPECT_EQ(ti2v_video_size(1280, 704, 1280 * 704), (std::pair<int, int>{1280, 704}));
  EXPECT_EQ(ti2v_video_size(704, 1280, 1280 * 704), (std::pair<int, int>{704, 1280}));
  EXPECT_EQ(ti2v_video_size(96, 64, 96 * 64), (std::pair<int, int>{96, 64}));
  EXPECT_EQ(ti2v_video_size(1920, 1080, 1280 * 704), (std::pair<int, int>{1248, 704}));
  EXPECT_EQ(ti2v_video_size(1000, 1000, 1280 * 704), (std::pair<int, int>{960, 928}));  // a tie: the second
  EXPECT_THROW(ti2v_video_size(100000, 1, 1280 * 704), Error);
}

TEST(ImageTasks, I2vMaskMarksTheImageFrames) {
  const Tensor m = i2v_mask(9, 2, 3, false);  // [4, 3, 2, 3]
  ASSERT_EQ(m.shape(), (Shape{4, 3, 2, 3}));
  auto at = [&](const Tensor& t, int c, int f) { return t.f32()[(c * 3 + f) * 6]; };
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(at(m, c, 0), 1.0f);
    EXPECT_EQ(at(m, c, 1), 0.0f);
    EXPECT_EQ(at(m, c, 2), 0.0f);
  }
  // With a last frame, only pixel frame F - 1 is marked: channel 3 of the last latent frame.
  const Tensor l = i2v_mask(9, 2, 3, true);
  for (int c = 0; c < 4; ++c) EXPECT_EQ(at(l, c, 2), c == 3 ? 1.0f : 0.0f);
}

TEST(ImageTasks, I2vConditionMatchesDiffusers) {
  for (bool last : {false, true}) {
    const GeneratePlan p = plan_generate(i2v_options(last));
    ASSERT_TRUE(p.image.defined());
    const VaeWeights w = load_vae(p.ckpt, p.vae);
    const LatentCondition c = build_condition(p.task, p.image, p.last_image, p.frames,
                                              [&](const Tensor& v) { return vae_encode(p.vae, w, v); });
    const double rel = max_rel(c.y, load_tensor(kI2v + (last ? "/expected_last.safetensors" : "/expected.safetensors"), "y"));
    printf("  y%s max rel err %.2e\n", last ? " (with the last image)" : "", rel);
    EXPECT_LE(rel, kTol);
  }
}

TEST(ImageTasks, I2vPipelineMatchesDiffusers) {
  const GeneratePlan plan = plan_generate(i2v_options(false));
  EXPECT_EQ(plan.task, Task::I2V_A14B);
  EXPECT_EQ(plan.boundary, 0.9);       // model_index.json boundary_ratio
  EXPECT_EQ(plan.sampler.shift, 5.0);  // scheduler_config.json flow_shift
  check_run(i2v_options(false), kI2v + "/expected.safetensors", "i2v");
}

TEST(ImageTasks, I2vWithLastImageMatchesDiffusers) {
  check_run(i2v_options(true), kI2v + "/expected_last.safetensors", "i2v first + last");
}

TEST(ImageTasks, Ti2vTextOnlyMatchesTheOfficialLoop) {
  const GeneratePlan plan = plan_generate(ti2v_options(false));
  EXPECT_EQ(plan.task, Task::TI2V_5B);
  EXPECT_EQ(plan.fps, 24);
  EXPECT_FALSE(plan.image.defined());
  check_run(ti2v_options(false), kTi2v + "/expected_t2v.safetensors", "ti2v text");
}

TEST(ImageTasks, Ti2vImageModeMatchesTheOfficialLoop) {
  const GeneratePlan plan = plan_generate(ti2v_options(true));
  const GenerateResult r = run_generate(plan, RunHooks{}, /*decode=*/false);
  // Frame 0 ends as the image's latent exactly (the official loop resets it after every step).
  const VaeWeights w = load_vae(plan.ckpt, plan.vae);
  const Tensor z = build_condition(plan.task, plan.image, Tensor(), plan.frames, [&](const Tensor& v) {
                     return vae_encode(plan.vae, w, v);
                   }).first_frame;
  const int64_t hw = z.dim(2) * z.dim(3), T = r.latents.dim(1);
  int64_t differ = 0;
  for (int64_t c = 0; c < z.dim(0); ++c)
    for (int64_t i = 0; i < hw; ++i) differ += r.latents.f32()[c * T * hw + i] != z.f32()[c * hw + i] ? 1 : 0;
  EXPECT_EQ(differ, 0);
  check_run(ti2v_options(true), kTi2v + "/expected_i2v.safetensors", "ti2v image");
}

TEST(ImageTasks, Ti2vImageLatentMatchesTheOracle) {
  const GeneratePlan p = plan_generate(ti2v_options(true));
  const VaeWeights w = load_vae(p.ckpt, p.vae);
  const LatentCondition c = build_condition(p.task, p.image, Tensor(), p.frames,
                                            [&](const Tensor& v) { return vae_encode(p.vae, w, v); });
  const double rel = max_rel(c.first_frame, load_tensor(kTi2v + "/expected_i2v.safetensors", "z"));
  printf("  z max rel err %.2e\n", rel);
  EXPECT_LE(rel, kTol);
}
