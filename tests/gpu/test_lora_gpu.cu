// LoRA on the GPU DiT (lora/lora_gpu.h through DiTGpu::create), against the CPU merge (lora.h):
// (a) streamed checkpoint weights (fp32 and bf16 files, 64-byte chunks and the tuned loader): every
//     targeted tensor on the device equals the CPU's merged f32 weight rounded once to its device dtype,
//     bit for bit, every other tensor equals the plain load; rank 4 and a stack of two files (one
//     kohya, one PEFT, different strengths), with .diff_b and diff_m full deltas;
// (b) the getter path (no byte ranges) gives the same bits;
// (c) random weights: the drawn tensor (bf16 rows rounded) merged in f32 and rounded back;
// (d) strength 0: the device weights equal the plain load bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../cpu/test_util.h"
#include "ckpt/layout.h"
#include "core/dtype.h"
#include "formats/safetensors.h"
#include "gpu_test_util.h"
#include "kernels/check.h"
#include "lora/lora.h"
#include "lora/lora_gpu.h"
#include "models/dit/dit_gpu.h"
#include "models/dit/weights.h"
#include "models/weight_spec.h"
#include "testing/make_checkpoint.h"
#include "testing/make_lora.h"

using namespace wan;
namespace fs = std::filesystem;

namespace {

struct Fixture {
  test::TempDir t{"lora_gpu"};
  CheckpointInfo info;
  std::vector<std::string> lora_files;

  explicit Fixture(DType dtype) {
    gen::MakeCheckpointOptions o;
    o.config = "tiny";
    o.layout = Layout::Official;
    o.dtype = dtype;
    o.dit_only = true;
    o.seed = 3;
    o.out = t / "ck";
    gen::make_checkpoint(o);
    info = detect_checkpoint(o.out + "/high_noise_model");
    // Two LoRAs in two key formats; the second adds full deltas on a bias and a modulation table.
    for (int k = 0; k < 2; ++k) {
      gen::MakeLoraOptions l;
      l.dit = info.dit;
      l.rank = 4 + k;
      l.alpha = k == 0 ? 2.0f : 0.0f;
      l.format = k == 0 ? gen::LoraFormat::Kohya : gen::LoraFormat::Peft;
      l.all_targets = k == 1;
      l.dtype = k == 0 ? DType::BF16 : DType::F32;
      l.seed = 10 + static_cast<uint64_t>(k);
      l.up_std = 0.05f;
      fs::create_directories(t / ("l" + std::to_string(k)));
      l.out = t / ("l" + std::to_string(k) + "/lora.safetensors");
      gen::make_lora(l);
      lora_files.push_back(l.out);
    }
    // Full deltas (official form) on a bias and on block 0's modulation table.
    const auto shapes = dit_expected_shapes(info.dit);
    auto rnd = [](const Shape& s, uint64_t seed) {
      Tensor x = Tensor::f32(s);
      const std::vector<float> v = gpu_test::randn(seed, static_cast<size_t>(s.numel()), 0.01f);
      std::memcpy(x.data(), v.data(), v.size() * 4);
      return x;
    };
    write_safetensors(t / "diffs.safetensors",
                      {{"diffusion_model.blocks.0.self_attn.q.diff_b", rnd(shapes.at("blocks.0.self_attn.q.bias"), 5)},
                       {"diffusion_model.blocks.0.diff_m", rnd(shapes.at("blocks.0.modulation"), 6)}});
    lora_files.push_back(t / "diffs.safetensors");
  }

