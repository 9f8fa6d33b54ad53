// A GGUF DiT streamed to the GPU (RawSpan::ggml_type through runtime/load_gpu.h: the stored blocks
// assembled on the device from 64-byte and tuned chunks, dequantised by kernels/gguf_dequant.h):
// every tensor of the tiny expert, written with every block type (tests/cpu/gguf_test_util.h), equals
// its CPU dequantisation rounded once to the device dtype, bit for bit; with a LoRA merged on the way in,
// the CPU merge of the dequantised weights rounded once; the getter path (no spans) gives the same.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../cpu/gguf_test_util.h"
#include "../cpu/test_util.h"
#include "ckpt/layout.h"
#include "gpu_test_util.h"
#include "kernels/check.h"
#include "lora/lora.h"
#include "lora/lora_gpu.h"
#include "models/dit/dit_gpu.h"
#include "models/dit/weights.h"
#include "testing/make_checkpoint.h"
#include "testing/make_lora.h"

using namespace wan;

namespace {

struct GgufExpert {
  test::TempDir t{"gguf_gpu"};
  std::string gguf = t / "wan2.2_t2v_high_noise_14B_Q.gguf", twin = t / "wan2.2_t2v_high_noise_14B_deq.safetensors";
  CheckpointInfo gi, ti;
  GgufExpert() {
    gen::MakeCheckpointOptions o;
    o.config = "tiny";
    o.layout = Layout::ComfyUI;
    o.dtype = DType::F32;
    o.seed = 21;
    o.out = t / "comfy";
    gen::make_checkpoint(o);
    ComponentFiles c;
    c.dit = o.out + "/" + gen::comfyui_files("tiny", DType::F32).dit_high;
    std::vector<std::string> types;
    test::write_pair(*open_weights(detect_components(c), Role::DiT), gguf, twin, 5, &types);
    gi = detect_checkpoint(gguf);
    ti = detect_checkpoint(twin);
  }
};

void expect_device_equals(const DiTConfig& cfg, cuda::DiTWeightSource src, const WeightStore& want) {
  cuda::DiTGpu::Options opt;
  opt.defer_arena = true;
  auto dit = cuda::DiTGpu::create(cfg, {std::move(src)}, cuda::DiTShape{}, opt);
  CUDA_CHECK(cudaDeviceSynchronize());
  int checked = 0;
  for (const WeightSpec& w : dit_weight_table(cfg)) {
    const Tensor got = dit.download_weight(0, w.name);  // f32 of the device's value
    Tensor e = want.get_f32(w.name).to_f32().clone();    // rounded once to the device dtype
    if (w.device_dtype == DType::BF16)
      for (int64_t i = 0; i < e.numel(); ++i) e.f32()[i] = bf16_to_f32(f32_to_bf16(e.f32()[i]));
    ASSERT_EQ(got.nbytes(), e.nbytes()) << w.name;
    EXPECT_EQ(0, std::memcmp(got.data(), e.data(), e.nbytes())) << w.name;
    ++checked;
  }
  EXPECT_GT(checked, 20);
}

}  // namespace

TEST(GgufDitGpu, StreamedBlocksDequantiseOnTheDeviceBitForBit) {
  REQUIRE_GPU();
  GgufExpert x;
  ASSERT_TRUE(x.gi.gguf);
  auto gs = open_weights(x.gi, x.gi.components.at(0).role);
  auto ts = open_weights(x.ti, x.ti.components.at(0).role);
  WeightStore* g = gs.get();
  for (int path = 0; path < 2; ++path) {
    SCOPED_TRACE(path == 0 ? "streamed" : "getter");
    cuda::DiTWeightSource src = cuda::DiTWeightSource::from([g](const std::string& n) { return g->get_f32(n); });
    if (path == 0) src.span = [g](const std::string& n) { return g->raw_span(n); };
    expect_device_equals(x.gi.dit, std::move(src), *ts);
  }
}

TEST(GgufDitGpu, LoraMergesOntoTheDequantisedWeights) {
  REQUIRE_GPU();
  GgufExpert x;
  gen::MakeLoraOptions l;
  l.dit = x.gi.dit;
  l.rank = 8;
  l.alpha = 4;
  l.all_targets = true;
  l.up_std = 0.05f;
  l.out = x.t / "lora.safetensors";
  gen::make_lora(l);
  const auto set = std::make_shared<const LoraSet>(
      load_lora_set({{l.out, 0.75f, LoraExpert::All}}, LoraExpert::All, dit_weight_table(x.gi.dit)));
  auto gs = open_weights(x.gi, x.gi.components.at(0).role);
  WeightStore* g = gs.get();
  cuda::DiTWeightSource src = cuda::DiTWeightSource::from([g](const std::string& n) { return g->get_f32(n); });
  src.span = [g](const std::string& n) { return g->raw_span(n); };
  src.merge = cuda::lora_merge_hooks(set);
  const auto merged_twin = with_lora(open_weights(x.ti, x.ti.components.at(0).role), set);
  expect_device_equals(x.gi.dit, std::move(src), *merged_twin);
}
