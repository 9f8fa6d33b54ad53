// The T2V pipeline library (src/pipeline) against diffusers' WanPipeline on the tiny two-expert
// checkpoint of tests/fixtures/pipeline (tools/make_pipeline_fixtures.py): final latents within
// 1e-4 max relative error, decoded frames within 1e-4, from given embeddings and from prompt text;
// plus planning (defaults, validation), seeded noise, determinism, cancellation and the pipeline's
// files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "ckpt/layout.h"
#include "core/philox.h"
#include "pipeline/files.h"
#include "pipeline/models.h"
#include "pipeline/pipeline.h"
#include "formats/safetensors.h"
#include "test_util.h"
#include "tensor_compare.h"

namespace fs = std::filesystem;
using namespace wan;

namespace {

using wan::test::max_rel;
using wan::test::max_abs;

const std::string kFix = std::string(WAN_FIXTURES) + "/pipeline";
const std::string kModel = kFix + "/model";
constexpr double kTol = 1e-4;

using wan::test::TempDir;

Tensor expected(const std::string& name) {
  auto f = SafetensorsFile::open(kFix + "/expected.safetensors");
  return f->get(name).to_f32().clone();
}

nlohmann::json expected_settings() {
  auto f = SafetensorsFile::open(kFix + "/expected.safetensors");
  return nlohmann::json::parse(f->metadata().at("settings"));
}

// The fixture's run: 4 UniPC steps on the diffusers grid (flow_shift from the scheduler config),
// guidance 3 (low-noise) / 4 (high-noise), the fixture's initial latents.
GenerateOptions golden_options(bool from_text) {
  GenerateOptions o;
  o.model = kModel;
  if (from_text) {
    o.prompt = expected_settings().at("prompt").get<std::string>();
  } else {
    o.prompt_embeds_file = kFix + "/prompt_embeds.safetensors";
    o.negative_embeds_file = kFix + "/negative_prompt_embeds.safetensors";
  }
  o.init_latents_file = kFix + "/init_latents.safetensors";
  o.steps = 4;
  o.schedule = ScheduleKind::Diffusers;
  o.guide_low = 3.0f;
  o.guide_high = 4.0f;
  return o;
}

struct Recorded {
  std::vector<std::string> stages;  // "<kind> <stage>" for Begin and End
  std::vector<std::string> steps;   // details of the denoise steps
};
RunHooks recorder(Recorded* r, const std::atomic<bool>* cancel = nullptr) {
  RunHooks h;
  h.cancel = cancel;
  h.progress = [r](const ProgressEvent& e) {
    if (e.kind == ProgressEvent::Advance) {
      if (e.stage == Stage::Denoise) r->steps.push_back(e.detail);
      return;
    }
    r->stages.push_back(cat(e.kind == ProgressEvent::Begin ? "begin " : "end ", stage_name(e.stage)));
  };
  return h;
}

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

// Expects fn to throw a BadInput wan::Error whose message contains `part`.
void expect_bad_input(const std::function<void()>& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing '" << part << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "message: " << e.what() << "\nwanted: " << part;
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
  }
}

}  // namespace

TEST(Pipeline, GoldenFromEmbeddingsMatchesDiffusers) {
  const GeneratePlan plan = plan_generate(golden_options(false));
  EXPECT_FALSE(plan.needs_text_encoder);
  EXPECT_EQ(plan.sampler.shift, 3.0);  // scheduler_config.json flow_shift
  EXPECT_EQ(plan.boundary, 0.875);     // model_index.json boundary_ratio
  const auto settings = expected_settings();
  EXPECT_EQ(plan.schedule.timesteps, settings.at("timesteps").get<std::vector<int64_t>>());
  EXPECT_EQ(plan.width, 64);  // from the initial latents' shape
  EXPECT_EQ(plan.height, 48);
  EXPECT_EQ(plan.frames, 9);

  Recorded rec;
  const GenerateResult r = run_generate(plan, recorder(&rec));
  // Both experts, two steps each, switch at t >= 875 (timesteps 999 900 | 750 500).
  std::vector<std::string> want_steps;
  for (int64_t t : plan.schedule.timesteps) want_steps.push_back(cat("t=", t, t >= 875 ? " high" : " low"));
  EXPECT_EQ(rec.steps, want_steps);
  // No text encoder is loaded when both embeddings are given; the DiT is released before the VAE.
  const std::vector<std::string> want_stages = {"begin load DiT", "end load DiT", "begin denoise", "end denoise",
                                                "begin load VAE", "end load VAE", "begin VAE decode", "end VAE decode"};
  EXPECT_EQ(rec.stages, want_stages);
  ASSERT_EQ(r.timings.step_seconds.size(), 4u);

  const double rel = max_rel(r.latents, expected("latents"));
  const double vid = max_abs(r.video, expected("video"));
  printf("  final latents max rel err %.2e, video max abs err %.2e\n", rel, vid);
  EXPECT_LE(rel, kTol);
  EXPECT_LE(vid, kTol);
}

