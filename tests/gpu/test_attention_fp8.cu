// The engine's own FP8 attention (kernels/attention_fp8.h) against the fp32 reference (ops::attention, the
// exact maths) and against the CPU emulation of the same quantised scheme (ops::attention_fp8_ref):
//   - fresh random bf16 inputs (Philox), poisoned output and LSE buffers: every output element and LSE
//     written, the token-stride gap of O untouched;
//   - against the emulation (small cases, every row): the kernel adds nothing beyond the scheme: its error
//     vs fp32 within 1.1x the emulation's + 1e-3, and the two within 1e-2 relative L2 of each other
//     (fp32 tensor-core accumulation order and ex2.approx move a few e4m3 roundings of P);
//   - relative L2 vs fp32 <= 7e-2 on the sampled-row cases (the engine's lengths); the small cases include keys with
//     a large common offset (what K smoothing is for) and masked keys filled with large junk. On N(0, 1)
//     inputs the scheme itself sits at ~5e-2 (the emulation: Q, K, V and P each add ~2.5e-2, e4m3's
//     3-bit mantissa on data without coherent structure), above the issue's 2.5e-2; see the notes;
//   - the LSE (natural log, with the K-smoothing correction) vs the double-precision exact one.
// Lengths are odd on purpose; K/V as views of a fused QKV buffer as the engine writes them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "attention_test_ref.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/attention_fp8.h"
#include "kernels/attention_own.h"
#include "kernels/check.h"
#include "kernels/rng.h"
#include "gpu_test_util.h"
#include "ops/fp8_attention_ref.h"

using namespace wan;
using namespace wan::gpu_test;
using cuda::AttentionArgs;
using cuda::AttentionShape;
using cuda::OwnAttentionFp8;

#define REQUIRE_FP8_ATTN()                                                              \
  REQUIRE_GPU();                                                                        \
  if (!OwnAttentionFp8::supported()) GTEST_SKIP() << "FP8 attention needs an sm_90 GPU"

namespace {

constexpr int64_t D = kAttnD;

struct Case {
  const char* name;
  int64_t B, Lq, Lk, H;
  std::vector<int64_t> klens;  // empty: unmasked
  bool fused_qkv = false;
  int64_t o_pad = 0;
  float q_std = 1.0f;
  uint64_t seed = 1;
  int64_t sample_rows = 0;  // 0: every row (and the emulation); else this many rows vs fp32 only
  float k_shift = 0.0f;     // added (with a per-dim ramp) to every key: the case K smoothing handles
};

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) { return error_vs(a, ref).rel_l2; }

