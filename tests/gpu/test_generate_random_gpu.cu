// `wan generate --weights random --device cuda` (issue 4 items 7 and 9): the host draws of the DiT and
// the text encoder are the GPU's draws (bit-identical DiT weights; T5 outputs within bf16), a tiny
// random-weight run on the GPU is deterministic and agrees with the CPU float32 run of the same weights
// within bf16, a paused and resumed GPU run gives byte-identical latents and video to an uninterrupted
// one (library and CLI), the GPU text encoder gives its device memory back when destroyed (and stays
// resident with --keep-text-encoder), and the run reports its peak device memory.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <unistd.h>

#include "gpu_test_model.h"
#include "models/weight_spec.h"
#include "models/dit/dit_gpu.h"
#include "models/umt5/umt5_gpu.h"
#include "ckpt/layout.h"
#include "pipeline/files.h"
#include "pipeline/models.h"
#include "pipeline/pipeline.h"
#include "formats/safetensors.h"
#include "models/umt5/umt5_cpu.h"

using namespace wan;
namespace fs = std::filesystem;

namespace {

GenerateOptions tiny(const std::string& device) {
  GenerateOptions o;
  o.random_weights = true;
  o.weights_seed = 21;
  o.config = "tiny";
  o.prompt = "a red fox runs through the snow";
  o.width = 64;
  o.height = 48;
  o.frames = 9;
  o.steps = 5;
  o.seed = 8;
  o.device = device;
  return o;
}

using gpu_test::rel_l2;

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

using gpu_test::slurp;

}  // namespace

TEST(GenerateRandomGpu, HostDrawsAreTheGpuDraws) {
  REQUIRE_GPU();
  // DiT: every tensor of a random expert on the GPU equals the host draw bit for bit.
  const DiTConfig c = dit_preset("tiny");
  const uint64_t seed = random_expert_seed(21, Task::T2V_A14B, false);
  cuda::DiTGpu dit = cuda::DiTGpu::create(c, {cuda::DiTWeightSource::random_weights(seed)}, cuda::DiTShape{2, 3, 6, 8});
  int64_t compared = 0;
  for (const auto& [name, shape] : dit_expected_shapes(c)) {
    const Tensor g = dit.download_weight(0, name), h = random_dit_tensor(c, seed, name);
    ASSERT_TRUE(same_bytes(g, h)) << name;
    compared += g.numel();
  }
  EXPECT_EQ(compared, dit_param_count(c));
  // Text encoder: the GPU's random encoder and the CPU float32 encoder on the host draw agree within bf16.
  const T5Config t5 = t5_preset("tiny");
  const uint64_t t5_seed = random_t5_seed(21);
  cuda::T5WeightSource src;
  src.random = true;
  src.seed = t5_seed;
  cuda::T5EncoderGpu enc(t5, src, 0);
  const std::vector<int32_t> ids = stand_in_token_ids("a red fox runs through the snow", t5.vocab);
  const Tensor gpu = enc.encode(ids.data(), static_cast<int64_t>(ids.size()));
  const Tensor cpu = t5_encode(t5, random_t5_weights(t5, t5_seed), ids.data(), static_cast<int64_t>(ids.size()));
  const double err = rel_l2(gpu, cpu);
  printf("random tiny T5: GPU (bf16) vs CPU (f32, host draw) rel L2 %.3e\n", err);
  EXPECT_LT(err, 3e-2);
  EXPECT_GT(err, 0.0);
}

TEST(GenerateRandomGpu, TinyRunIsDeterministicAndMatchesTheCpu) {
  REQUIRE_GPU();
  const GeneratePlan plan = plan_generate(tiny("cuda"));
  EXPECT_TRUE(plan.text_on_gpu);
  EXPECT_FALSE(plan.keep_text_encoder);
  EXPECT_GT(plan.t5_device_bytes, 0);
  EXPECT_NE(plan.describe().find("text encoder freed before the DiT loads"), std::string::npos) << plan.describe();
  const GenerateResult a = run_generate(plan, {}, true);
  const GenerateResult b = run_generate(plan_generate(tiny("cuda:0")), {}, true);
  EXPECT_TRUE(same_bytes(a.latents, b.latents));
  EXPECT_TRUE(same_bytes(a.video, b.video));
  for (int64_t i = 0; i < a.latents.numel(); ++i) ASSERT_TRUE(std::isfinite(a.latents.f32()[i])) << i;
  EXPECT_GT(a.peak_device_bytes, a.device_bytes_at_start);
  const GenerateResult cpu = run_generate(plan_generate(tiny("cpu")), {}, true);
  const double lat = rel_l2(a.latents, cpu.latents), vid = rel_l2(a.video, cpu.video);
  printf("random tiny T2V, 5 steps: GPU vs CPU latents rel L2 %.3e, video %.3e; peak device %.1f MiB (%.1f at start)\n",
         lat, vid, a.peak_device_bytes / 1048576.0, a.device_bytes_at_start / 1048576.0);
  EXPECT_LT(lat, 3e-2);
  EXPECT_LT(vid, 5e-2);
  EXPECT_GT(lat, 0.0);
}