TEST(Pipeline, GoldenFromPromptTextMatchesDiffusers) {
  // The full text path: official cleaning, tokenizer, UMT5, default negative prompt (the fixture's
  // diffusers run got the official default negative prompt as its text).
  const GeneratePlan plan = plan_generate(golden_options(true));
  EXPECT_TRUE(plan.needs_text_encoder);
  EXPECT_EQ(plan.negative_prompt, kDefaultNegativePrompt);
  Recorded rec;
  const GenerateResult r = run_generate(plan, recorder(&rec), /*decode=*/false);
  ASSERT_GE(rec.stages.size(), 4u);
  EXPECT_EQ(rec.stages[0], "begin load text encoder");
  EXPECT_EQ(rec.stages[2], "begin encode text");
  EXPECT_FALSE(r.video.defined());
  const double rel = max_rel(r.latents, expected("latents"));
  printf("  final latents from prompt text: max rel err %.2e\n", rel);
  EXPECT_LE(rel, kTol);
}

TEST(Pipeline, EncodePromptMatchesDiffusersEncoding) {
  const CheckpointInfo info = detect_checkpoint(kModel);
  const T5Config cfg = t5_config_for(info);
  EXPECT_EQ(cfg.dim, 24);
  EXPECT_EQ(cfg.num_heads, 3);
  EXPECT_EQ(cfg.num_layers, 2);
  const TextEncoder te = load_text_encoder(info);
  const Tensor cond = encode_prompt(te, expected_settings().at("prompt").get<std::string>());
  const Tensor uncond = encode_prompt(te, kDefaultNegativePrompt);
  const double a = max_rel(cond, read_prompt_embeds(kFix + "/prompt_embeds.safetensors"));
  const double b = max_rel(uncond, read_prompt_embeds(kFix + "/negative_prompt_embeds.safetensors"));
  printf("  prompt embeddings max rel err %.2e, negative %.2e\n", a, b);
  EXPECT_LE(a, kTol);
  EXPECT_LE(b, kTol);
}

TEST(Pipeline, PlanDefaultsFollowTheTaskAndCheckpoint) {
  GenerateOptions o;
  o.model = kModel;
  o.prompt = "a cat";
  o.seed = 7;
  GeneratePlan p = plan_generate(o);
  EXPECT_EQ(p.task, Task::T2V_A14B);
  EXPECT_EQ(p.width, 1280);
  EXPECT_EQ(p.height, 720);
  EXPECT_EQ(p.frames, 81);
  EXPECT_EQ(p.latent_shape, (Shape{16, 21, 90, 160}));
  EXPECT_EQ(p.seq_len, 21 * 45 * 80);
  EXPECT_EQ(p.sampler.steps, 40);
  EXPECT_EQ(p.sampler.shift, 12.0);  // official sample_shift with the official schedule
  EXPECT_EQ(p.guide_low, 3.0f);
  EXPECT_EQ(p.guide_high, 4.0f);
  EXPECT_EQ(p.experts.num_high(), 26);  // spec §7.2: 26 high-noise steps, 14 low-noise
  EXPECT_EQ(p.fps, 16);
  EXPECT_EQ(p.seed, 7u);
  EXPECT_FALSE(p.seed_random);
  EXPECT_EQ(p.negative_prompt, kDefaultNegativePrompt);  // empty negative -> official default
  o.negative_prompt = "";
  EXPECT_EQ(plan_generate(o).negative_prompt, kDefaultNegativePrompt);
  o.negative_prompt = "blurry";
  EXPECT_EQ(plan_generate(o).negative_prompt, "blurry");
  o.schedule = ScheduleKind::Diffusers;  // shift from scheduler_config.json unless given
  EXPECT_EQ(plan_generate(o).sampler.shift, 3.0);
  o.shift = 5.0;
  EXPECT_EQ(plan_generate(o).sampler.shift, 5.0);
  o.seed.reset();
  EXPECT_TRUE(plan_generate(o).seed_random);
  EXPECT_NE(p.describe().find("26 steps"), std::string::npos) << p.describe();
}

