// cuDNN fused attention (kernels/attention_cudnn.h) against the CPU reference wan::ops::attention.
// Precision rule: the GPU's max error vs the fp32 reference must be at most twice the max
// error of the same maths done plainly in bf16 (bf16 inputs, fp32 scores and softmax, P rounded to bf16
// before P·V, fp32 accumulation, output rounded to the output type), computed on the CPU by
// attention_test_ref.h (shared with the own kernel's test).
// Every case uses fresh random inputs, poisons outputs (NaN bytes) first and checks that every output
// element was written and that nothing outside the output rows (stride gaps) was touched. Masked keys
// are filled with large junk so that a masking error shows as a large error.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "attention_test_ref.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/attention_cudnn.h"
#include "kernels/check.h"
#include "kernels/rng.h"
#include "gpu_test_util.h"

using namespace wan;
using namespace wan::gpu_test;
using cuda::AttentionArgs;
using cuda::AttentionShape;
using cuda::AttnOutType;
using cuda::CudnnAttention;

namespace {

constexpr int64_t D = kAttnD;

struct Case {
  const char* name;
  int64_t B, Lq, Lk, H;
  std::vector<int64_t> klens;  // empty: unmasked
  bool lse = true;
  bool fused_qkv = false;  // q/k/v as views of one [B, L, 3, H, D] buffer (self-attention)
  int64_t o_pad = 0;       // extra elements per output token (o token stride H*D + o_pad)
  float q_std = 1.0f;
  uint64_t seed = 1;
  int64_t sample_rows = 0;  // 0: check every query row; else this many rows (first, last, random)
};

struct CaseResult {
  double err = 0, base_err = 0, lse_err = 0;
  double ms = 0;
};

CaseResult run_case(CudnnAttention& attn, const Case& c, cudaStream_t stream) {
  const int64_t B = c.B, Lq = c.Lq, Lk = c.Lk, H = c.H, HD = H * D;
  const bool masked = !c.klens.empty();
  // ---- inputs (bf16, in their device layout) ----
  std::vector<uint16_t> qkv, qh, kh, vh;
  int64_t q_ld = HD, k_ld = HD, v_ld = HD;
  if (c.fused_qkv) {
    EXPECT_EQ(Lq, Lk);
    qkv = to_bf16(randn(c.seed, static_cast<size_t>(B * Lq * 3 * HD), 1.0f));
    // q rows scaled by q_std for a peakier softmax
    for (size_t t = 0; t < static_cast<size_t>(B * Lq); ++t)
      for (int64_t e = 0; e < HD; ++e) {
        uint16_t& x = qkv[t * 3 * HD + e];
        x = f32_to_bf16(bf16_to_f32(x) * c.q_std);
      }
    q_ld = k_ld = v_ld = 3 * HD;
  } else {
    qh = to_bf16(randn(c.seed, static_cast<size_t>(B * Lq * HD), c.q_std));
    kh = to_bf16(randn(c.seed + 1000, static_cast<size_t>(B * Lk * HD), 1.0f));
    vh = to_bf16(randn(c.seed + 2000, static_cast<size_t>(B * Lk * HD), 1.0f));
  }
  auto kat = [&](int64_t b, int64_t j, int64_t e) -> uint16_t& {
    return c.fused_qkv ? qkv[static_cast<size_t>((b * Lk + j) * k_ld + HD + e)]
                       : kh[static_cast<size_t>((b * Lk + j) * HD + e)];
  };
  auto vat = [&](int64_t b, int64_t j, int64_t e) -> uint16_t& {
    return c.fused_qkv ? qkv[static_cast<size_t>((b * Lk + j) * v_ld + 2 * HD + e)]
                       : vh[static_cast<size_t>((b * Lk + j) * HD + e)];
  };
  auto qat = [&](int64_t b, int64_t i, int64_t e) -> uint16_t {
    return c.fused_qkv ? qkv[static_cast<size_t>((b * Lq + i) * q_ld + e)]
                       : qh[static_cast<size_t>((b * Lq + i) * HD + e)];
  };
  if (masked) {  // junk in the excluded keys: large K (dominates the softmax) and large V
    std::vector<uint16_t> junk = to_bf16(randn(c.seed + 3000, static_cast<size_t>(2 * Lk * HD), 20.0f, 40.0f));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = c.klens[b]; j < Lk; ++j)
        for (int64_t e = 0; e < HD; ++e) {
          kat(b, j, e) = junk[static_cast<size_t>(j * HD + e)];
          vat(b, j, e) = junk[static_cast<size_t>((Lk + j) * HD + e)];
        }
  }

