// `wan generate --weights random` and paused / resumed runs on the CPU (issue 4 items 7 and 9): tiny
// random-weight runs need no files and are deterministic; the host draw of the DiT follows the GPU's
// rule element by element; the stand-in tokenization; every bad input (bad --task / --config, sizes
// too big for host memory, resume files that are missing, broken or from another run) is refused by
// the plan with one clear message (exit 2 through the CLI); a run paused after step k and resumed
// gives byte-identical latents to the uninterrupted run, for every solver and through the CLI.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/philox.h"
#include "core/hash.h"
#include "models/weight_spec.h"
#include "pipeline/files.h"
#include "pipeline/host_memory.h"
#include "pipeline/model_cache.h"
#include "pipeline/models.h"
#include "pipeline/pipeline.h"
#include "pipeline/startup.h"
#include "formats/safetensors.h"
#include "formats/video.h"
#include "run_util.h"
#include "testing/make_lora.h"

namespace fs = std::filesystem;
using namespace wan;

namespace {

using wan::test::TempDir;

GenerateOptions tiny(uint64_t seed = 3) {
  GenerateOptions o;
  o.random_weights = true;
  o.weights_seed = 11;
  o.config = "tiny";
  o.prompt = "a red fox runs through the snow";
  o.width = 64;
  o.height = 48;
  o.frames = 9;
  o.steps = 5;
  o.seed = seed;
  return o;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

void expect_finite_nonzero(const Tensor& t) {
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(t.f32()[i])) << i;
    s += std::fabs(t.f32()[i]);
  }
  EXPECT_GT(s, 0.0);
}

void expect_bad_input(const std::function<void()>& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing '" << part << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "message: " << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
  }
}

// Plan + run, pausing after `stop` steps (0: to the end); returns the result.
GenerateResult run(const GenerateOptions& o, bool decode = false) { return run_generate(plan_generate(o), {}, decode); }

using Result = wan::test::RunResult;
using wan::test::slurp;

Result run_wan(const std::vector<std::string>& args) { return wan::test::run_captured(WAN_BINARY, args); }

}  // namespace

TEST(GenerateRandom, TinyRunNeedsNoFilesAndIsDeterministic) {
  const GeneratePlan plan = plan_generate(tiny());
  EXPECT_TRUE(plan.random_weights);
  EXPECT_TRUE(plan.stand_in_tokens);
  EXPECT_TRUE(plan.ckpt.components.empty());
  EXPECT_EQ(plan.ckpt.dit.dim, 256);
  const std::string d = plan.describe();
  EXPECT_NE(d.find("RANDOM"), std::string::npos) << d;
  EXPECT_NE(d.find("the video is noise"), std::string::npos) << d;
  EXPECT_NE(d.find("stand-in tokens"), std::string::npos) << d;

  const GenerateResult a = run_generate(plan, {}, /*decode=*/true);
  const GenerateResult b = run(tiny(), /*decode=*/true);
  expect_finite_nonzero(a.latents);
  EXPECT_TRUE(same_bytes(a.latents, b.latents));
  EXPECT_TRUE(same_bytes(a.video, b.video));
  ASSERT_EQ(a.video.shape(), (Shape{3, 9, 48, 64}));
  for (int64_t i = 0; i < a.video.numel(); ++i) ASSERT_LE(std::fabs(a.video.f32()[i]), 1.0f);
  // The sampled latents moved away from the seeded noise; another weights seed gives another run.
  EXPECT_FALSE(same_bytes(a.latents, seeded_latents(plan.latent_shape, 3)));
  GenerateOptions o = tiny();
  o.weights_seed = 12;
  EXPECT_FALSE(same_bytes(run(o).latents, a.latents));
  EXPECT_EQ(a.timings.step_seconds.size(), 5u);
  EXPECT_GT(a.timings.load_text_encoder + a.timings.load_dit, 0.0);
}

TEST(GenerateRandom, StreamedFramesAreTheQuantisedVideo) {
  const GeneratePlan plan = plan_generate(tiny());
  const GenerateResult whole = run_generate(plan, {}, /*decode=*/true);
  std::vector<uint8_t> buf;
  std::vector<int> readies;
  RunHooks hooks;
  hooks.video_begin = [&](int F, int H, int W) {
    EXPECT_TRUE(readies.empty());
    buf.assign(size_t(F) * H * W * 3, 0xAB);
    return buf.data();
  };
  hooks.video_ready = [&](int n) { readies.push_back(n); };
  const GenerateResult streamed = run_generate(plan, hooks, /*decode=*/true);
  EXPECT_FALSE(streamed.video.defined());  // the frames went to the sink only
  EXPECT_TRUE(same_bytes(whole.latents, streamed.latents));
  ASSERT_EQ(readies, std::vector<int>{9});  // a CPU decode hands the frames over at its end
  EXPECT_EQ(buf, video_to_rgb8(whole.video.f32(), 9, 48, 64));
  // A sink that throws ends the run with its error.
  readies.clear();
  hooks.video_ready = [](int) { WAN_THROW("the sink is full"); };
  EXPECT_THROW(run_generate(plan, hooks, /*decode=*/true), Error);
}