void run_case(const Case& c, cudaStream_t stream) {
  const int64_t B = c.B, Lq = c.Lq, Lk = c.Lk, H = c.H, HD = H * D;
  const bool masked = !c.klens.empty();
  const int64_t ld = c.fused_qkv ? 3 * HD : HD;
  ASSERT_TRUE(!c.fused_qkv || Lq == Lk);
  // Host tensors in their device layouts: one fused buffer, or q / kv separately.
  std::vector<uint16_t> qbuf = to_bf16(randn(c.seed, static_cast<size_t>(B * Lq * ld), c.q_std));
  std::vector<uint16_t> kvbuf;
  if (!c.fused_qkv) kvbuf = to_bf16(randn(c.seed + 1000, static_cast<size_t>(2 * B * Lk * HD), 1.0f));
  auto qat = [&](int64_t b, int64_t i, int64_t e) -> uint16_t& { return qbuf[static_cast<size_t>((b * Lq + i) * ld + e)]; };
  auto kat = [&](int64_t b, int64_t j, int64_t e) -> uint16_t& {
    return c.fused_qkv ? qbuf[static_cast<size_t>((b * Lk + j) * ld + HD + e)] : kvbuf[static_cast<size_t>((b * Lk + j) * HD + e)];
  };
  auto vat = [&](int64_t b, int64_t j, int64_t e) -> uint16_t& {
    return c.fused_qkv ? qbuf[static_cast<size_t>((b * Lk + j) * ld + 2 * HD + e)]
                       : kvbuf[static_cast<size_t>(((B + b) * Lk + j) * HD + e)];
  };
  if (c.fused_qkv && c.q_std != 1.0f)  // keys and values stay N(0, 1)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < Lk; ++j)
        for (int64_t e = 0; e < HD; ++e) {
          kat(b, j, e) = f32_to_bf16(bf16_to_f32(kat(b, j, e)) / c.q_std);
          vat(b, j, e) = f32_to_bf16(bf16_to_f32(vat(b, j, e)) / c.q_std);
        }
  if (c.k_shift != 0.0f)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < Lk; ++j)
        for (int64_t e = 0; e < HD; ++e)
          kat(b, j, e) = f32_to_bf16(bf16_to_f32(kat(b, j, e)) + c.k_shift * (1.0f + static_cast<float>(e % D) / D));
  if (masked) {
    const std::vector<uint16_t> junk = to_bf16(randn(c.seed + 3000, static_cast<size_t>(2 * Lk * HD), 20.0f, 40.0f));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = c.klens[b]; j < Lk; ++j)
        for (int64_t e = 0; e < HD; ++e) {
          kat(b, j, e) = junk[static_cast<size_t>(j * HD + e)];
          vat(b, j, e) = junk[static_cast<size_t>((Lk + j) * HD + e)];
        }
  }
  DevBuf<uint16_t> dq(qbuf.size()), dkv(std::max<size_t>(kvbuf.size(), 1));
  dq.upload(qbuf);
  if (!kvbuf.empty()) dkv.upload(kvbuf);
  const int64_t o_ld = HD + c.o_pad;
  DevBuf<int32_t> dkl(static_cast<size_t>(B));
  if (masked) dkl.upload(std::vector<int32_t>(c.klens.begin(), c.klens.end()));
  AttentionShape s;
  s.B = B, s.Lq = Lq, s.Lk = Lk, s.H = H;
  s.q_ld = s.k_ld = s.v_ld = c.fused_qkv ? ld : 0;
  s.o_ld = c.o_pad ? o_ld : 0;
  s.masked = masked;
  s.lse = true;
  DevBuf<uint16_t> dout(static_cast<size_t>(B * Lq * o_ld));
  DevBuf<float> dlse(static_cast<size_t>(B * H * Lq));
  DevBuf<uint8_t> dws(OwnAttentionFp8::workspace_size(s));
  dout.poison();
  dlse.poison();
  dws.poison();
  CUDA_CHECK(cudaDeviceSynchronize());
  AttentionArgs a;
  a.q = dq.p;
  a.k = c.fused_qkv ? dq.p + HD : dkv.p;
  a.v = c.fused_qkv ? dq.p + 2 * HD : dkv.p + B * Lk * HD;
  a.o = dout.p;
  a.k_lens = masked ? dkl.p : nullptr;
  a.lse = dlse.p;
  OwnAttentionFp8::run(s, a, dws.p, dws.n, stream);
  sync_or_die(stream, std::string("attention_fp8 case \"") + c.name + "\"");
  CUDA_CHECK(cudaGetLastError());
  const std::vector<uint16_t> o = dout.download();
  const std::vector<float> lse = dlse.download();

  size_t unwritten = 0, gap = 0, lse_bad = 0;
  for (int64_t t = 0; t < B * Lq; ++t) {
    for (int64_t e = 0; e < HD; ++e) unwritten += !std::isfinite(bf16_to_f32(o[static_cast<size_t>(t * o_ld + e)]));
    for (int64_t e = HD; e < o_ld; ++e) gap += o[static_cast<size_t>(t * o_ld + e)] != 0xFFFF;
  }
  for (float x : lse) lse_bad += !std::isfinite(x);
  EXPECT_EQ(unwritten, 0u) << c.name << ": output elements not written";
  EXPECT_EQ(gap, 0u) << c.name << ": output stride gap written";
  EXPECT_EQ(lse_bad, 0u) << c.name << ": lse elements not written";

  const std::vector<int64_t> rows = checked_rows(Lq, c.sample_rows, c.seed);
  const AttentionRef cref = attention_reference(qat, kat, vat, B, Lk, H, rows, c.klens);
  const int64_t R = cref.R;
  std::vector<float> got(static_cast<size_t>(B * R * HD));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < R; ++i)
      for (int64_t e = 0; e < HD; ++e)
        got[static_cast<size_t>((b * R + i) * HD + e)] = bf16_to_f32(o[static_cast<size_t>((b * Lq + rows[i]) * o_ld + e)]);
  const double err = rel_l2(got, cref.fp32);
  double lse_err = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < R; ++i) {
        const double g = lse[static_cast<size_t>((b * H + h) * Lq + rows[i])];
        const double want = cref.lse[static_cast<size_t>((b * H + h) * R + i)];
        lse_err = std::max(lse_err, std::fabs(g - want) / std::max(1.0, std::fabs(want)));
      }
  double emu_err = -1, own_vs_emu = -1, lse_vs_emu = -1;
  if (c.sample_rows == 0) {  // every row: the emulation of the same scheme on the same inputs
    std::vector<float> q32(static_cast<size_t>(B * Lq * HD)), k32(static_cast<size_t>(B * Lk * HD)), v32(k32.size());
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < Lq; ++i)
        for (int64_t e = 0; e < HD; ++e) q32[static_cast<size_t>((b * Lq + i) * HD + e)] = bf16_to_f32(qat(b, i, e));
      for (int64_t j = 0; j < Lk; ++j)
        for (int64_t e = 0; e < HD; ++e) {
          k32[static_cast<size_t>((b * Lk + j) * HD + e)] = bf16_to_f32(kat(b, j, e));
          v32[static_cast<size_t>((b * Lk + j) * HD + e)] = bf16_to_f32(vat(b, j, e));
        }
    }
    std::vector<float> eo(q32.size()), lse_e(static_cast<size_t>(B * H * Lq));
    ops::Fp8AttentionRefOptions ropt;
    ropt.lazy_rescale = cuda::fp8_attention_lazy_rescale();
    ropt.l_of_rounded_p = true;
    ops::attention_fp8_ref(q32.data(), k32.data(), v32.data(), eo.data(), lse_e.data(), B, Lq, Lk, H, D,
                           masked ? c.klens.data() : nullptr, kAttnScale, ropt);
    // rows == every row here, in order: got and cref.fp32 are [B, Lq, HD]
    emu_err = rel_l2(round_bf16(eo), cref.fp32);
    own_vs_emu = rel_l2(got, round_bf16(eo));
    lse_vs_emu = 0;
    for (size_t i = 0; i < lse_e.size(); ++i)
      lse_vs_emu = std::max(lse_vs_emu, std::fabs(static_cast<double>(lse[i]) - lse_e[i]) / std::max(1.0, std::fabs(static_cast<double>(lse_e[i]))));
  }
  std::printf("[attn-fp8] %-30s B=%lld Lq=%lld Lk=%lld H=%lld rows=%lld | rel L2 vs fp32 %.3e (emulation %.3e) | "
              "vs emulation %.3e | lse vs exact %.2e, vs emulation %.2e\n",
              c.name, (long long)B, (long long)Lq, (long long)Lk, (long long)H, (long long)R, err, emu_err, own_vs_emu,
              lse_err, lse_vs_emu);
  // Emulated cases are held to the emulation (below; the peaky q_std 3 case sits at ~8e-2, scheme and
  // kernel alike); sampled-row cases to the scheme's floor on N(0, 1) inputs.
  if (c.sample_rows != 0) EXPECT_LE(err, 7e-2) << c.name << ": relative L2 vs fp32";
  EXPECT_LE(lse_err, 5e-2) << c.name << ": lse vs exact";
  if (c.sample_rows == 0) {
    EXPECT_LE(err, 1.1 * emu_err + 1e-3) << c.name << ": the kernel adds error beyond the scheme";
    EXPECT_LE(own_vs_emu, 1e-2) << c.name << ": kernel vs emulation";
    // The kernel's row sums come from the FP8 tensor cores, whose accumulation drops the low bits of the
    // smallest P in a tile; the emulation sums them exactly (up to 3.15e-3 here on 2026-11-28, "keys
    // offset +30 masked"; the LSE against exact maths is held to its bound above).
    EXPECT_LE(lse_vs_emu, 5e-3) << c.name << ": lse vs emulation";
  }
}

}  // namespace