TEST(Pipeline, PlanRejectsBadInputBeforeHeavyWork) {
  TempDir tmp;
  write_raw(tmp / "empty.safetensors", "");
  write_latents(tmp / "lat_bad.safetensors", Tensor::f32(Shape{16, 2, 6, 8}));
  write_prompt_embeds(tmp / "wide.safetensors", Tensor::f32(Shape{3, 32}));
  using Mut = std::function<void(GenerateOptions&)>;
  const std::vector<std::pair<Mut, std::string>> cases = {
      {[](GenerateOptions& o) { o.model = "/nonexistent/model"; }, "no such file or folder"},
      {[](GenerateOptions& o) { o.model = ""; }, "missing --model"},
      {[](GenerateOptions& o) { o.task = Task::I2V_A14B; }, "holds a t2v-A14B model"},
      {[](GenerateOptions& o) { o.width = 72; }, "multiples of 16"},
      {[](GenerateOptions& o) { o.height = 40; }, "multiples of 16"},
      {[](GenerateOptions& o) { o.frames = 8; }, "4n+1"},
      {[](GenerateOptions& o) { o.steps = 0; }, "--steps"},
      {[](GenerateOptions& o) { o.shift = -1.0; }, "--shift"},
      // No such device: refused whether the build has CUDA (no device / too few) or not (no support).
      {[](GenerateOptions& o) { o.device = "cuda:99"; }, "CUDA"},
      {[](GenerateOptions& o) { o.device = "cuda:x"; }, "is not cpu, cuda"},
      {[](GenerateOptions& o) { o.device = "tpu"; }, "is not cpu, cuda"},
      {[](GenerateOptions& o) { o.attention = "flash"; }, "--attention: expected auto, own, cudnn or own-fp8"},
      {[](GenerateOptions& o) { o.attention = "own"; }, "applies to --device cuda only"},
      // FP8 GEMMs (--gemm fp8): the GPU DiT only, refused before anything loads.
      {[](GenerateOptions& o) { o.gemm = "fp16"; }, "--gemm: expected bf16 or fp8"},
      {[](GenerateOptions& o) { o.gemm = "fp8"; }, "--gemm fp8: FP8 GEMMs run in the GPU DiT only"},
      {[](GenerateOptions& o) { o.prompt_embeds_file.clear(); }, "missing --prompt"},
      {[](GenerateOptions& o) { o.prompt = "x"; }, "not both"},
      {[](GenerateOptions& o) { o.negative_prompt = "x"; }, "not both"},
      {[&](GenerateOptions& o) { o.prompt_embeds_file = tmp / "empty.safetensors"; }, "empty.safetensors"},
      {[&](GenerateOptions& o) { o.prompt_embeds_file = tmp / "missing.safetensors"; }, "no such file"},
      {[&](GenerateOptions& o) { o.prompt_embeds_file = tmp / "wide.safetensors"; }, "text_dim is 24"},
      {[&](GenerateOptions& o) { o.negative_embeds_file = tmp / "lat_bad.safetensors"; }, "no tensor \"prompt_embeds\""},
      {[&](GenerateOptions& o) {
         o.init_latents_file = tmp / "lat_bad.safetensors";
         o.frames = 9;  // without it the geometry would follow the latents
       },
       "does not match [16, 3, 6, 8]"},
  };
  for (const auto& [mut, part] : cases) {
    GenerateOptions o = golden_options(false);
    mut(o);
    SCOPED_TRACE(part);
    expect_bad_input([&] { plan_generate(o); }, part);
  }
}

TEST(Pipeline, MissingTextEncoderIsReportedWhenTextMustBeEncoded) {
  // A copy of the checkpoint without text_encoder/ and tokenizer/ (symlinked components).
  TempDir tmp;
  const fs::path ck = tmp.p / "ckpt";
  fs::create_directories(ck);
  for (const char* c : {"model_index.json", "transformer", "transformer_2", "vae", "scheduler"})
    fs::create_symlink(fs::absolute(fs::path(kModel) / c), ck / c);
  GenerateOptions o = golden_options(false);
  o.model = ck.string();
  EXPECT_NO_THROW(plan_generate(o));  // embeddings given: no text encoder needed
  o.negative_embeds_file.clear();
  expect_bad_input([&] { plan_generate(o); }, "has no text encoder (needed for the negative prompt");
  o = golden_options(true);
  o.model = ck.string();
  expect_bad_input([&] { plan_generate(o); }, "has no text encoder (needed for the prompt");
}