TEST(GenerateRandom, HostDitDrawFollowsTheGpuRule) {
  const DiTConfig c = dit_preset("tiny");
  const uint64_t seed = random_expert_seed(5, Task::T2V_A14B, true);
  EXPECT_NE(seed, random_expert_seed(5, Task::T2V_A14B, false));
  // The engine's key: splitmix(splitmix(seed) ^ h) with h the FNV-1a 64 hash of the name.
  const std::string q = "blocks.1.self_attn.q.weight";
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char ch : q) h = (h ^ ch) * 0x100000001B3ull;
  const uint64_t key = random_weight_key(seed, q);
  EXPECT_EQ(key, splitmix64(splitmix64(seed) ^ h));
  EXPECT_NE(random_weight_key(seed, q), random_weight_key(seed, "blocks.0.self_attn.q.weight"));
  // bf16 GEMM weight: bf16(normal * 1/sqrt(3 fan_in)).
  const Tensor w = random_dit_tensor(c, seed, q);
  ASSERT_EQ(w.shape(), (Shape{256, 256}));
  const float scale = static_cast<float>(1.0 / std::sqrt(3.0 * 256));
  for (int64_t i : {0L, 1L, 777L, 65535L})
    EXPECT_EQ(w.f32()[i], bf16_to_f32(f32_to_bf16(philox_normal(key, static_cast<uint64_t>(i)) * scale))) << i;
  // fp32 modulation table: normal / sqrt(dim), not rounded to bf16.
  const Tensor m = random_dit_tensor(c, seed, "blocks.0.modulation");
  const uint64_t mkey = random_weight_key(seed, "blocks.0.modulation");
  int not_bf16 = 0;
  for (int64_t i = 0; i < m.numel(); ++i) {
    ASSERT_EQ(m.f32()[i], philox_normal(mkey, static_cast<uint64_t>(i)) * static_cast<float>(1.0 / 16.0) + 0.0f);
    not_bf16 += bf16_to_f32(f32_to_bf16(m.f32()[i])) != m.f32()[i];
  }
  EXPECT_GT(not_bf16, m.numel() / 2);
  // Norm weights around 1.
  const Tensor n = random_dit_tensor(c, seed, "blocks.0.cross_attn.norm_k.weight");
  double mean = 0;
  for (int64_t i = 0; i < n.numel(); ++i) mean += n.f32()[i] / static_cast<double>(n.numel());
  EXPECT_NEAR(mean, 1.0, 0.02);
  EXPECT_THROW(random_dit_tensor(c, seed, "blocks.9.ffn.0.weight"), Error);
  // The text encoder's host draw is the GPU encoder's rule too (fp32 norms around 1, bf16 GEMM weights).
  const T5Config t5 = t5_preset("tiny");
  const T5Weights tw = random_t5_weights(t5, random_t5_seed(5));
  const uint64_t ekey = random_weight_key(random_t5_seed(5), "token_embedding.weight");
  EXPECT_EQ(tw.token_embedding.f32()[12345], bf16_to_f32(f32_to_bf16(philox_normal(ekey, 12345) * 1.0f)));
  const uint64_t nkey = random_weight_key(random_t5_seed(5), "blocks.1.norm2.weight");
  EXPECT_EQ(tw.blocks[1].norm2.f32()[7], philox_normal(nkey, 7) * 0.05f + 1.0f);
}

TEST(GenerateRandom, StandInTokensAreTheCleanedPromptsBytes) {
  EXPECT_EQ(stand_in_token_ids("  ab  c ", 256384), (std::vector<int32_t>{3 + 'a', 3 + 'b', 3 + ' ', 3 + 'c', 1}));
  EXPECT_EQ(stand_in_token_ids("", 256384), (std::vector<int32_t>{1}));
  const std::vector<int32_t> longer = stand_in_token_ids(std::string(2000, 'x'), 256384);
  ASSERT_EQ(longer.size(), 512u);
  EXPECT_EQ(longer.back(), 1);
  const std::vector<int32_t> small = stand_in_token_ids("\xc3\xa9", 100);  // é: 0xC3 0xA9
  EXPECT_EQ(small, (std::vector<int32_t>{3 + 0xC3 % 97, 3 + 0xA9 % 97, 1}));
  expect_bad_input([] { stand_in_token_ids("a", 3); }, "vocabulary");
}