TEST(GpuAttentionFp8, SmallOddLengthsEveryRow) {
  REQUIRE_FP8_ATTN();
  StreamGuard st;
  const std::vector<Case> cases = {
      {"L=1", 1, 1, 1, 2, {}, false, 0, 1.0f, 11},
      {"L=127", 2, 127, 127, 3, {}, false, 0, 1.0f, 12},
      {"L=129 fused qkv", 2, 129, 129, 2, {}, true, 0, 1.0f, 14},
      {"L=1000 fused peaky", 1, 1000, 1000, 2, {}, true, 0, 3.0f, 15},
      {"Lq=300 Lk=257 o_pad", 2, 300, 257, 3, {}, false, 8, 1.0f, 16},
      {"masked 512 (77, 512)", 2, 200, 512, 2, {77, 512}, false, 0, 1.0f, 17},
      {"masked 512 (1, 129)", 2, 130, 512, 2, {1, 129}, false, 0, 2.0f, 18},
      {"keys offset +8", 1, 260, 700, 2, {}, false, 0, 1.0f, 19, 0, 8.0f},
      {"keys offset +30 masked", 2, 140, 300, 2, {150, 300}, false, 0, 1.0f, 20, 0, 30.0f},
  };
  // Every kernel variant (attention_fp8.cu's switches): eager rescaling, exponentials partly on the FMA
  // pipe, a deeper K/V ring.
  struct Variant {
    const char *name, *poly, *stages, *lazy;
  };
  for (const Variant& v : {Variant{"default (lazy)", "0", "2", "1"}, Variant{"poly 2", "2", "2", "1"},
                           Variant{"poly 4", "4", "2", "1"}, Variant{"stages 3", "0", "3", "1"},
                           Variant{"eager", "0", "2", "0"}, Variant{"eager poly 4", "4", "2", "0"}}) {
    std::printf("variant: %s\n", v.name);
    setenv("WAN_ATTN_FP8_POLY", v.poly, 1);
    setenv("WAN_ATTN_FP8_STAGES", v.stages, 1);
    setenv("WAN_ATTN_FP8_LAZY", v.lazy, 1);
    for (const Case& c : cases) run_case(c, st.s);
  }
  unsetenv("WAN_ATTN_FP8_POLY");
  unsetenv("WAN_ATTN_FP8_STAGES");
  unsetenv("WAN_ATTN_FP8_LAZY");
}

