// GemmRunner's FP8 path (kernels/gemm.h, cuBLASLt outer-vector scaling) against ops::linear_fp8_ref on the
// same quantised operands, and against the fp32 GEMM of the unquantised operands at the DiT's shapes.
// Both accumulation modes (cuda::Fp8Accumulate) run every check. Tolerances, Fp32 accumulation:
// - vs linear_fp8_ref (exact sums, fp32 scaling), bf16 output: the precision rule of tests/gpu (error at
//   most twice that of the reference's result rounded to bf16, max-abs and relative L2): the GPU adds only
//   its fp32 accumulation order (far below a bf16 rounding) to the one rounding of the output; with the
//   separate epilogue the baseline is the two-rounding chain bf16(act(bf16(s·Σ) + bias)) that path has.
//   fp32 output: relative L2 <= 1e-3 (accumulation order only; one bf16 rounding is ~1.6e-3).
// - vs the fp32 GEMM of the unquantised bf16 operands: relative L2 <= 4.5e-2. The e4m3 rounding of i.i.d.
//   data has relative RMS error ~2.65% per operand (3 mantissa bits), so a product of two quantised
//   operands lands near √2·2.65% ≈ 3.75% whatever the scaling granularity (PyTorch's own float8 cast
//   gives 3.74% on these shapes); the 3e-2 of issue 25 is below that floor for random data.
//   The same output against the fp32 GEMM of the dequantised operands: relative L2 <= 3e-3.
// Fast accumulation (the engine's default) keeps fewer bits in the tensor cores' partial sums: against the
// exact sums its rel L2 must stay within kFastAccumRelL2 (fp32 or bf16 output) up to the DiT's largest K
// (13824: measured at most 2.9e-3 fp32 out, 3.75e-3 bf16 out, 3.3e-3 against the dequantised operands'
// GEMM, H200); the output against the unquantised operands keeps the 4.5e-2 bound.
// Outputs are poisoned before every run; inputs are Philox draws with fixed seeds. Skips without a device,
// and with a message on a GPU without FP8 outer-vector GEMMs (cuda::fp8_supported).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/check.h"
#include "kernels/dit_kernels.h"
#include "kernels/fp8_quant.h"
#include "kernels/gemm.h"
#include "kernels/rng.h"
#include "gpu_test_util.h"
#include "ops/cpu_ops.h"
#include "ops/fp8_ref.h"

using namespace wan;
using namespace wan::gpu_test;
using cuda::Act;

namespace {

int current_device() {
  int d = 0;
  CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

std::string device_desc() {
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, current_device()));
  return cat(p.name, " (sm_", p.major, p.minor, ")");
}

#define REQUIRE_FP8()                                                                                      \
  REQUIRE_GPU();                                                                                           \
  if (!cuda::fp8_supported(current_device()))                                                              \
  GTEST_SKIP() << "no FP8 outer-vector-scaled GEMM on " << device_desc() << " (needs sm_90, cuBLASLt 12.9+)"

__nv_bfloat16* bf(DevBuf<uint16_t>& b) { return reinterpret_cast<__nv_bfloat16*>(b.p); }

struct Shape {
  int64_t M, K, N;
};

// Host-quantised operands (ops::quantize_rows_fp8, bit-identical to the GPU quantiser) and their uploads.
struct Fp8Operands {
  std::vector<uint8_t> xq, wq;
  std::vector<float> sx, sw;
  DevBuf<uint8_t> dxq, dwq;
  DevBuf<float> dsx, dsw;
  Fp8Operands(const Shape& s, uint64_t seed)
      : xq(s.M * s.K), wq(s.N * s.K), sx(s.M), sw(s.N), dxq(s.M * s.K), dwq(s.N * s.K), dsx(s.M), dsw(s.N) {
    const auto xb = to_bf16(randn(seed, s.M * s.K, 1.0f)), wb = to_bf16(randn(seed + 1, s.N * s.K, 0.05f));
    ops::quantize_rows_fp8(xb.data(), s.M, s.K, xq.data(), sx.data());
    ops::quantize_rows_fp8(wb.data(), s.N, s.K, wq.data(), sw.data());
    dxq.upload(xq);
    dwq.upload(wq);
    dsx.upload(sx);
    dsw.upload(sw);
  }
};