TEST(GenerateRandom, PlanRefusesBadInputBeforeHeavyWork) {
  using Edit = std::function<void(GenerateOptions&)>;
  const std::vector<std::pair<Edit, std::string>> cases = {
      {[](GenerateOptions& o) { o.config = "huge"; }, "unknown --config 'huge'"},
      {[](GenerateOptions& o) { o.task = Task::I2V_A14B; }, "is a t2v-A14B configuration"},
      {[](GenerateOptions& o) {
         o.config = "";
         o.task = Task::I2V_A14B;
       },
       "missing --image FILE: i2v-A14B animates an image"},
      // Real-size experts with 1000 blocks: 2 x 1.4 TB of f32 weights.
      {[](GenerateOptions& o) {
         o.config = "t2v-A14B";
         o.layers = 1000;
       },
       "of host memory (weights "},
      // Activations and video planned too: 16000x16000 needs terabytes; 100001 frames exceed the RoPE.
      {[](GenerateOptions& o) {
         o.width = 16000;
         o.height = 16000;
         o.frames = 1;
       },
       "; not even 1 frame fits at this size"},
      {[](GenerateOptions& o) { o.frames = 100001; },
       "--frames 100001: 25001 latent frames exceed the DiT's RoPE, which covers 1024 positions per axis (at most "
       "4093 frames)"},
      {[](GenerateOptions& o) { o.layers = 5000; }, "--layers 5000"},
      {[](GenerateOptions& o) { o.random_weights = false; }, "--config NAME needs --weights random"},
      {[](GenerateOptions& o) {
         o.random_weights = false;
         o.config = "";
       },
       "missing --model"},
      {[](GenerateOptions& o) { o.keep_text_encoder = true; }, "--keep-text-encoder: only with --device cuda"},
      {[](GenerateOptions& o) { o.stop_after_steps = 6; }, "--stop-after-steps 6: must be in 1..5"},
      {[](GenerateOptions& o) { o.resume_file = "/nonexistent/state.safetensors"; }, "no such file"},
      {[](GenerateOptions& o) { o.device = "cuda:x"; }, "--device 'cuda:x'"},
  };
  for (const auto& [edit, part] : cases) {
    GenerateOptions o = tiny();
    edit(o);
    SCOPED_TRACE(part);
    expect_bad_input([&] { plan_generate(o); }, part);
  }
}

TEST(GenerateRandom, ResumedRunsEqualUninterruptedOnesForEverySolver) {
  TempDir t;
  // The text once (drawing the tiny encoder's 16M-row embedding dominates a tiny run), then embeddings.
  GenerateOptions first = tiny();
  first.stop_after_steps = 1;
  const RunState text = *run(first).state;
  write_prompt_embeds(t / "prompt.safetensors", text.prompt_embeds);
  write_prompt_embeds(t / "negative.safetensors", text.negative_embeds);
  for (SolverKind solver : {SolverKind::UniPC, SolverKind::DpmPP, SolverKind::Euler}) {
    SCOPED_TRACE(solver_name(solver));
    GenerateOptions o = tiny();
    o.prompt.reset();
    o.prompt_embeds_file = t / "prompt.safetensors";
    o.negative_embeds_file = t / "negative.safetensors";
    o.solver = solver;
    const GenerateResult full = run(o);
    for (int stop : {1, 3, 5}) {
      SCOPED_TRACE(cat("stop after ", stop));
      GenerateOptions a = o;
      a.stop_after_steps = stop;
      const GenerateResult paused = run(a);
      ASSERT_TRUE(paused.state.has_value());
      EXPECT_EQ(paused.state->step, stop);
      EXPECT_EQ(paused.timings.step_seconds.size(), static_cast<size_t>(stop));
      EXPECT_FALSE(paused.video.defined());
      const std::string file = t / cat("state_", solver_name(solver), stop, ".safetensors");
      write_run_state(file, *paused.state);
      GenerateOptions b = o;
      b.resume_file = file;
      b.seed.reset();  // taken from the state
      const GeneratePlan plan = plan_generate(b);
      EXPECT_TRUE(plan.seed_from_state);
      EXPECT_FALSE(plan.needs_text_encoder);  // the text comes from the state
      const GenerateResult resumed = run_generate(plan, {}, false);
      EXPECT_EQ(resumed.first_step, stop);
      EXPECT_EQ(resumed.timings.step_seconds.size(), static_cast<size_t>(5 - stop));
      EXPECT_EQ(resumed.earlier.step_seconds.size(), static_cast<size_t>(stop));
      EXPECT_TRUE(same_bytes(resumed.latents, full.latents));
    }
  }
  // Chained: stop after 1, resume and stop after 3, resume to the end.
  GenerateOptions a = tiny();
  a.stop_after_steps = 1;
  write_run_state(t / "s1.safetensors", *run(a).state);
  GenerateOptions b = tiny();
  b.resume_file = t / "s1.safetensors";
  b.stop_after_steps = 3;
  const GenerateResult mid = run(b);
  ASSERT_TRUE(mid.state.has_value());
  EXPECT_EQ(mid.state->timings.step_seconds.size(), 3u);
  write_run_state(t / "s3.safetensors", *mid.state);
  GenerateOptions c = tiny();
  c.resume_file = t / "s3.safetensors";
  const GenerateResult end = run(c, /*decode=*/true);
  const GenerateResult full = run(tiny(), /*decode=*/true);
  EXPECT_TRUE(same_bytes(end.latents, full.latents));
  EXPECT_TRUE(same_bytes(end.video, full.video));
  // A state resumed with the stop step at or before it is refused.
  GenerateOptions d = tiny();
  d.resume_file = t / "s3.safetensors";
  d.stop_after_steps = 3;
  expect_bad_input([&] { plan_generate(d); }, "already at step 3");
}