TEST(GpuAttentionFp8, EngineShapesSampledRows) {
  REQUIRE_FP8_ATTN();
  StreamGuard st;
  const std::vector<Case> cases = {
      {"self 32761 fused (480p+1)", 1, 32761, 32761, 40, {}, true, 0, 1.0f, 21, 12},
      {"cross 9001 x 512 masked", 2, 9001, 512, 40, {300, 512}, false, 0, 1.0f, 22, 24},
      {"self 75600 fused (720p)", 1, 75600, 75600, 8, {}, true, 0, 1.0f, 23, 8},
  };
  for (const Case& c : cases) run_case(c, st.s);
}

TEST(GpuAttentionFp8, BadInputIsRefused) {
  AttentionShape s;
  s.B = 1, s.Lq = 4, s.Lk = 4, s.H = 1;
  s.D = 64;
  EXPECT_THROW(OwnAttentionFp8::validate(s), Error);
  s.D = 128;
  s.out = cuda::AttnOutType::F32;
  EXPECT_THROW(OwnAttentionFp8::validate(s), Error);
  s.out = cuda::AttnOutType::BF16;
  s.q_ld = 100;
  EXPECT_THROW(OwnAttentionFp8::validate(s), Error);
  s.q_ld = 0;
  EXPECT_NO_THROW(OwnAttentionFp8::validate(s));
  if (cuda::device_count() == 0 || !OwnAttentionFp8::supported()) return;
  DevBuf<uint16_t> buf(4 * 128 * 3);
  AttentionArgs a;
  a.q = buf.p, a.k = buf.p + 512, a.v = buf.p + 1024, a.o = buf.p;
  DevBuf<uint8_t> ws(16);
  EXPECT_THROW(OwnAttentionFp8::run(s, a, ws.p, ws.n, nullptr), Error);  // workspace too small
}