  // ---- device run ----
  const int64_t o_ld = HD + c.o_pad;
  const size_t osz = 2;  // bf16 output
  std::unique_ptr<DevBuf<uint16_t>> dqkv, dq, dk, dv;
  const uint16_t *pq, *pk, *pv;
  if (c.fused_qkv) {
    dqkv = std::make_unique<DevBuf<uint16_t>>(qkv.size());
    dqkv->upload(qkv);
    pq = dqkv->p;
    pk = dqkv->p + HD;
    pv = dqkv->p + 2 * HD;
  } else {
    dq = std::make_unique<DevBuf<uint16_t>>(qh.size());
    dk = std::make_unique<DevBuf<uint16_t>>(kh.size());
    dv = std::make_unique<DevBuf<uint16_t>>(vh.size());
    dq->upload(qh);
    dk->upload(kh);
    dv->upload(vh);
    pq = dq->p;
    pk = dk->p;
    pv = dv->p;
  }
  DevBuf<uint8_t> dout(static_cast<size_t>(B * Lq * o_ld) * osz);
  DevBuf<float> dlse(static_cast<size_t>(B * H * Lq));
  DevBuf<int32_t> dkl(static_cast<size_t>(B));
  if (masked) {
    std::vector<int32_t> kl32(c.klens.begin(), c.klens.end());
    dkl.upload(kl32);
  }
  dout.poison();
  dlse.poison();

  AttentionShape s;
  s.B = B, s.Lq = Lq, s.Lk = Lk, s.H = H;
  s.q_ld = c.fused_qkv ? q_ld : 0;
  s.k_ld = c.fused_qkv ? k_ld : 0;
  s.v_ld = c.fused_qkv ? v_ld : 0;
  s.o_ld = c.o_pad ? o_ld : 0;
  s.masked = masked;
  s.lse = c.lse;
  const size_t ws = attn.workspace_size(s);
  DevBuf<uint8_t> dws(ws);
  AttentionArgs a;
  a.q = pq, a.k = pk, a.v = pv, a.o = dout.p;
  a.k_lens = masked ? dkl.p : nullptr;
  a.lse = c.lse ? dlse.p : nullptr;
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  CUDA_CHECK(cudaEventRecord(e0, stream));
  attn.run(s, a, dws.p, ws, stream);
  CUDA_CHECK(cudaEventRecord(e1, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaGetLastError());
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  const std::vector<uint8_t> out_bytes = dout.download();
  const std::vector<float> lse_gpu = dlse.download();

  auto out_at = [&](int64_t b, int64_t i, int64_t e) -> float {
    const size_t idx = static_cast<size_t>((b * Lq + i) * o_ld + e);
    uint16_t hv;
    std::memcpy(&hv, out_bytes.data() + idx * 2, 2);
    return bf16_to_f32(hv);
  };
  // every output element written (finite), every gap element untouched (still the 0xFF poison)
  size_t unwritten = 0, gap_touched = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Lq; ++i) {
      for (int64_t e = 0; e < HD; ++e) unwritten += !std::isfinite(out_at(b, i, e));
      for (int64_t e = HD; e < o_ld; ++e) {
        const size_t idx = static_cast<size_t>((b * Lq + i) * o_ld + e) * osz;
        for (size_t x = 0; x < osz; ++x) gap_touched += out_bytes[idx + x] != 0xFF;
      }
    }
  EXPECT_EQ(unwritten, 0u) << c.name << ": output elements not written (or not finite)";
  EXPECT_EQ(gap_touched, 0u) << c.name << ": bytes in the output stride gap were written";
  if (c.lse) {
    size_t bad = 0;
    for (float x : lse_gpu) bad += !std::isfinite(x);
    EXPECT_EQ(bad, 0u) << c.name << ": lse elements not written";
  }

  // ---- CPU reference on the checked rows ----
  const std::vector<int64_t> rows = checked_rows(Lq, c.sample_rows, c.seed);
  const AttentionRef cref = attention_reference(qat, kat, vat, B, Lk, H, rows, c.klens);
  const int64_t R = cref.R;
  const std::vector<float>& ref = cref.fp32;
  const std::vector<float>& base = cref.plain;