constexpr double kFastAccumRelL2 = 6e-3;

const char* accumulate_name(cuda::Fp8Accumulate a) {
  return a == cuda::Fp8Accumulate::Fast ? "fast accumulation" : "fp32 accumulation";
}

std::vector<float> apply(std::vector<float> v, const std::vector<float>* bias, bool gelu, int64_t N) {
  if (bias)
    for (size_t i = 0; i < v.size(); ++i) v[i] += (*bias)[i % N];
  if (gelu) ops::gelu_tanh(v.data(), v.data(), static_cast<int64_t>(v.size()));
  return v;
}

}  // namespace

// Every (bias, activation, output dtype, epilogue mode) at small and odd shapes against linear_fp8_ref.
TEST(GpuGemmFp8, MatchesLinearFp8Ref) {
  REQUIRE_FP8();
  DevBuf<uint8_t> ws(cuda::GemmRunner::kWorkspaceBytes);
  cuda::GemmRunner runner(ws.p, ws.n);
  const Shape shapes[] = {{77, 256, 512}, {1, 256, 512}, {300, 5120, 256}, {4097, 256, 512}, {64, 13824, 128}};
  uint64_t seed = 0xF8E0;
  for (const Shape& s : shapes) {
    seed += 8;
    Fp8Operands op(s, seed);
    const auto bb = to_bf16(randn(seed + 2, s.N, 0.5f));
    const auto bfv = to_f32(bb);
    DevBuf<uint16_t> db(s.N), dy16(s.M * s.N);
    DevBuf<float> dy32(s.M * s.N);
    db.upload(bb);
    std::vector<float> lin(s.M * s.N);
    ops::linear_fp8_ref(op.xq.data(), op.sx.data(), op.wq.data(), op.sw.data(), nullptr, lin.data(), s.M, s.K, s.N,
                        false);
    for (bool bias : {false, true}) {
      for (Act act : {Act::None, Act::GeluTanh}) {
        const bool gelu = act == Act::GeluTanh;
        std::vector<float> ref(lin.size());
        ops::linear_fp8_ref(op.xq.data(), op.sx.data(), op.wq.data(), op.sw.data(), bias ? bfv.data() : nullptr,
                            ref.data(), s.M, s.K, s.N, gelu);
        const Err fused_base = error_vs(round_bf16(ref), ref);
        const Err split_base = error_vs(round_bf16(apply(round_bf16(lin), bias ? &bfv : nullptr, gelu, s.N)), ref);
        for (auto [acc, mode] : {std::pair{cuda::Fp8Accumulate::Fp32, cuda::Fp8Epilogue::Auto},
                                 std::pair{cuda::Fp8Accumulate::Fp32, cuda::Fp8Epilogue::Separate},
                                 std::pair{cuda::Fp8Accumulate::Fast, cuda::Fp8Epilogue::Auto}}) {
          runner.set_fp8_epilogue(mode);
          runner.set_fp8_accumulate(acc);
          const bool fast = acc == cuda::Fp8Accumulate::Fast;
          const std::string what = cat("M ", s.M, " K ", s.K, " N ", s.N, bias ? " bias" : "", gelu ? " gelu" : "",
                                       mode == cuda::Fp8Epilogue::Separate ? " (separate epilogue forced)" : "",
                                       ", ", accumulate_name(acc));
          const size_t separate0 = runner.fp8_separate_epilogues();
          dy16.poison();
          runner.linear_fp8(op.dxq.p, op.dsx.p, op.dwq.p, op.dsw.p, bias ? bf(db) : nullptr, bf(dy16), s.M, s.K, s.N,
                            act, nullptr);
          CUDA_CHECK(cudaDeviceSynchronize());
          const bool split = runner.fp8_separate_epilogues() > separate0;
          if (!bias && !gelu) EXPECT_FALSE(split) << what;  // nothing to apply afterwards
          if ((bias || gelu) && mode == cuda::Fp8Epilogue::Separate) EXPECT_TRUE(split) << what;
          const Err e16 = error_vs(to_f32(dy16.download()), ref);
          const Err& base = split ? split_base : fused_base;
          if (fast) {
            EXPECT_EQ(e16.nonfinite, 0u) << what << " -> bf16";
            EXPECT_LE(e16.rel_l2, kFastAccumRelL2) << what << " -> bf16";
          } else {
            expect_2x_bf16(e16, base, what + " -> bf16");
          }

          dy32.poison();
          runner.linear_fp8(op.dxq.p, op.dsx.p, op.dwq.p, op.dsw.p, bias ? bf(db) : nullptr, dy32.p, s.M, s.K, s.N,
                            act, nullptr);
          CUDA_CHECK(cudaDeviceSynchronize());
          const Err e32 = error_vs(dy32.download(), ref);
          EXPECT_EQ(e32.nonfinite, 0u) << what << " -> f32";
          if (fast) {
            EXPECT_LE(e32.rel_l2, kFastAccumRelL2) << what << " -> f32";
          } else {
            EXPECT_LE(e32.rel_l2, 1e-3) << what << " -> f32";
            EXPECT_LE(e32.max_abs, 2 * fused_base.max_abs + 1e-7) << what << " -> f32";
          }
          std::printf("%-78s %s epilogue  rel L2: bf16 out %.3g (baseline %.3g), f32 out %.3g\n", what.c_str(),
                      split ? "separate" : "fused   ", e16.rel_l2, base.rel_l2, e32.rel_l2);
        }
      }
    }
  }
  runner.set_fp8_epilogue(cuda::Fp8Epilogue::Auto);
  runner.set_fp8_accumulate(cuda::Fp8Accumulate::Fast);
}