// Fp8KV::Reuse (the chunked forward's query chunks): one sample's queries in two chunks at a 128-row
// boundary, the second quantising Q alone after the bf16 K/V were overwritten with junk, give the rows
// and LSEs of one call over every query bit for bit; the same second call with Fp8KV::Quantize reads the
// junk and differs (so the reuse is what the equality shows).
TEST(GpuAttentionFp8, ReusedKvQuantisationEqualsOneCall) {
  REQUIRE_FP8_ATTN();
  StreamGuard st;
  constexpr int64_t H = 3, Lq = 300, Lk = 333, HD = H * D, split = 128;
  DevBuf<uint16_t> dq(Lq * HD), dkv(2 * Lk * HD), dout(Lq * HD), dchunk(Lq * HD);
  DevBuf<float> dlse(H * Lq), dlse_a(H * split), dlse_b(H * (Lq - split));
  dq.upload(to_bf16(randn(0x5EED1, static_cast<size_t>(Lq * HD), 1.0f)));
  dkv.upload(to_bf16(randn(0x5EED2, static_cast<size_t>(2 * Lk * HD), 1.0f)));
  auto shape = [&](int64_t lq) {
    AttentionShape s;
    s.B = 1, s.Lq = lq, s.Lk = Lk, s.H = H;
    s.lse = true;
    return s;
  };
  DevBuf<uint8_t> dws(OwnAttentionFp8::workspace_size(shape(Lq)));
  auto run = [&](int64_t row0, int64_t lq, uint16_t* o, float* lse, cuda::Fp8KV kv) {
    AttentionArgs a;
    a.q = dq.p + row0 * HD, a.k = dkv.p, a.v = dkv.p + Lk * HD, a.o = o, a.lse = lse;
    OwnAttentionFp8::run(shape(lq), a, dws.p, dws.n, st.s, kv);
  };
  dout.poison(), dchunk.poison(), dlse.poison(), dlse_a.poison(), dlse_b.poison(), dws.poison();
  run(0, Lq, dout.p, dlse.p, cuda::Fp8KV::Quantize);
  run(0, split, dchunk.p, dlse_a.p, cuda::Fp8KV::Quantize);
  dkv.upload(to_bf16(randn(0x5EED3, static_cast<size_t>(2 * Lk * HD), 5.0f, 3.0f)));  // junk K/V
  run(split, Lq - split, dchunk.p + split * HD, dlse_b.p, cuda::Fp8KV::Reuse);
  sync_or_die(st.s, "attention_fp8 Fp8KV::Reuse");
  const std::vector<uint16_t> full = dout.download(), chunks = dchunk.download();
  const std::vector<float> lse = dlse.download(), lse_a = dlse_a.download(), lse_b = dlse_b.download();
  EXPECT_EQ(full, chunks) << "chunked rows differ from one call";
  size_t lse_diff = 0;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < Lq; ++i) {
      const float got = i < split ? lse_a[h * split + i] : lse_b[h * (Lq - split) + i - split];
      lse_diff += std::memcmp(&got, &lse[h * Lq + i], sizeof(float)) != 0;
    }
  EXPECT_EQ(lse_diff, 0u) << "chunked LSEs differ from one call";
  run(split, Lq - split, dchunk.p + split * HD, dlse_b.p, cuda::Fp8KV::Quantize);  // the junk K/V this time
  sync_or_die(st.s, "attention_fp8 junk K/V");
  EXPECT_NE(full, dchunk.download()) << "the junk K/V should change the second chunk";
}