TEST(GenerateRandomGpu, ResumedRunEqualsUninterrupted) {
  REQUIRE_GPU();
  const fs::path dir = fs::temp_directory_path() / ("wan_gpu_resume_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const GenerateResult full = run_generate(plan_generate(tiny("cuda")), {}, true);
  for (int stop : {1, 3}) {
    GenerateOptions a = tiny("cuda");
    a.stop_after_steps = stop;
    const GenerateResult paused = run_generate(plan_generate(a), {}, true);
    ASSERT_TRUE(paused.state.has_value());
    EXPECT_FALSE(paused.video.defined());
    const std::string file = (dir / ("s" + std::to_string(stop) + ".safetensors")).string();
    write_run_state(file, *paused.state);
    GenerateOptions b = tiny("cuda");
    b.resume_file = file;
    const GenerateResult resumed = run_generate(plan_generate(b), {}, true);
    EXPECT_EQ(resumed.first_step, stop);
    EXPECT_TRUE(same_bytes(resumed.latents, full.latents)) << "stop after " << stop;
    EXPECT_TRUE(same_bytes(resumed.video, full.video)) << "stop after " << stop;
  }
  // A CPU state is refused on the GPU (other numerics).
  GenerateOptions c = tiny("cpu");
  c.stop_after_steps = 2;
  write_run_state((dir / "cpu.safetensors").string(), *run_generate(plan_generate(c), {}, false).state);
  GenerateOptions d = tiny("cuda");
  d.resume_file = (dir / "cpu.safetensors").string();
  try {
    plan_generate(d);
    ADD_FAILURE() << "expected the CPU state to be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("numerics cpu float32 (saved) vs cuda bf16 (now)"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

TEST(GenerateRandomGpu, TextEncoderFreesItsMemoryOrStaysWithKeep) {
  REQUIRE_GPU();
  // The real umt5-xxl size drawn on the GPU (11 GB): its memory comes back when it is destroyed.
  const T5Config t5 = t5_preset("umt5-xxl");
  CheckpointInfo none;
  const int64_t before = gpu_memory_in_use(0);
  int64_t during = 0;
  Tensor e;
  {
    auto enc = make_gpu_text_encoder(none, t5, /*random=*/true, random_t5_seed(1),
                                      PromptTokenizer{std::nullopt, t5.vocab}, 0);
    during = gpu_memory_in_use(0);
    e = enc->encode("a red fox");
    EXPECT_EQ(enc->device_bytes(), cuda::T5EncoderGpu::weight_bytes(t5));
  }
  const int64_t after = gpu_memory_in_use(0);
  printf("umt5-xxl random on the GPU: in use %.0f MiB before, %.0f with the encoder, %.0f after destroying it\n",
         before / 1048576.0, during / 1048576.0, after / 1048576.0);
  EXPECT_GE(during - before, static_cast<int64_t>(cuda::T5EncoderGpu::weight_bytes(t5)));
  EXPECT_LT(after - before, int64_t{256} << 20);
  ASSERT_EQ(e.shape(), (Shape{10, 4096}));  // 9 stand-in bytes + EOS
  for (int64_t i = 0; i < e.numel(); ++i) ASSERT_TRUE(std::isfinite(e.f32()[i])) << i;

  // --keep-text-encoder: accounted in the plan and the run still matches the default one.
  GenerateOptions k = tiny("cuda");
  k.keep_text_encoder = true;
  const GeneratePlan kp = plan_generate(k);
  EXPECT_TRUE(kp.keep_text_encoder);
  EXPECT_NE(kp.describe().find("resident next to the DiT"), std::string::npos) << kp.describe();
  const GenerateResult kept = run_generate(kp, {}, false);
  const GenerateResult freed = run_generate(plan_generate(tiny("cuda")), {}, false);
  EXPECT_TRUE(same_bytes(kept.latents, freed.latents));
  EXPECT_GT(kept.peak_device_bytes, 0);
}

TEST(GenerateRandomGpu, CliPausedAndResumedRunGivesTheSameFiles) {
  REQUIRE_GPU();
  const fs::path dir = fs::temp_directory_path() / ("wan_gpu_cli_resume_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string base = std::string(WAN_BINARY) +
                           " generate --quiet --device cuda --weights random --config tiny --weights-seed 3"
                           " --prompt 'a red fox' --size 64x48 --frames 9 --steps 4 --seed 7";
  auto f = [&](const std::string& n) { return (dir / n).string(); };
  ASSERT_EQ(std::system((base + " --output " + f("full.y4m") + " --save-latents " + f("full.safetensors")).c_str()), 0);
  ASSERT_EQ(std::system((base + " --save-state " + f("s.safetensors") + " --stop-after-steps 2 --timings-json " +
                         f("t1.json")).c_str()),
            0);
  ASSERT_EQ(std::system((base + " --resume " + f("s.safetensors") + " --output " + f("resumed.y4m") +
                         " --save-latents " + f("resumed.safetensors") + " --timings-json " + f("t2.json"))
                            .c_str()),
            0);
  EXPECT_EQ(slurp(f("full.safetensors")), slurp(f("resumed.safetensors")));
  EXPECT_EQ(slurp(f("full.y4m")), slurp(f("resumed.y4m")));
  EXPECT_FALSE(slurp(f("full.y4m")).empty());
  const auto j1 = nlohmann::json::parse(slurp(f("t1.json"))), j2 = nlohmann::json::parse(slurp(f("t2.json")));
  EXPECT_EQ(j1.at("text_encoder"), "gpu");
  EXPECT_GT(j1.at("peak_device_bytes").get<int64_t>(), 0);
  EXPECT_EQ(j2.at("whole_run").at("steps"), 4);
  EXPECT_GT(j2.at("whole_run").at("peak_device_bytes").get<int64_t>(), 0);
  fs::remove_all(dir);
}