  std::shared_ptr<const LoraSet> set(float strength) const {
    std::vector<LoraSpec> specs;
    const float s[] = {strength, 0.6f * strength, strength};
    for (size_t i = 0; i < lora_files.size(); ++i) specs.push_back({lora_files[i], s[i], LoraExpert::All});
    return std::make_shared<const LoraSet>(load_lora_set(specs, LoraExpert::High, dit_weight_table(info.dit)));
  }
};

// The CPU's merged weight rounded once to the device dtype, widened back to f32 (download_weight's form).
Tensor rounded(const Tensor& merged_f32, DType device_dtype) {
  Tensor out = merged_f32.to_f32().clone();
  if (device_dtype == DType::BF16)
    for (int64_t i = 0; i < out.numel(); ++i) out.f32()[i] = bf16_to_f32(f32_to_bf16(out.f32()[i]));
  return out;
}

// Builds a one-expert DiT from `src` and checks every tensor against `want(name)` (f32, merged or not).
void check_dit(const DiTConfig& cfg, cuda::DiTWeightSource src, const std::function<Tensor(const std::string&)>& want,
               const LoraSet* set, int* merged_out) {
  cuda::DiTGpu::Options opt;
  opt.defer_arena = !src.random;  // random draws stage through the arena
  auto dit = cuda::DiTGpu::create(cfg, {std::move(src)}, cuda::DiTShape{2, 2, 16, 16}, opt);
  CUDA_CHECK(cudaDeviceSynchronize());
  int merged = 0, checked = 0;
  for (const WeightSpec& w : dit_weight_table(cfg)) {
    const Tensor got = dit.download_weight(0, w.name);  // f32
    const Tensor e = rounded(want(w.name), w.device_dtype);
    ASSERT_EQ(got.dtype(), DType::F32);
    ASSERT_EQ(got.nbytes(), e.nbytes()) << w.name;
    EXPECT_EQ(0, std::memcmp(got.data(), e.data(), e.nbytes())) << w.name;
    const LoraTarget* t = set ? set->find(w.name) : nullptr;
    merged += t && t->active();
    ++checked;
  }
  EXPECT_GT(checked, 20);
  if (merged_out) *merged_out = merged;
}

}  // namespace

TEST(LoraGpu, StreamedAndGetterLoadsMergeBeforeTheOneRounding) {
  REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Fixture f(dt);
    const auto set = f.set(1.3f);
    ASSERT_GT(set->targets.size(), 20u);
    std::unique_ptr<WeightStore> base = open_weights(f.info, f.info.components.at(0).role);
    std::unique_ptr<WeightStore> merged = with_lora(open_weights(f.info, f.info.components.at(0).role), set);
    WeightStore* bs = base.get();
    WeightStore* ms = merged.get();
    for (int path = 0; path < 2; ++path) {  // 0: streamed (byte ranges), 1: getters only
      SCOPED_TRACE(path == 0 ? "streamed" : "getter");
      cuda::DiTWeightSource src = cuda::DiTWeightSource::from([bs](const std::string& n) { return bs->get_f32(n); });
      if (path == 0) src.span = [bs](const std::string& n) { return bs->raw_span(n); };
      src.merge = cuda::lora_merge_hooks(set);
      int n_merged = 0;
      check_dit(f.info.dit, std::move(src), [ms](const std::string& n) { return ms->get_f32(n); }, set.get(), &n_merged);
      EXPECT_GE(n_merged, 2 * 10 + 5);  // every projection of both blocks, embeddings, bias and modulation
    }
  }
}

TEST(LoraGpu, RandomWeightsMergeAfterTheDraw) {
  REQUIRE_GPU();
  Fixture f(DType::BF16);
  const auto set = f.set(0.8f);
  const uint64_t seed = 99;
  cuda::DiTWeightSource src = cuda::DiTWeightSource::random_weights(seed);
  src.merge = cuda::lora_merge_hooks(set);
  const WeightTable table = dit_weight_table(f.info.dit);
  check_dit(
      f.info.dit, std::move(src),
      [&](const std::string& n) {
        Tensor x = draw_random_weight(find_weight(table, n, "DiT"), seed).clone();
        if (const LoraTarget* t = set->find(n); t && t->active()) apply_lora_cpu(*t, x);
        return x;
      },
      set.get(), nullptr);
}

TEST(LoraGpu, StrengthZeroIsThePlainLoad) {
  REQUIRE_GPU();
  Fixture f(DType::BF16);
  const auto set = f.set(0.0f);
  std::unique_ptr<WeightStore> base = open_weights(f.info, f.info.components.at(0).role);
  WeightStore* bs = base.get();
  cuda::DiTWeightSource src = cuda::DiTWeightSource::from([bs](const std::string& n) { return bs->get_f32(n); });
  src.span = [bs](const std::string& n) { return bs->raw_span(n); };
  src.merge = cuda::lora_merge_hooks(set);
  int merged = -1;
  check_dit(f.info.dit, std::move(src), [bs](const std::string& n) { return bs->get_f32(n); }, set.get(), &merged);
  EXPECT_EQ(merged, 0);
}