  CaseResult res;
  res.ms = ms;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t e = 0; e < HD; ++e) {
        const size_t ri = static_cast<size_t>((b * R + r) * HD + e);
        res.err = std::max(res.err, static_cast<double>(std::fabs(out_at(b, rows[r], e) - ref[ri])));
        res.base_err = std::max(res.base_err, static_cast<double>(std::fabs(base[ri] - ref[ri])));
      }
  if (c.lse)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t r = 0; r < R; ++r) {
          const double g = lse_gpu[static_cast<size_t>((b * H + h) * Lq + rows[r])];
          const double want = cref.lse[static_cast<size_t>((b * H + h) * R + r)];
          res.lse_err = std::max(res.lse_err, std::fabs(g - want) / std::max(1.0, std::fabs(want)));
        }
  std::printf("[attn] %-34s B=%lld Lq=%lld Lk=%lld H=%lld rows=%lld  err %.3e  bf16-plain %.3e  lse %.2e  %.3f ms\n",
              c.name, (long long)B, (long long)Lq, (long long)Lk, (long long)H, (long long)R, res.err, res.base_err,
              res.lse_err, res.ms);
  EXPECT_LE(res.err, 2.0 * res.base_err + 1e-6)
      << c.name << ": error " << res.err << " > 2 x plain bf16 error " << res.base_err;
  if (c.lse) EXPECT_LE(res.lse_err, 1e-4) << c.name << ": lse relative error";
  return res;
}

}  // namespace

TEST(GpuAttentionCudnn, SelfAttentionOddLengths) {
  REQUIRE_GPU();
  CudnnAttention attn;
  StreamGuard st;
  run_case(attn, {"self L=1", 2, 1, 1, 2, {}, true, false, 0, 1.0f, 11}, st.s);
  run_case(attn, {"self L=127", 2, 127, 127, 3, {}, true, false, 0, 2.0f, 12}, st.s);
  run_case(attn, {"self L=1000 (no lse)", 2, 1000, 1000, 4, {}, false, false, 0, 1.0f, 13}, st.s);
  run_case(attn, {"self L=4097", 2, 4097, 4097, 2, {}, true, false, 0, 2.0f, 14}, st.s);
  std::printf("[attn] %s\n",
              attn.describe({2, 4097, 4097, 2, 128, 0, 0, 0, 0, false, true, AttnOutType::BF16}).c_str());
}

TEST(GpuAttentionCudnn, MaskedKeysWithJunkPadding) {
  REQUIRE_GPU();
  CudnnAttention attn;
  StreamGuard st;
  run_case(attn, {"self masked L=1000 k={517,1}", 2, 1000, 1000, 3, {517, 1}, true, false, 0, 2.0f, 21}, st.s);
  run_case(attn, {"self masked L=4097 k={4097,2049}", 2, 4097, 4097, 2, {4097, 2049}, true, false, 0, 1.0f, 22}, st.s);
  run_case(attn, {"self masked L=127 k={127,64} (no lse)", 2, 127, 127, 4, {127, 64}, false, false, 0, 1.0f, 23}, st.s);
}

TEST(GpuAttentionCudnn, CrossAttention512Keys) {
  REQUIRE_GPU();
  CudnnAttention attn;
  StreamGuard st;
  run_case(attn, {"cross Lk=512 masked k={512,77}", 2, 1000, 512, 4, {512, 77}, true, false, 0, 2.0f, 31}, st.s);
  run_case(attn, {"cross Lk=512 unmasked", 2, 4097, 512, 2, {}, true, false, 0, 1.0f, 32}, st.s);
  run_case(attn, {"cross Lq=1 Lk=512 masked k={300,512}", 2, 1, 512, 3, {300, 512}, true, false, 0, 1.0f, 33}, st.s);
}

TEST(GpuAttentionCudnn, StridedFusedQkvAndPaddedOutput) {
  REQUIRE_GPU();
  CudnnAttention attn;
  StreamGuard st;
  run_case(attn, {"fused qkv L=257, o pad 64", 2, 257, 257, 2, {}, true, true, 64, 1.0f, 41}, st.s);
  run_case(attn, {"fused qkv masked L=1000 k={999,400}", 2, 1000, 1000, 3, {999, 400}, true, true, 0, 2.0f, 42}, st.s);
}