TEST(GenerateRandom, ResumeRefusesStatesOfOtherRunsAndBrokenFiles) {
  TempDir t;
  GenerateOptions a = tiny();
  a.stop_after_steps = 2;
  const RunState st = *run(a).state;
  const std::string file = t / "state.safetensors";
  write_run_state(file, st);
  using Edit = std::function<void(GenerateOptions&)>;
  const std::vector<std::pair<Edit, std::string>> mismatches = {
      {[](GenerateOptions& o) { o.seed = 4; }, "noise seed 3 (saved) vs seed 4 (now)"},
      {[](GenerateOptions& o) { o.steps = 6; }, "steps 5 (saved) vs 6 (now)"},
      {[](GenerateOptions& o) { o.prompt = "a blue fox"; }, "prompt text"},
      {[](GenerateOptions& o) { o.weights_seed = 1; }, "weights random, seed 11"},
      {[](GenerateOptions& o) { o.guide_low = 2.5f; }, "guide"},
      {[](GenerateOptions& o) { o.solver = SolverKind::Euler; }, "sampler unipc (saved) vs euler (now)"},
      {[](GenerateOptions& o) { o.width = 80; }, "video 64x48"},
  };
  for (const auto& [edit, part] : mismatches) {
    GenerateOptions o = tiny();
    o.resume_file = file;
    edit(o);
    SCOPED_TRACE(part);
    expect_bad_input([&] { plan_generate(o); }, "the state was saved by a different run");
    expect_bad_input([&] { plan_generate(o); }, part);
  }
  // Broken files: not safetensors, a latents file, a state with a damaged history.
  {
    std::ofstream(t / "junk.safetensors") << "not a state";
    GenerateOptions o = tiny();
    o.resume_file = t / "junk.safetensors";
    expect_bad_input([&] { plan_generate(o); }, "junk.safetensors");
  }
  {
    write_latents(t / "latents.safetensors", st.latents);
    GenerateOptions o = tiny();
    o.resume_file = t / "latents.safetensors";
    expect_bad_input([&] { plan_generate(o); }, "not a state file");
  }
  {
    RunState bad = st;
    bad.sampler.m_prev.resize(10);
    write_run_state(t / "bad.safetensors", bad);
    GenerateOptions o = tiny();
    o.resume_file = t / "bad.safetensors";
    expect_bad_input([&] { plan_generate(o); }, "\"sampler.m_prev\" has 10 values");
  }
  {
    RunState bad = st;
    bad.latents = st.latents.clone();
    bad.latents.f32()[5] = NAN;
    write_run_state(t / "nan.safetensors", bad);
    GenerateOptions o = tiny();
    o.resume_file = t / "nan.safetensors";
    expect_bad_input([&] { plan_generate(o); }, "non-finite");
  }
  // The state round-trips exactly.
  const RunState back = read_run_state(file);
  EXPECT_EQ(back.step, 2);
  EXPECT_EQ(back.fingerprint, st.fingerprint);
  EXPECT_TRUE(same_bytes(back.latents, st.latents));
  EXPECT_EQ(back.sampler.m_last, st.sampler.m_last);
  EXPECT_EQ(back.sampler.m_prev, st.sampler.m_prev);
  EXPECT_EQ(back.sampler.last_sample, st.sampler.last_sample);
  EXPECT_TRUE(same_bytes(back.prompt_embeds, st.prompt_embeds));
  EXPECT_EQ(back.timings.step_seconds, st.timings.step_seconds);
}