TEST(Pipeline, SeededNoiseIsPhiloxAndRunsAreDeterministic) {
  const Shape s{16, 2, 4, 6};
  const Tensor x = seeded_latents(s, 1234);
  for (int64_t i = 0; i < x.numel(); i += 37) ASSERT_EQ(x.f32()[i], philox_normal(1234, static_cast<uint64_t>(i)));
  GenerateOptions o = golden_options(false);
  o.init_latents_file.clear();
  o.width = 48;
  o.height = 32;
  o.frames = 5;
  o.steps = 3;
  o.seed = 99;
  const GeneratePlan p = plan_generate(o);
  const GenerateResult a = run_generate(p, {}, false), b = run_generate(p, {}, false);
  ASSERT_EQ(a.latents.shape(), (Shape{16, 2, 4, 6}));
  EXPECT_EQ(std::memcmp(a.latents.data(), b.latents.data(), a.latents.nbytes()), 0);
  o.seed = 100;
  const GenerateResult c = run_generate(plan_generate(o), {}, false);
  EXPECT_GT(max_rel(c.latents, a.latents), 1e-2);  // another seed, another sample
}

TEST(Pipeline, GuideScaleOneIsTheConditionalVelocity) {
  // With guide 1 the pipeline runs the conditional half alone; with any guide and identical
  // prompts CFG must give the same velocity (v_u + g (v_c - v_u) = v_c exactly when v_c == v_u).
  GenerateOptions o = golden_options(false);
  o.guide_low = o.guide_high = 1.0f;
  const GenerateResult a = run_generate(plan_generate(o), {}, false);
  o.guide_low = o.guide_high = 5.0f;
  o.negative_embeds_file = o.prompt_embeds_file;
  const GenerateResult b = run_generate(plan_generate(o), {}, false);
  EXPECT_EQ(max_rel(a.latents, b.latents), 0.0);
  const GenerateResult g = run_generate(plan_generate(golden_options(false)), {}, false);
  EXPECT_GT(max_rel(a.latents, g.latents), 1e-3);  // guidance does change the result
}

TEST(Pipeline, CancelStopsBetweenSteps) {
  std::atomic<bool> cancel{false};
  Recorded rec;
  RunHooks h = recorder(&rec, &cancel);
  auto inner = h.progress;
  h.progress = [&](const ProgressEvent& e) {
    inner(e);
    if (e.stage == Stage::Denoise && e.kind == ProgressEvent::Advance && e.done == 2) cancel = true;
  };
  const GeneratePlan p = plan_generate(golden_options(false));
  EXPECT_THROW(run_generate(p, h), Cancelled);
  EXPECT_EQ(rec.steps.size(), 2u);  // stopped before the third step
  for (const std::string& s : rec.stages) EXPECT_EQ(s.find("VAE"), std::string::npos) << s;
}

TEST(Pipeline, FinalLatentsReachTheFrontEndBeforeTheDecode) {
  // latents_done runs once, with the final latents, before the VAE loads; a cancel from there stops
  // the decode, and the front end has the latents anyway.
  std::atomic<bool> cancel{false};
  Recorded rec;
  RunHooks h = recorder(&rec, &cancel);
  Tensor got;
  size_t stages_before = 0;
  h.latents_done = [&](const Tensor& l) {
    EXPECT_FALSE(got.defined()) << "called twice";
    got = l.clone();
    stages_before = rec.stages.size();
    cancel = true;  // Ctrl-C as the decode begins
  };
  const GeneratePlan p = plan_generate(golden_options(false));
  EXPECT_THROW(run_generate(p, h), Cancelled);
  ASSERT_TRUE(got.defined());
  EXPECT_LE(max_rel(got, expected("latents")), kTol);
  for (size_t i = 0; i < stages_before; ++i) EXPECT_EQ(rec.stages[i].find("VAE"), std::string::npos) << rec.stages[i];
  // A paused run has no final latents: not called.
  GenerateOptions o = golden_options(false);
  o.stop_after_steps = 2;
  RunHooks h2;
  h2.latents_done = [&](const Tensor&) { ADD_FAILURE() << "called for a paused run"; };
  EXPECT_TRUE(run_generate(plan_generate(o), h2).state.has_value());
}

