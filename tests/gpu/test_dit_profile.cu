// The in-step op profile of the GPU DiT (DiTGpu::profile_forward, src/models/dit/dit_gpu.h; `wan bench`'s
// "in-step breakdown", issue 4): a full-width 14B config (dim 5120, 40 heads, ffn 13824) with 2 blocks
// and random weights drawn on the GPU, batch 2 (CFG), on fresh random latents and text states.
// (a) the profiled forward's output is bit-identical to the unprofiled eager and graph-replayed ones,
//     and profiling leaves the captured graph working (a replay afterwards is still identical);
// (b) every category is positive, GEMM + self + cross + other == total (1e-6 relative), and the
//     interval counts are what the block count implies (7 GEMMs per block + 7 outside, one self- and
//     one cross-attention per block);
// (c) a shape that never ran is profiled too (its plan-building forward runs first, untimed);
// (d) profiling a stream that is being captured into a CUDA graph is refused with a clear error, the
//     capture stays intact, and the model keeps working.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "models/config.h"
#include "core/error.h"
#include "models/dit/dit_gpu.h"
#include "gpu_test_model.h"

using namespace wan;
using cuda::DiTGpu;
using cuda::DiTShape;
using cuda::DiTWeightSource;
using cuda::OpProfile;
using gpu_test::StreamGuard;