TEST(GenerateRandom, CliSaveStateThenResumeEqualsOneRun) {
  TempDir t;
  const std::vector<std::string> base = {"generate", "--weights", "random", "--config", "tiny", "--weights-seed", "4",
                                         "--prompt", "a red fox", "--size", "64x48", "--frames", "9",
                                         "--steps", "4", "--seed", "9", "--quiet"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  Result r = run_wan(with({"--output", t / "full.y4m", "--save-latents", t / "full.safetensors"}));
  ASSERT_EQ(r.code, 0) << r.err;
  r = run_wan(with({"--save-state", t / "s.safetensors", "--stop-after-steps", "2", "--timings-json", t / "t1.json"}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(t / "output.mp4"));
  const auto j1 = nlohmann::json::parse(slurp(t / "t1.json"));
  EXPECT_EQ(j1.at("timings").at("steps"), 2);
  EXPECT_EQ(j1.at("weights"), "random");
  r = run_wan(with({"--resume", t / "s.safetensors", "--output", t / "resumed.y4m", "--save-latents",
                    t / "resumed.safetensors", "--timings-json", t / "t2.json"}));
  ASSERT_EQ(r.code, 0) << r.err;
  auto lat = [&](const std::string& f) { return SafetensorsFile::open(f)->get("latents").to_f32().clone(); };
  EXPECT_TRUE(same_bytes(lat(t / "full.safetensors"), lat(t / "resumed.safetensors")));
  EXPECT_EQ(slurp(t / "full.y4m"), slurp(t / "resumed.y4m"));
  const auto j2 = nlohmann::json::parse(slurp(t / "t2.json"));
  EXPECT_EQ(j2.at("first_step"), 2);
  EXPECT_EQ(j2.at("timings").at("steps"), 2);
  EXPECT_EQ(j2.at("whole_run").at("steps"), 4);
  EXPECT_GT(j2.at("whole_run").at("text_encode_s").get<double>(), 0.0);

  // Bad input: exit 2, one line, nothing written.
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {with({"--task", "t2v-B99"}), "unknown task"},
      {with({"--resume", t / "missing.safetensors", "--output", t / "x.y4m"}), "no such file"},
      {with({"--resume", t / "full.safetensors", "--output", t / "x.y4m"}), "not a state file"},
      {with({"--resume", t / "s.safetensors", "--steps", "5", "--output", t / "x.y4m"}), "different run"},
      {with({"--save-state", t / "x.safetensors"}), "go together"},
      {with({"--save-state", t / "x.safetensors", "--stop-after-steps", "1", "--output", t / "x.y4m"}),
       "no video or final latents"},
      {with({"--weights", "fake"}), "--weights 'fake'"},
      {{"generate", "--prompt", "x", "--weights-seed", "3"}, "--weights-seed needs --weights random"},
  };
  for (const auto& [args, part] : bad) {
    SCOPED_TRACE(part);
    const Result b = run_wan(args);
    EXPECT_EQ(b.code, 2) << b.err;
    EXPECT_NE(b.err.find(part), std::string::npos) << b.err;
    EXPECT_EQ(std::count(b.err.begin(), b.err.end(), '\n'), 1) << b.err;
  }
  EXPECT_FALSE(fs::exists(t / "x.y4m"));
  EXPECT_FALSE(fs::exists(t / "x.safetensors"));
}

namespace wan {
namespace {
// encode-prompt's CPU encoder is planned too: weights and a 512-token forward against this machine.
TEST(GenerateRandom, TextEncoderThatCannotFitIsRefused) {
  T5Config c = t5_preset("umt5-xxl");
  c.vocab = 2000000000;  // 32 TB of f32 embedding: more than any machine here
  try {
    check_text_encoder_memory(c);
    ADD_FAILURE() << "not refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput);
    EXPECT_NE(std::string(e.what()).find("encoding a prompt on the CPU (float32 text encoder) needs "),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(check_text_encoder_memory(t5_preset("tiny")));
}
}  // namespace
}  // namespace wan

// ---- the resident models of consecutive runs (pipeline/model_cache.h, wan serve's ResidentRunner) ----
// A second run with the same settings takes the text encoder, the DiT and the VAE's weights from the cache and
// gives the uncached run's bytes; a setting that shapes a model (a LoRA, a size larger than the DiT was
// planned for) rebuilds that model only; a sampling change (seed, shift, prompt) or a smaller size rebuilds
// nothing.

TEST(ModelCache, ASecondRunReusesEveryModelAndGivesTheSameVideo) {
  ModelCache cache;
  const GenerateResult plain = run_generate(plan_generate(tiny()), {});
  const GenerateResult first = run_generate(plan_generate(tiny()), {}, true, &cache);
  EXPECT_EQ(cache.stats.built, 3u);  // text encoder, DiT, VAE weights
  EXPECT_EQ(cache.stats.reused, 0u);
  EXPECT_TRUE(cache.dit && cache.text_cpu && cache.vae);
  const GenerateResult second = run_generate(plan_generate(tiny()), {}, true, &cache);
  EXPECT_EQ(cache.stats.built, 3u);
  EXPECT_EQ(cache.stats.reused, 3u);
  for (const GenerateResult* r : {&first, &second}) {
    EXPECT_TRUE(same_bytes(r->latents, plain.latents));
    EXPECT_TRUE(same_bytes(r->video, plain.video));
  }
  // Sampling settings shape no model: nothing is rebuilt, and the result is the uncached one's. (The
  // step count can: it decides which experts the schedule uses.)
  GenerateOptions other = tiny(9);
  other.shift = 3.0;
  other.prompt = "a boat";
  const GenerateResult third = run_generate(plan_generate(other), {}, true, &cache);
  EXPECT_EQ(cache.stats.built, 3u);
  EXPECT_TRUE(same_bytes(third.video, run_generate(plan_generate(other), {}).video));
}

TEST(ModelCache, ASettingThatShapesAModelRebuildsOnlyThatModel) {
  test::TempDir t;
  ModelCache cache;
  (void)run_generate(plan_generate(tiny()), {}, false, &cache);
  ASSERT_EQ(cache.stats.built, 2u);  // latents only: no VAE
  // A larger size: the DiT (planned for a latent no larger than its first run's) again; the text
  // encoder stays.
  GenerateOptions wide = tiny();
  wide.width = 96;
  const GenerateResult w = run_generate(plan_generate(wide), {}, false, &cache);
  EXPECT_EQ(cache.stats.built, 3u);
  EXPECT_EQ(cache.stats.reused, 1u);
  EXPECT_EQ(cache.stats.evicted, 1u);
  EXPECT_EQ(cache.dit_latent, plan_generate(wide).latent_shape.numel());
  EXPECT_TRUE(same_bytes(w.latents, run_generate(plan_generate(wide), {}, false).latents));
  // A smaller size (and fewer frames) runs on the larger DiT: nothing is rebuilt, same bytes as uncached.
  GenerateOptions small = tiny();
  small.frames = 5;
  const GenerateResult sm = run_generate(plan_generate(small), {}, false, &cache);
  EXPECT_EQ(cache.stats.built, 3u);
  EXPECT_EQ(cache.stats.reused, 3u);
  EXPECT_EQ(cache.dit_latent, plan_generate(wide).latent_shape.numel());
  EXPECT_TRUE(same_bytes(sm.latents, run_generate(plan_generate(small), {}, false).latents));
  // A LoRA changes the DiT's weights: rebuilt, and the run equals an uncached one with that LoRA.
  gen::MakeLoraOptions l;
  l.dit = plan_generate(tiny()).ckpt.dit;
  l.rank = 4;
  l.format = gen::LoraFormat::Kohya;
  l.dtype = DType::F32;
  l.seed = 5;
  l.up_std = 0.05f;
  l.out = t / "l.safetensors";
  gen::make_lora(l);
  GenerateOptions lora = tiny();
  lora.loras.push_back({l.out, 0.8f, LoraExpert::All});
  const GenerateResult a = run_generate(plan_generate(lora), {}, false, &cache);
  EXPECT_EQ(cache.stats.built, 4u);
  EXPECT_EQ(cache.stats.evicted, 2u);
  EXPECT_EQ(cache.dit_latent, plan_generate(lora).latent_shape.numel());
  const GenerateResult b = run_generate(plan_generate(lora), {}, false);
  EXPECT_TRUE(same_bytes(a.latents, b.latents));
  EXPECT_FALSE(same_bytes(a.latents, run_generate(plan_generate(tiny()), {}, false).latents));
  cache.clear();
  EXPECT_FALSE(cache.dit || cache.text_cpu || cache.vae);
}

TEST(ModelCache, PreloadedModelsServeTheFirstRun) {
  ModelCache cache;
  const GeneratePlan p = plan_generate(tiny());
  preload_models(p, cache);
  EXPECT_EQ(cache.stats.built, 3u);  // DiT, VAE weights, text encoder
  EXPECT_TRUE(cache.dit && cache.text_cpu && cache.vae);
  preload_models(p, cache);  // already resident: nothing more is built
  EXPECT_EQ(cache.stats.built, 3u);
  const uint64_t reused = cache.stats.reused;
  const GenerateResult r = run_generate(p, {}, true, &cache);
  EXPECT_EQ(cache.stats.built, 3u);
  EXPECT_EQ(cache.stats.reused - reused, 3u);
  EXPECT_TRUE(same_bytes(r.video, run_generate(plan_generate(tiny()), {}).video));
}

// The residency's cost model (pipeline/startup.h residency_cost_seconds): resident is free; a swap pays
// one PCIe copy of an expert per change of expert (the first step's included); streaming pays what a
// block's copy exceeds a block's compute, which at the real width and 720p is nothing.
TEST(ResidencyCost, SwapsPayPerChangeStreamingOnlyWhatComputeDoesNotHide) {
  GeneratePlan p = plan_generate(tiny());
  ASSERT_EQ(p.experts.steps.size(), 5u);
  ASSERT_GT(p.experts.num_high(), 0);
  ASSERT_LT(p.experts.num_high(), 5);  // both experts: two changes, counting the first step
  GpuDiTMemory m;
  m.weight_bytes = 50'000'000'000;  // 1 s over PCIe at kResidencyPcie
  EXPECT_EQ(residency_cost_seconds(p, m), 0.0);  // resident: no host copies
  m.host_weight_bytes = 2 * m.weight_bytes;
  EXPECT_NEAR(residency_cost_seconds(p, m), 2.0, 1e-9);
  m.streams = true;
  m.block_bytes = 500'000'000;  // 10 ms a block; the tiny model's blocks compute in far less
  const double tiny_cost = residency_cost_seconds(p, m);
  EXPECT_GT(tiny_cost, 0.9 * 5 * p.ckpt.dit.num_layers * 0.01);
  EXPECT_LE(tiny_cost, 5 * p.ckpt.dit.num_layers * 0.01);
  p.ckpt.dit = dit_preset("t2v-A14B");
  p.seq_len = 75600;  // 720p, 81 frames: a block computes for about 0.6 s
  m.block_bytes = 720'000'000;
  EXPECT_EQ(residency_cost_seconds(p, m), 0.0);
}

// Chunked rows cost 1% of the blocks' compute, resident or streamed: more than any whole-row residency whose
// copies compute hides (so those win where they fit), on top of what streaming pays.
TEST(ResidencyCost, ChunkedRowsCostOnePercentOfTheCompute) {
  GeneratePlan p = plan_generate(tiny());
  p.ckpt.dit = dit_preset("t2v-A14B");
  p.seq_len = 75600;
  GpuDiTMemory m;
  m.chunk_rows = 18944;
  const double c = residency_cost_seconds(p, m);  // resident weights, chunked rows
  // per step (a batch of 2 with guidance): 40 blocks of batch·(4L²D + 2L(6D² + 2DF)) FLOP at kResidencyFlops
  const double D = 5120, F = 13824, L = 75600;
  double want = 0;
  for (const ExpertStep& es : p.experts.steps)
    want += 0.01 * 40 * (es.guide != 1.0f ? 2 : 1) * (4 * L * L * D + 2 * L * (6 * D * D + 2 * D * F)) / kResidencyFlops;
  EXPECT_GT(want, 0.0);
  EXPECT_NEAR(c, want, 1e-6 * want);
  m.weight_bytes = 50'000'000'000;
  m.host_weight_bytes = 2 * m.weight_bytes;
  m.streams = true;
  m.block_bytes = 720'000'000;  // hidden at 720p: the streaming adds nothing
  EXPECT_NEAR(residency_cost_seconds(p, m), c, 1e-9);
  m.chunk_rows = 0;
  EXPECT_EQ(residency_cost_seconds(p, m), 0.0);
}

// --vae-tile in the plan: the auto candidates (untiled, then 512, 384, 256-pixel tiles, each cutting the frame
// into more tiles), and the choice among them by the run's memory plan: the first (largest) whose run fits,
// stopping at the first whose decode stage fits (smaller tiles only shrink the decode).
TEST(VaeTilingPlan, CandidatesAndTheFirstThatFits) {
  GeneratePlan p = plan_generate(tiny());
  EXPECT_FALSE(p.vae_tiling.on());
  EXPECT_EQ(vae_tiling_candidates(p).size(), 1u);  // 64x48: every candidate tile covers the frame
  p.vae = vae_preset("wan2.1");
  p.latent_shape = Shape{16, 21, 90, 160};  // 1280x720
  const std::vector<VaeTiling> c = vae_tiling_candidates(p);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_FALSE(c[0].on());
  EXPECT_EQ(c[1], vae_tiling_from_pixels(512, 512, 8));
  EXPECT_EQ(c[3], vae_tiling_from_pixels(256, 256, 8));
  for (size_t i = 1; i < c.size(); ++i) EXPECT_GT(vae_tile_count(90, 160, c[i]), vae_tile_count(90, 160, c[i - 1]));
  p.vae_tile.mode = VaeTileRequest::Off;
  EXPECT_EQ(vae_tiling_candidates(p).size(), 1u);
  p.vae_tile = VaeTileRequest{VaeTileRequest::Fixed, 384, 256};
  p.vae_tiling = vae_tiling_from_pixels(256, 384, 8);
  ASSERT_EQ(vae_tiling_candidates(p).size(), 1u);
  EXPECT_EQ(vae_tiling_candidates(p)[0], p.vae_tiling);

  constexpr size_t G = size_t{1} << 30;
  const size_t decoder[] = {20 * G, 8 * G, 5 * G, 3 * G};
  int built = 0;
  auto run_at = [&](size_t i) {
    ++built;
    RunMemoryPlan r;
    r.add("d", "DiT", 6 * G, stage_bit(RunStage::Denoise));
    r.add("d", "VAE decoder", decoder[i], stage_bit(RunStage::Decode));
    return r;
  };
  RunMemoryPlan run;
  EXPECT_EQ(fit_decode_tiling(4, run_at, "d", 25 * G, &run), 0u);  // untiled fits
  EXPECT_EQ(built, 1);
  EXPECT_EQ(fit_decode_tiling(4, run_at, "d", 10 * G, &run), 1u);  // the largest tile that fits
  EXPECT_EQ(run.peak("d"), 8 * G);
  EXPECT_EQ(fit_decode_tiling(4, run_at, "d", 5 * G, &run), 2u);   // the DiT does not fit: no smaller tile tried
  EXPECT_GT(run.peak("d"), 5 * G);
  EXPECT_EQ(fit_decode_tiling(4, run_at, "d", 2 * G, &run), 3u);   // nothing fits: the smallest, for the refusal
  EXPECT_EQ(fit_decode_tiling(1, run_at, "d", 2 * G, &run), 0u);   // off: untiled only
}

// A fixed --vae-tile on the CPU: planned (and described), refused when it is not whole latent pixels with a
// whole 1/4 overlap, and the run's video close to the untiled run's (same latents; tiles of 128 pixels over
// 192x128, overlap 32).
TEST(VaeTilingPlan, FixedTileOnTheCpu) {
  GenerateOptions o = tiny();
  o.width = 192;
  o.height = 128;
  o.steps = 2;
  o.vae_tile = VaeTileRequest{VaeTileRequest::Fixed, 128, 128};
  const GeneratePlan p = plan_generate(o);
  const int sf = vae_spatial_factor(p.vae);
  EXPECT_EQ(p.vae_tiling, vae_tiling_from_pixels(128, 128, sf));
  EXPECT_NE(p.describe().find("decode   2 tiles of 128x128 pixels"), std::string::npos) << p.describe();
  GenerateOptions bad = o;
  bad.vae_tile.width = 100;  // not whole latent pixels with a whole 1/4 overlap (32 pixels for Wan 2.1)
  try {
    plan_generate(bad);
    ADD_FAILURE() << "a 100-pixel tile accepted";
  } catch (const OptionError& e) {
    EXPECT_EQ(e.key(), "vae-tile");
  }
  GenerateOptions untiled = o;
  untiled.vae_tile = VaeTileRequest{};
  const GenerateResult a = run_generate(p, {}), b = run_generate(plan_generate(untiled), {});
  EXPECT_TRUE(same_bytes(a.latents, b.latents));
  ASSERT_EQ(a.video.shape(), b.video.shape());
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.video.numel(); ++i) {
    const double d = static_cast<double>(a.video.f32()[i]) - b.video.f32()[i];
    num += d * d;
    den += static_cast<double>(b.video.f32()[i]) * b.video.f32()[i];
  }
  // Measured 6.3e-2 (x86-64, this tiny random model and seed); bound about 1.5x.
  std::printf("tiny run 192x128, 128-pixel tiles: tiled vs untiled video rel L2 %.4e\n", std::sqrt(num / den));
  EXPECT_GT(num, 0.0);
  EXPECT_LT(std::sqrt(num / den), 0.1);
}