TEST(Pipeline, PlanRefusesAnOutputThatIsAnInput) {
  GenerateOptions o = golden_options(false);
  o.outputs = {{"--save-latents", o.init_latents_file}};
  expect_bad_input([&] { plan_generate(o); }, "--init-latents");
  o.outputs = {{"--json", kModel + "/transformer/../transformer_2/config.json"}};
  expect_bad_input([&] { plan_generate(o); }, "checkpoint's dit_low_noise");
  o.outputs = {{"--output", o.prompt_embeds_file}};
  expect_bad_input([&] { plan_generate(o); }, "--prompt-embeds");
  o.outputs = {{"--output", "fine.y4m"}, {"--save-latents", "fine.safetensors"}};
  EXPECT_NO_THROW(plan_generate(o));
}

TEST(Pipeline, DecodeLatentsMatchesTheFixtureVideo) {
  const CheckpointInfo info = detect_checkpoint(kModel);
  const VaeConfig vae = vae_config_for(info);
  EXPECT_EQ(vae.base_dim, 4);
  EXPECT_EQ(vae.z_dim, 16);
  EXPECT_FLOAT_EQ(vae.latents_std[0], 2.8184f);
  Timings t;
  const Tensor v = decode_latents(info, vae, expected("latents"), {}, &t);
  EXPECT_LE(max_abs(v, expected("video")), kTol);
  EXPECT_GT(t.vae_decode, 0.0);
  expect_bad_input([&] { decode_latents(info, vae, Tensor::f32(Shape{48, 1, 2, 2}), {}); }, "16 channels");
}

TEST(PipelineFiles, EmbeddingsAndLatentsRoundTripAndValidation) {
  TempDir tmp;
  Tensor e = Tensor::f32(Shape{5, 24});
  philox_normal_fill(3, 0, e.f32(), static_cast<size_t>(e.numel()));
  write_prompt_embeds(tmp / "e.safetensors", e, {{"prompt", "x"}});
  Tensor back = read_prompt_embeds(tmp / "e.safetensors");
  ASSERT_EQ(back.shape(), e.shape());
  EXPECT_EQ(std::memcmp(back.data(), e.data(), e.nbytes()), 0);
  EXPECT_FALSE(fs::exists(tmp / "e.safetensors.tmp"));

  // [1, L, D] and bf16 are accepted (converted to [L, D] f32).
  write_safetensors(tmp / "b.safetensors", {{"prompt_embeds", e.reshape(Shape{1, 5, 24}).to(DType::BF16)}});
  back = read_prompt_embeds(tmp / "b.safetensors");
  ASSERT_EQ(back.shape(), (Shape{5, 24}));
  EXPECT_EQ(back.dtype(), DType::F32);
  EXPECT_LE(max_rel(back, e), 1e-2);

  Tensor l = Tensor::f32(Shape{16, 2, 3, 4});
  philox_normal_fill(4, 0, l.f32(), static_cast<size_t>(l.numel()));
  write_latents(tmp / "l.safetensors", l);
  EXPECT_EQ(std::memcmp(read_latents(tmp / "l.safetensors").data(), l.data(), l.nbytes()), 0);

  write_raw(tmp / "empty.safetensors", "");
  write_raw(tmp / "junk.safetensors", "not a safetensors file at all");
  write_safetensors(tmp / "zero_len.safetensors", {{"prompt_embeds", Tensor::f32(Shape{0, 24})}});
  write_safetensors(tmp / "rank.safetensors", {{"prompt_embeds", Tensor::f32(Shape{24})}});
  Tensor nan = e.clone();
  nan.f32()[7] = NAN;
  write_safetensors(tmp / "nan.safetensors", {{"prompt_embeds", nan}});
  write_safetensors(tmp / "ints.safetensors", {{"prompt_embeds", Tensor(DType::I32, Shape{2, 2})}});
  write_safetensors(tmp / "long.safetensors", {{"prompt_embeds", Tensor::f32(Shape{513, 4})}});
  expect_bad_input([&] { read_prompt_embeds(tmp / "empty.safetensors"); }, "empty.safetensors");
  expect_bad_input([&] { read_prompt_embeds(tmp / "junk.safetensors"); }, "junk.safetensors");
  expect_bad_input([&] { read_prompt_embeds(tmp / "zero_len.safetensors"); }, "is empty");
  expect_bad_input([&] { read_prompt_embeds(tmp / "rank.safetensors"); }, "expected [L, text_dim]");
  expect_bad_input([&] { read_prompt_embeds(tmp / "nan.safetensors"); }, "non-finite value at element 7");
  expect_bad_input([&] { read_prompt_embeds(tmp / "ints.safetensors"); }, "expected a float type");
  expect_bad_input([&] { read_prompt_embeds(tmp / "long.safetensors"); }, "more than the text length 512");
  expect_bad_input([&] { read_prompt_embeds(tmp.p.string()); }, "not a file");
  expect_bad_input([&] { read_latents(tmp / "e.safetensors"); }, "no tensor \"latents\" (has: prompt_embeds)");
}