TEST(GpuAttentionCudnn, LongSequenceSampledRows) {
  REQUIRE_GPU();
  CudnnAttention attn;
  StreamGuard st;
  // 720p token count + 1: rows 0, L-1 and 46 random rows checked against the CPU reference
  run_case(attn, {"self L=75601 (sampled rows)", 1, 75601, 75601, 2, {}, true, false, 0, 1.0f, 51, 48}, st.s);
  // Warm timing at the real 720p self-attention shape (B=2 for CFG, 40 heads, 75600 tokens); informative
  // only (ANCHORS.md: torch's cuDNN SDPA took 413 ms here on an H100). Also checks every output written.
  const int64_t B = 2, L = 75600, H = 40, HD = H * D;
  AttentionShape s{B, L, L, H, 128, 0, 0, 0, 0, false, false, AttnOutType::BF16};
  DevBuf<uint16_t> q(static_cast<size_t>(B * L * HD)), k(q.n), v(q.n), o(q.n);
  cuda::philox_normal_fill_bf16(q.p, q.n, 52, 0, 1.0f, st.s);
  cuda::philox_normal_fill_bf16(k.p, k.n, 53, 0, 1.0f, st.s);
  cuda::philox_normal_fill_bf16(v.p, v.n, 54, 0, 1.0f, st.s);
  o.poison();
  const size_t ws = attn.workspace_size(s);
  DevBuf<uint8_t> dws(ws);
  AttentionArgs a{q.p, k.p, v.p, o.p, nullptr, nullptr, 0.0f};
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  attn.run(s, a, dws.p, ws, st.s);
  const int reps = 3;
  CUDA_CHECK(cudaEventRecord(e0, st.s));
  for (int i = 0; i < reps; ++i) attn.run(s, a, dws.p, ws, st.s);
  CUDA_CHECK(cudaEventRecord(e1, st.s));
  CUDA_CHECK(cudaStreamSynchronize(st.s));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  ms /= reps;
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  const std::vector<uint16_t> out = o.download();
  size_t bad = 0;
  for (uint16_t x : out) bad += !std::isfinite(bf16_to_f32(x));
  EXPECT_EQ(bad, 0u) << "720p shape: output elements not written";
  const double flop = 4.0 * static_cast<double>(L) * L * D * H * B;
  std::printf("[attn] timing B=2 H=40 L=75600: %.1f ms = %.0f TFLOP/s (%s)\n", ms, flop / (ms * 1e-3) / 1e12,
              attn.describe(s).c_str());
}

// The engine replays attention inside CUDA graphs: a captured run must equal an eager one bit for bit.
TEST(GpuAttentionCudnn, CapturesIntoCudaGraph) {
  REQUIRE_GPU();
  CudnnAttention attn;
  StreamGuard st;
  const int64_t B = 2, Lq = 300, Lk = 512, H = 3, HD = H * D;
  AttentionShape s{B, Lq, Lk, H, 128, 0, 0, 0, 0, true, true, AttnOutType::BF16};
  std::vector<uint16_t> q = to_bf16(randn(81, static_cast<size_t>(B * Lq * HD), 1.5f));
  std::vector<uint16_t> k = to_bf16(randn(82, static_cast<size_t>(B * Lk * HD), 1.0f));
  std::vector<uint16_t> v = to_bf16(randn(83, k.size(), 1.0f));
  DevBuf<uint16_t> dq(q.size()), dk(k.size()), dv(v.size()), o1(q.size()), o2(q.size());
  DevBuf<float> l1(static_cast<size_t>(B * H * Lq)), l2(l1.n);
  DevBuf<int32_t> kl(2);
  dq.upload(q), dk.upload(k), dv.upload(v);
  kl.upload(std::vector<int32_t>{77, 512});
  o1.poison(), o2.poison(), l2.poison();
  const size_t ws = attn.workspace_size(s);  // plan built before the capture
  DevBuf<uint8_t> dws(ws);
  AttentionArgs a{dq.p, dk.p, dv.p, o1.p, kl.p, l1.p, 0.0f};
  attn.run(s, a, dws.p, ws, st.s);
  CUDA_CHECK(cudaStreamSynchronize(st.s));
  a.o = o2.p, a.lse = l2.p;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal));
  attn.run(s, a, dws.p, ws, st.s);
  CUDA_CHECK(cudaStreamEndCapture(st.s, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_CHECK(cudaGraphLaunch(exec, st.s));
  CUDA_CHECK(cudaStreamSynchronize(st.s));
  EXPECT_EQ(o1.download(), o2.download()) << "graph replay differs from the eager run";
  EXPECT_EQ(l1.download(), l2.download()) << "graph replay LSE differs from the eager run";
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
}

// cuDNN (9.14 on the H100 device) finalizes a plan for an FP32 O tensor but writes bf16 into it (seen on an H100: half
// the f32 buffer left unwritten), so the op refuses fp32 output with a clear message.
TEST(GpuAttentionCudnn, Fp32OutputRefused) {
  REQUIRE_GPU();
  CudnnAttention attn;
  AttentionShape s{2, 127, 127, 2, 128, 0, 0, 0, 0, true, true, AttnOutType::F32};
  try {
    attn.prepare(s);
    FAIL() << "fp32 output should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp32 output is not supported"), std::string::npos) << e.what();
  }
  EXPECT_EQ(attn.plans_built(), 0u);
}