// B = 2, H = 40, D = 128 at the engine's self-attention lengths: FP8 (quantisation passes and kernel, and
// the kernel alone) vs the exact bf16 kernel, median of 5 after a warm-up. Prints TFLOP/s (4·B·H·L²·D).
TEST(GpuAttentionFp8, TimingEngineShapes) {
  REQUIRE_FP8_ATTN();
  StreamGuard st;
  for (const int64_t L : {int64_t{75600}, int64_t{32760}}) {
    const int64_t B = 2, H = 40, HD = H * D, ld = 3 * HD;
    DevBuf<uint16_t> qkv(static_cast<size_t>(B * L * ld)), o(static_cast<size_t>(B * L * HD));
    cuda::philox_normal_fill_bf16(qkv.p, qkv.n, 0x61, 0, 1.0f, nullptr);
    AttentionShape s;
    s.B = B, s.Lq = L, s.Lk = L, s.H = H;
    s.q_ld = s.k_ld = s.v_ld = ld;
    AttentionArgs a;
    a.q = qkv.p, a.k = qkv.p + HD, a.v = qkv.p + 2 * HD, a.o = o.p;
    DevBuf<uint8_t> ws(OwnAttentionFp8::workspace_size(s));
    const cuda::Fp8AttentionLayout lay = cuda::fp8_attention_layout(s);
    auto median_ms = [&](auto&& fn) {
      cudaEvent_t e0, e1;
      CUDA_CHECK(cudaEventCreate(&e0));
      CUDA_CHECK(cudaEventCreate(&e1));
      std::vector<float> v;
      for (int r = 0; r < 6; ++r) {
        CUDA_CHECK(cudaEventRecord(e0, st.s));
        fn();
        CUDA_CHECK(cudaEventRecord(e1, st.s));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float x = 0;
        CUDA_CHECK(cudaEventElapsedTime(&x, e0, e1));
        if (r > 0) v.push_back(x);
      }
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      std::sort(v.begin(), v.end());
      return static_cast<double>(v[v.size() / 2]);
    };
    const double bf16 = median_ms([&] { cuda::OwnAttention::run(s, a, st.s); });
    const double fp8 = median_ms([&] { OwnAttentionFp8::run(s, a, ws.p, ws.n, st.s); });
    const double quant = median_ms([&] { cuda::fp8_attention_quantize(s, a, lay, ws.p, st.s); });
    const double flops = 4.0 * B * H * L * L * D;
    std::printf("[attn-fp8-timing] L=%lld B=2 H=40: bf16 own %.3f ms (%.0f TF/s) | fp8 %.3f ms (%.0f TF/s) of which "
                "quantisation %.3f ms; kernel alone %.0f TF/s | fp8/bf16 time %.3f\n",
                (long long)L, bf16, flops / (bf16 * 1e9), fp8, flops / (fp8 * 1e9), quant,
                flops / ((fp8 - quant) * 1e9), fp8 / bf16);
    const std::vector<uint16_t> h = o.download();
    size_t bad = 0;
    for (size_t i = 0; i < h.size(); i += 97) bad += !std::isfinite(bf16_to_f32(h[i]));
    EXPECT_EQ(bad, 0u) << L;
  }
}