// The DiT's GEMM shapes at M = 4096 (and an odd 4097): GPU-quantised bf16 operands through the FP8 GEMM,
// against the fp32 GEMM (no TF32) of the original operands and of the dequantised ones; a few rows also
// against linear_fp8_ref. The bf16 GEMM's error is printed for scale.
TEST(GpuGemmFp8, DitShapesVsFp32) {
  REQUIRE_FP8();
  DevBuf<uint8_t> ws(cuda::GemmRunner::kWorkspaceBytes);
  cuda::GemmRunner runner(ws.p, ws.n);
  StreamGuard st;
  const Shape shapes[] = {{4096, 5120, 5120}, {4096, 5120, 13824}, {4096, 13824, 5120}, {4096, 4096, 5120},
                          {4097, 5120, 5120}};
  uint64_t seed = 0xD170;
  for (const Shape& s : shapes) {
    DevBuf<uint16_t> x16(s.M * s.K), w16(s.N * s.K), y8(s.M * s.N), y16(s.M * s.N);
    DevBuf<float> x32(s.M * s.K), w32(s.N * s.K), y32(s.M * s.N), yd(s.M * s.N), sx(s.M), sw(s.N);
    DevBuf<uint8_t> xq(s.M * s.K), wq(s.N * s.K);
    cuda::philox_normal_fill_bf16(x16.p, x16.n, ++seed, 0, 1.0f, st.s);
    cuda::philox_normal_fill_bf16(w16.p, w16.n, ++seed, 0, 0.02f, st.s);
    cuda::quantize_rows_fp8(bf(x16), s.M, s.K, xq.p, sx.p, st.s);
    cuda::quantize_rows_fp8(bf(w16), s.N, s.K, wq.p, sw.p, st.s);
    runner.linear(bf(x16), bf(w16), static_cast<const __nv_bfloat16*>(nullptr), bf(y16), s.M, s.K, s.N, Act::None,
                  st.s);
    cuda::convert_bf16_to_f32(bf(x16), x32.p, s.M * s.K, st.s);
    cuda::convert_bf16_to_f32(bf(w16), w32.p, s.N * s.K, st.s);
    runner.linear(x32.p, w32.p, nullptr, y32.p, s.M, s.K, s.N, Act::None, st.s);
    cuda::dequantize_rows_fp8(xq.p, sx.p, s.M, s.K, x32.p, st.s);
    cuda::dequantize_rows_fp8(wq.p, sw.p, s.N, s.K, w32.p, st.s);
    runner.linear(x32.p, w32.p, nullptr, yd.p, s.M, s.K, s.N, Act::None, st.s);
    CUDA_CHECK(cudaStreamSynchronize(st.s));
    const std::vector<float> ref = y32.download(), same = yd.download();
    const Err bf16 = error_vs(to_f32(y16.download()), ref);
    const std::vector<uint8_t> hxq = xq.download(), hwq = wq.download();
    const std::vector<float> hsx = sx.download(), hsw = sw.download();
    for (cuda::Fp8Accumulate acc : {cuda::Fp8Accumulate::Fp32, cuda::Fp8Accumulate::Fast}) {
      const bool fast = acc == cuda::Fp8Accumulate::Fast;
      const std::string what = cat("M ", s.M, " K ", s.K, " N ", s.N, ", ", accumulate_name(acc));
      runner.set_fp8_accumulate(acc);
      y8.poison();
      runner.linear_fp8(xq.p, sx.p, wq.p, sw.p, nullptr, bf(y8), s.M, s.K, s.N, Act::None, st.s);
      CUDA_CHECK(cudaStreamSynchronize(st.s));
      const std::vector<float> out = to_f32(y8.download());
      const Err vs_orig = error_vs(out, ref), vs_same = error_vs(out, same);
      EXPECT_EQ(vs_orig.nonfinite, 0u) << what;
      EXPECT_LE(vs_orig.rel_l2, 4.5e-2) << what << ": fp8 vs fp32 of the unquantised operands";
      EXPECT_LE(vs_same.rel_l2, fast ? kFastAccumRelL2 : 3e-3) << what << ": fp8 vs fp32 of the dequantised operands";
      std::printf("%-46s rel L2 vs fp32: fp8 %.4f (vs dequantised operands %.2e), bf16 GEMM %.2e\n", what.c_str(),
                  vs_orig.rel_l2, vs_same.rel_l2, bf16.rel_l2);

      // Rows 0, M/2 and M-1 against the CPU reference on the very bytes the GPU quantiser wrote.
      const int64_t rows[] = {0, s.M / 2, s.M - 1};
      std::vector<uint8_t> xr;
      std::vector<float> sr, got;
      for (int64_t m : rows) {
        xr.insert(xr.end(), hxq.begin() + m * s.K, hxq.begin() + (m + 1) * s.K);
        sr.push_back(hsx[m]);
        got.insert(got.end(), out.begin() + m * s.N, out.begin() + (m + 1) * s.N);
      }
      std::vector<float> want(got.size());
      ops::linear_fp8_ref(xr.data(), sr.data(), hwq.data(), hsw.data(), nullptr, want.data(), 3, s.K, s.N, false);
      const Err rows_err = error_vs(got, want);
      if (fast) EXPECT_LE(rows_err.rel_l2, kFastAccumRelL2) << what << " rows 0, M/2, M-1";
      else expect_2x_bf16(rows_err, error_vs(round_bf16(want), want), what + " rows 0, M/2, M-1");
    }
  }
  runner.set_fp8_accumulate(cuda::Fp8Accumulate::Fast);
}