TEST(PipelineFiles, OutputPathsAreCheckedAndNeverAnInput) {
  TempDir tmp;
  EXPECT_NO_THROW(check_output_path(tmp / "x.mp4", "--output"));
  EXPECT_TRUE(fs::is_empty(tmp.p)) << "the probe's temporary file stayed";
  expect_bad_input([&] { check_output_path(tmp / "nodir/x.mp4", "--output"); }, "does not exist");
  expect_bad_input([&] { check_output_path(tmp.p.string(), "--output"); }, "is a folder");
  expect_bad_input([&] { check_output_path("", "--output"); }, "empty file name");
  // The kernel refuses new files in /proc even for root: an unwritable folder, found now.
  expect_bad_input([&] { check_output_path("/proc/wan_out.mp4", "--output"); }, "cannot create");

  write_text_file(tmp / "a.txt", "hello");
  std::ifstream f(tmp / "a.txt");
  std::string s;
  f >> s;
  EXPECT_EQ(s, "hello");

  // Every file the checkpoint is read from, and any path that leads to one (symlink, hard link, "..").
  const CheckpointInfo info = detect_checkpoint(kModel);
  const std::vector<NamedFile> ins = checkpoint_input_files(info);
  auto has = [&](const std::string& rel) {
    for (const NamedFile& n : ins)
      if (fs::equivalent(n.path, kModel + "/" + rel)) return true;
    return false;
  };
  for (const char* rel : {"transformer/diffusion_pytorch_model.safetensors", "transformer_2/config.json",
                          "vae/diffusion_pytorch_model.safetensors", "text_encoder/model.safetensors",
                          "tokenizer/spiece.model", "tokenizer/tokenizer.json"})
    EXPECT_TRUE(has(rel)) << rel;
  const std::string vae = kModel + "/vae/diffusion_pytorch_model.safetensors";
  fs::create_symlink(vae, tmp / "link.safetensors");
  fs::create_hard_link(tmp / "a.txt", tmp / "hard.txt");
  const std::vector<NamedFile> more = {{"--latents", tmp / "a.txt"}};
  expect_bad_input([&] { check_outputs_distinct({{"--save-latents", vae}}, ins); }, "is an input of this run");
  expect_bad_input([&] { check_outputs_distinct({{"--json", tmp / "link.safetensors"}}, ins); }, "checkpoint's vae");
  expect_bad_input([&] { check_outputs_distinct({{"--output", tmp / "hard.txt"}}, more); }, "--latents");
  expect_bad_input([&] { check_outputs_distinct({{"--output", tmp / "sub/../a.txt"}}, more); }, "--latents");
  expect_bad_input([&] { check_outputs_distinct({{"--output", tmp / "o.y4m"}, {"--json", tmp / "./o.y4m"}}, {}); },
                   "the same file as --output");
  EXPECT_NO_THROW(check_outputs_distinct({{"--output", tmp / "o.y4m"}, {"--json", ""}}, ins));
  // A PNG sequence is checked frame by frame.
  EXPECT_EQ(video_output_files({"--output", tmp / "f.png"}, 3).size(), 3u);
  EXPECT_EQ(video_output_files({"--output", tmp / "f.y4m"}, 3).size(), 1u);
  expect_bad_input([&] { check_outputs_distinct(video_output_files({"--output", tmp / "a.png"}, 3),
                                                {{"--latents", tmp / "a_00002.png"}}); },
                   "a_00002.png");
}