TEST(GpuAttentionCudnn, PlanCacheAndDeterminism) {
  REQUIRE_GPU();
  CudnnAttention attn;
  StreamGuard st;
  const int64_t B = 2, L = 333, H = 2, HD = H * D;
  AttentionShape s{B, L, L, H, 128, 0, 0, 0, 0, true, true, AttnOutType::BF16};
  std::vector<uint16_t> q = to_bf16(randn(71, static_cast<size_t>(B * L * HD), 1.5f));
  std::vector<uint16_t> k = to_bf16(randn(72, q.size(), 1.0f)), v = to_bf16(randn(73, q.size(), 1.0f));
  DevBuf<uint16_t> dq(q.size()), dk(k.size()), dv(v.size()), o1(q.size()), o2(q.size());
  DevBuf<float> l1(static_cast<size_t>(B * H * L)), l2(static_cast<size_t>(B * H * L));
  DevBuf<int32_t> kl(2);
  dq.upload(q), dk.upload(k), dv.upload(v);
  kl.upload(std::vector<int32_t>{333, 200});
  o1.poison(), o2.poison();
  const size_t ws = attn.workspace_size(s);
  EXPECT_EQ(attn.plans_built(), 1u);
  DevBuf<uint8_t> dws(ws);
  AttentionArgs a{dq.p, dk.p, dv.p, o1.p, kl.p, l1.p, 0.0f};
  attn.run(s, a, dws.p, ws, st.s);
  a.o = o2.p, a.lse = l2.p;
  attn.run(s, a, dws.p, ws, st.s);
  CUDA_CHECK(cudaStreamSynchronize(st.s));
  EXPECT_EQ(attn.plans_built(), 1u) << "same shape must reuse the cached plan";
  EXPECT_EQ(attn.workspace_size(s), ws);
  EXPECT_EQ(o1.download(), o2.download()) << "two runs differ";
  EXPECT_EQ(l1.download(), l2.download()) << "two LSE runs differ";
  // a different shape is a new plan
  AttentionShape s2 = s;
  s2.lse = false;
  attn.prepare(s2);
  EXPECT_EQ(attn.plans_built(), 2u);
  // an explicit scale equal to the default gives the same bits
  a.scale = kAttnScale;
  a.o = o2.p;
  attn.run(s, a, dws.p, ws, st.s);
  CUDA_CHECK(cudaStreamSynchronize(st.s));
  EXPECT_EQ(o1.download(), o2.download());
}

TEST(GpuAttentionCudnn, BadArgumentsThrow) {
  REQUIRE_GPU();
  CudnnAttention attn;
  AttentionShape bad{1, 16, 16, 1, 64, 0, 0, 0, 0, false, false, AttnOutType::BF16};
  EXPECT_THROW(attn.prepare(bad), Error);  // head dim 64
  AttentionShape odd_ld{1, 16, 16, 1, 128, 130, 0, 0, 0, false, false, AttnOutType::BF16};
  EXPECT_THROW(attn.prepare(odd_ld), Error);  // token stride not a multiple of 8
  AttentionShape s{1, 16, 16, 1, 128, 0, 0, 0, 0, true, false, AttnOutType::BF16};
  DevBuf<uint16_t> buf(16 * 128);
  AttentionArgs a{buf.p, buf.p, buf.p, buf.p, nullptr, nullptr, 0.0f};
  const size_t ws = attn.workspace_size(s);
  DevBuf<uint8_t> dws(ws);
  EXPECT_THROW(attn.run(s, a, dws.p, ws, nullptr), Error);  // masked without k_lens
  if (ws > 0) {
    DevBuf<int32_t> kl(1);
    a.k_lens = kl.p;
    EXPECT_THROW(attn.run(s, a, dws.p, ws - 1, nullptr), Error);  // workspace too small
  }
}