namespace {

constexpr int kLayers = 2;
constexpr int64_t kCtxRows = 64;
const DiTShape kShape{2, 2, 30, 52};  // 2 x 15 x 26 patches: 780 tokens per sample

DiTConfig cfg() {
  DiTConfig c = dit_preset("t2v-A14B");
  c.num_layers = kLayers;
  return c;
}

using gpu_test::bit_equal;
using gpu_test::DiTHostInputs;
using gpu_test::nonfinite;
using gpu_test::poisoned;
// One timestep for every sample, text lengths 51 (and 17).
DiTHostInputs inputs(const DiTConfig& c, const DiTShape& s, uint64_t seed) {
  return gpu_test::dit_host_inputs(c, s, seed, std::vector<float>(static_cast<size_t>(s.batch), 731.0f),
                                   s.batch == 2 ? std::vector<int64_t>{51, 17} : std::vector<int64_t>{51}, kCtxRows);
}

std::unique_ptr<DiTGpu>& holder() {
  static std::unique_ptr<DiTGpu> g;
  return g;
}
class FreeModel : public ::testing::Environment {
 public:
  void TearDown() override { holder().reset(); }
};
[[maybe_unused]] ::testing::Environment* const kFreeModel = ::testing::AddGlobalTestEnvironment(new FreeModel);
DiTGpu& model() {
  std::unique_ptr<DiTGpu>& g = holder();
  if (!g) g = std::make_unique<DiTGpu>(DiTGpu::create(cfg(), {DiTWeightSource::random_weights(4242)}, kShape));
  return *g;
}

void print(const OpProfile& p, const char* what) {
  std::printf("  %s: total %.3f ms = GEMM %.3f (%d) + self %.3f (%d) + cross %.3f (%d) + other %.3f ms (%.1f%%)\n",
              what, p.total_ms, p.gemm_ms, p.gemms, p.self_attention_ms, p.self_attentions, p.cross_attention_ms,
              p.cross_attentions, p.other_ms(), 100 * p.other_ms() / p.total_ms);
}

void expect_consistent(const OpProfile& p, int layers) {
  EXPECT_EQ(p.layers, layers);
  EXPECT_EQ(p.gemms, 7 * layers + 7) << "q|k|v, o, cross q, cross k|v, cross o, FFN up, FFN down per block; "
                                        "patch, time 2 + projection, text 2, head outside";
  EXPECT_EQ(p.self_attentions, layers);
  EXPECT_EQ(p.cross_attentions, layers);
  EXPECT_GT(p.gemm_ms, 0.0);
  EXPECT_GT(p.self_attention_ms, 0.0);
  EXPECT_GT(p.cross_attention_ms, 0.0);
  EXPECT_GT(p.other_ms(), 0.0) << "norms, RoPE, residual adds and the copies run between the intervals";
  EXPECT_GT(p.total_ms, p.gemm_ms);
  const double sum = p.gemm_ms + p.self_attention_ms + p.cross_attention_ms + p.other_ms();
  EXPECT_LE(std::fabs(sum - p.total_ms), 1e-6 * p.total_ms);
}

TEST(GpuDitProfile, ProfiledForwardIsBitIdenticalAndAddsUp) {
  REQUIRE_GPU();
  DiTGpu& gpu = model();
  const DiTConfig c = cfg();
  const DiTHostInputs a = inputs(c, kShape, 31);
  StreamGuard st;
  std::vector<float> eager = poisoned(a.out_numel(c)), replay = poisoned(eager.size()), prof = poisoned(eager.size()),
                     after = poisoned(eager.size());
  gpu.set_use_graphs(false);
  gpu.forward(0, kShape, a.in(), eager.data(), st.s);   // eager (builds the plans on first use)
  gpu.set_use_graphs(true);
  gpu.forward(0, kShape, a.in(), replay.data(), st.s);  // captures and replays
  CUDA_CHECK(cudaStreamSynchronize(st.s));
  const size_t graphs = gpu.graphs_captured();
  ASSERT_EQ(graphs, 1u);
  const OpProfile p = gpu.profile_forward(0, kShape, a.in(), prof.data(), st.s);
  gpu.forward(0, kShape, a.in(), after.data(), st.s);   // the graph again
  CUDA_CHECK(cudaStreamSynchronize(st.s));
  print(p, "2 blocks, batch 2 x 780 tokens");
  EXPECT_EQ(nonfinite(eager), 0u) << "unwritten or non-finite outputs";
  EXPECT_TRUE(bit_equal(eager, replay)) << "graph replay differs from eager";
  EXPECT_TRUE(bit_equal(prof, eager)) << "the profiled forward differs from the unprofiled one";
  EXPECT_TRUE(bit_equal(after, eager)) << "a replay after profiling differs";
  EXPECT_EQ(gpu.graphs_captured(), graphs) << "profiling captured a graph";
  expect_consistent(p, kLayers);

  // A second profile of new inputs: again equal to an unprofiled forward of them, again consistent.
  const DiTHostInputs b = inputs(c, kShape, 77);
  std::vector<float> pb = poisoned(eager.size()), rb = poisoned(eager.size());
  const OpProfile q = gpu.profile_forward(0, kShape, b.in(), pb.data(), st.s);
  gpu.forward(0, kShape, b.in(), rb.data(), st.s);
  CUDA_CHECK(cudaStreamSynchronize(st.s));
  EXPECT_TRUE(bit_equal(pb, rb));
  EXPECT_FALSE(bit_equal(pb, eager)) << "new inputs gave the old output";
  expect_consistent(q, kLayers);
}

TEST(GpuDitProfile, ShapeThatNeverRanIsProfiled) {
  REQUIRE_GPU();
  DiTGpu& gpu = model();
  const DiTConfig c = cfg();
  const DiTShape one{1, 2, 30, 52};  // batch 1: never run before this test
  const DiTHostInputs a = inputs(c, one, 5);
  StreamGuard st;
  std::vector<float> prof = poisoned(a.out_numel(c)), eager = poisoned(prof.size());
  const OpProfile p = gpu.profile_forward(0, one, a.in(), prof.data(), st.s);
  gpu.set_use_graphs(false);
  gpu.forward(0, one, a.in(), eager.data(), st.s);
  gpu.set_use_graphs(true);
  CUDA_CHECK(cudaStreamSynchronize(st.s));
  print(p, "2 blocks, batch 1, first use");
  EXPECT_EQ(nonfinite(prof), 0u);
  EXPECT_TRUE(bit_equal(prof, eager));
  expect_consistent(p, kLayers);
}

TEST(GpuDitProfile, RefusedWhileCapturing) {
  REQUIRE_GPU();
  DiTGpu& gpu = model();
  const DiTConfig c = cfg();
  const DiTHostInputs a = inputs(c, kShape, 9);
  StreamGuard st;
  std::vector<float> before = poisoned(a.out_numel(c)), later = poisoned(before.size());
  gpu.forward(0, kShape, a.in(), before.data(), st.s);
  CUDA_CHECK(cudaStreamSynchronize(st.s));

  float* dout = nullptr;
  CUDA_CHECK(cudaMalloc(&dout, before.size() * sizeof(float)));
  CUDA_CHECK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal));
  std::string msg = "(no error)";
  try {
    (void)gpu.profile_forward(0, kShape, a.in(), dout, st.s);
  } catch (const Error& e) {
    msg = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(st.s, &graph);  // the refusal left the capture intact
  EXPECT_EQ(end, cudaSuccess) << cudaGetErrorString(end);
  if (graph) CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaFree(dout));
  std::printf("  error: %s\n", msg.c_str());
  EXPECT_NE(msg.find("profile_forward"), std::string::npos) << msg;
  EXPECT_NE(msg.find("captured into a CUDA graph"), std::string::npos) << msg;

  // The model still works and still agrees with itself.
  gpu.forward(0, kShape, a.in(), later.data(), st.s);
  CUDA_CHECK(cudaStreamSynchronize(st.s));
  EXPECT_EQ(nonfinite(before), 0u);
  EXPECT_TRUE(bit_equal(later, before));
}

}  // namespace