// FP8 plans are cached apart from the bf16 ones; a cached plan is deterministic; the forced separate
// epilogue is counted; cuBLASLt's FP8 restrictions are refused with an error before any launch.
TEST(GpuGemmFp8, PlanCacheDeterminismAndErrors) {
  REQUIRE_FP8();
  DevBuf<uint8_t> ws(cuda::GemmRunner::kWorkspaceBytes);
  cuda::GemmRunner runner(ws.p, ws.n);
  const Shape s{300, 512, 512};
  Fp8Operands op(s, 0xCAF8);
  DevBuf<uint16_t> db(s.N), dy(s.M * s.N), dx16(s.M * s.K), dw16(s.N * s.K);
  db.upload(to_bf16(randn(0xCAF9, s.N, 0.5f)));
  dx16.upload(to_bf16(randn(0xCAFA, s.M * s.K, 1.0f)));
  dw16.upload(to_bf16(randn(0xCAFB, s.N * s.K, 0.05f)));
  EXPECT_EQ(runner.plan_count(), 0u);
  runner.linear_fp8(op.dxq.p, op.dsx.p, op.dwq.p, op.dsw.p, bf(db), bf(dy), s.M, s.K, s.N, Act::GeluTanh, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto first = dy.download();
  const size_t plans = runner.plan_count();
  EXPECT_EQ(plans, 1u);  // the fused plan, or (refused) the plain one
  for (int rep = 0; rep < 3; ++rep) {
    dy.poison();
    runner.linear_fp8(op.dxq.p, op.dsx.p, op.dwq.p, op.dsw.p, bf(db), bf(dy), s.M, s.K, s.N, Act::GeluTanh, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(std::memcmp(first.data(), dy.download().data(), first.size() * 2), 0) << "rep " << rep;
  }
  EXPECT_EQ(runner.plan_count(), plans);
  runner.linear(bf(dx16), bf(dw16), bf(db), bf(dy), s.M, s.K, s.N, Act::GeluTanh, nullptr);  // bf16: its own plan
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(runner.plan_count(), plans + 1);
  // The other accumulation mode is a plan of its own; the default comes back to the cached one.
  EXPECT_EQ(runner.fp8_accumulate(), cuda::Fp8Accumulate::Fast);
  runner.set_fp8_accumulate(cuda::Fp8Accumulate::Fp32);
  runner.linear_fp8(op.dxq.p, op.dsx.p, op.dwq.p, op.dsw.p, bf(db), bf(dy), s.M, s.K, s.N, Act::GeluTanh, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(runner.plan_count(), plans + 2);
  runner.set_fp8_accumulate(cuda::Fp8Accumulate::Fast);
  dy.poison();
  runner.linear_fp8(op.dxq.p, op.dsx.p, op.dwq.p, op.dsw.p, bf(db), bf(dy), s.M, s.K, s.N, Act::GeluTanh, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(runner.plan_count(), plans + 2);
  EXPECT_EQ(std::memcmp(first.data(), dy.download().data(), first.size() * 2), 0) << "fast plan again";

  runner.set_fp8_epilogue(cuda::Fp8Epilogue::Separate);
  const size_t sep0 = runner.fp8_separate_epilogues();
  runner.linear_fp8(op.dxq.p, op.dsx.p, op.dwq.p, op.dsw.p, bf(db), bf(dy), s.M, s.K, s.N, Act::None, nullptr);
  runner.linear_fp8(op.dxq.p, op.dsx.p, op.dwq.p, op.dsw.p, nullptr, bf(dy), s.M, s.K, s.N, Act::None, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(runner.fp8_separate_epilogues(), sep0 + 1);  // the call without bias or GELU needs none

  auto fp8_call = [&](const uint8_t* xq, int64_t K, int64_t N, DType out) {
    runner.run_fp8(xq, op.dsx.p, op.dwq.p, op.dsw.p, nullptr, dy.p, 16, K, N, out, Act::None, nullptr);
  };
  EXPECT_THROW(fp8_call(op.dxq.p, 24, 256, DType::BF16), Error);      // K % 16
  EXPECT_THROW(fp8_call(op.dxq.p, 256, 260, DType::BF16), Error);     // bf16 rows of 520 bytes
  EXPECT_THROW(fp8_call(op.dxq.p + 1, 256, 256, DType::BF16), Error); // misaligned x
  EXPECT_THROW(fp8_call(op.dxq.p, 256, 256, DType::F8E4M3), Error);   // fp8 output
}

// fp8_supported is stable and false, never an exception, for devices that do not exist.
TEST(GpuGemmFp8, Fp8SupportedQuery) {
  REQUIRE_GPU();
  const bool a = cuda::fp8_supported(current_device()), b = cuda::fp8_supported(current_device());
  EXPECT_EQ(a, b);
  EXPECT_FALSE(cuda::fp8_supported(-1));
  EXPECT_FALSE(cuda::fp8_supported(cuda::device_count()));
  std::printf("fp8_supported(%d) = %d on %s\n", current_device(), a, device_desc().c_str());
}
