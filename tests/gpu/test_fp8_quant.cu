// The GPU row-wise e4m3 quantiser (kernels/fp8_quant.h) against the CPU reference (ops/fp8_ref.h), bit for
// bit: q bytes and scale bit patterns, bf16 and fp32 inputs, K odd / model-sized (5120, 13824) / above the
// register path (40000), rows up to 200001, a misaligned input, rows with a huge outlier, zeros, NaN, inf
// and magnitudes below the 2^-64 floor. Outputs are poisoned (0xFF bytes: a code the quantiser never
// writes, and a NaN scale of another bit pattern than its own) so every unwritten byte shows. The
// hardware conversion is checked against wan::f32_to_f8e4m3 on every fp32 value of magnitude <= 464
// (ties, e4m3 subnormals, fp32 subnormals and (448, 464] included). The LayerNorms that write a GEMM's
// FP8 input (dit_kernels.h Fp8Rows) equal their bf16 form followed by the quantiser, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/check.h"
#include "kernels/dit_kernels.h"
#include "kernels/fp8_quant.h"
#include "kernels/rng.h"
#include "gpu_test_util.h"
#include "ops/fp8_ref.h"

using namespace wan;
using namespace wan::gpu_test;

namespace {

struct Case {
  int64_t rows, K;
  bool specials;  // overwrite a few rows with zeros, NaN, inf, an outlier and tiny values
};

// Rows of N(0, 1) times a per-row magnitude over 20 decades; with `specials`, rows 0..4 become a zero row
// (with -0), a NaN row, an inf row, a row with a 1e6 outlier, and a row below the 2^-64 floor.
std::vector<float> make_input(uint64_t seed, const Case& c) {
  std::vector<float> x = randn(seed, c.rows * c.K, 1.0f);
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t k = 0; k < c.K; ++k) x[r * c.K + k] *= std::pow(10.0f, static_cast<float>(r % 21) - 10.0f);
  if (!c.specials || c.rows < 5) return x;
  for (int64_t k = 0; k < c.K; ++k) x[k] = (k % 3) ? 0.0f : -0.0f;
  x[1 * c.K + c.K / 2] = std::numeric_limits<float>::quiet_NaN();
  x[2 * c.K + c.K - 1] = std::numeric_limits<float>::infinity();
  x[3 * c.K] = 1e6f;
  for (int64_t k = 0; k < c.K; ++k) x[4 * c.K + k] = std::ldexp(x[4 * c.K + k], -80);
  return x;
}

// First differences between the GPU and the CPU results, as a message ("" when bit-identical).
std::string compare(const std::vector<uint8_t>& q, const std::vector<float>& s, const std::vector<uint8_t>& q_ref,
                    const std::vector<float>& s_ref, int64_t K) {
  std::string msg;
  int shown = 0;
  for (size_t i = 0; i < q.size() && shown < 5; ++i)
    if (q[i] != q_ref[i]) {
      msg += cat(" q[", i / K, ", ", i % K, "] ", int(q[i]), " vs ", int(q_ref[i]), ";");
      ++shown;
    }
  for (size_t r = 0; r < s.size() && shown < 10; ++r)
    if (f32_bits(s[r]) != f32_bits(s_ref[r])) {
      msg += cat(" scale[", r, "] ", s[r], " vs ", s_ref[r], ";");
      ++shown;
    }
  return msg;
}

// Quantises x on the GPU (as bf16 or fp32, at element offset `shift` into the device buffer, so a shift
// of 1 misaligns the rows) and on the CPU; expects identical bytes and scales.
void check_case(const Case& c, uint64_t seed, bool bf16, int64_t shift, cudaStream_t stream) {
  const std::string what = cat(bf16 ? "bf16" : "f32", " rows ", c.rows, " K ", c.K, shift ? " misaligned" : "",
                               c.specials ? " specials" : "");
  SCOPED_TRACE(what);
  const std::vector<float> xf = make_input(seed, c);
  const size_t n = xf.size();
  std::vector<uint8_t> q_ref(n);
  std::vector<float> s_ref(c.rows);
  DevBuf<uint8_t> dq(n);
  DevBuf<float> ds(c.rows);
  dq.poison();
  ds.poison();
  if (bf16) {
    std::vector<uint16_t> xb = to_bf16(xf);
    ops::quantize_rows_fp8(xb.data(), c.rows, c.K, q_ref.data(), s_ref.data());
    xb.insert(xb.begin(), static_cast<size_t>(shift), uint16_t{0});
    DevBuf<uint16_t> dx(xb.size());
    dx.upload(xb);
    cuda::quantize_rows_fp8(reinterpret_cast<const __nv_bfloat16*>(dx.p) + shift, c.rows, c.K, dq.p, ds.p, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
  } else {
    ops::quantize_rows_fp8(xf.data(), c.rows, c.K, q_ref.data(), s_ref.data());
    std::vector<float> xs = xf;
    xs.insert(xs.begin(), static_cast<size_t>(shift), 0.0f);
    DevBuf<float> dx(xs.size());
    dx.upload(xs);
    cuda::quantize_rows_fp8(dx.p + shift, c.rows, c.K, dq.p, ds.p, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  const std::vector<uint8_t> q = dq.download();
  const std::vector<float> s = ds.download();
  const std::string diff = compare(q, s, q_ref, s_ref, c.K);
  EXPECT_TRUE(diff.empty()) << what << ":" << diff;
}

}  // namespace

// Every fp32 pattern of magnitude <= 464 (0x43E80000), each also negated in the other lane of the pair.
TEST(GpuFp8Quant, ConversionEqualsReference) {
  REQUIRE_GPU();
  StreamGuard s;
  const uint32_t end = 0x43E80001u;
  const cuda::E4m3CvtCheck r = cuda::check_e4m3_conversion(0, end, s.s);
  EXPECT_EQ(r.checked, uint64_t{end});
  EXPECT_EQ(r.mismatches, 0u) << "first mismatch at bits 0x" << std::hex << r.first_mismatch << " ("
                              << bits_f32(r.first_mismatch) << "; f32_to_f8e4m3 gives 0x"
                              << int(f32_to_f8e4m3(bits_f32(r.first_mismatch))) << ")";
  int dev = 0, major = 0, minor = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  std::printf("e4m3 conversion (%s) checked on %llu patterns x 2 signs: %llu mismatches\n",
              major * 10 + minor >= 89 ? "cvt.rn.satfinite.e4m3x2.f32" : "f32_to_f8e4m3",
              static_cast<unsigned long long>(r.checked), static_cast<unsigned long long>(r.mismatches));
}

TEST(GpuFp8Quant, BitExactVsCpu) {
  REQUIRE_GPU();
  StreamGuard s;
  const Case cases[] = {{1, 1, false},     {3, 7, false},     {17, 67, true},   {9, 1000, true}, {5, 8, true},
                        {64, 5120, true},  {33, 13824, true}, {12, 4096, true}, {6, 40000, true}, {40, 24, true},
                        {7, 16400, false}, {2, 32768, false}};
  uint64_t seed = 0xF80;
  for (const Case& c : cases)
    for (bool bf16 : {true, false}) check_case(c, ++seed, bf16, 0, s.s);
  // Misaligned rows take the scalar kernel; it must agree as well.
  for (bool bf16 : {true, false}) check_case({11, 5120, true}, ++seed, bf16, 1, s.s);
}

// ~200k rows (grid size), K small, and one row whose outlier pushes the rest into the subnormal codes.
TEST(GpuFp8Quant, ManyRowsAndOutlier) {
  REQUIRE_GPU();
  StreamGuard s;
  check_case({200001, 40, true}, 0xF8B1, true, 0, s.s);
  check_case({3, 5120, false}, 0xF8B2, true, 0, s.s);
  const int64_t K = 5120;
  std::vector<float> x = randn(0xF8B3, K, 1.0f);
  x[1234] = -3e5f;
  std::vector<uint8_t> q_ref(K);
  float s_ref = 0;
  ops::quantize_rows_fp8(x.data(), 1, K, q_ref.data(), &s_ref);
  DevBuf<float> dx(K), ds(1);
  DevBuf<uint8_t> dq(K);
  dx.upload(x);
  dq.poison();
  ds.poison();
  cuda::quantize_rows_fp8(dx.p, 1, K, dq.p, ds.p, s.s);
  const auto q = dq.download();
  EXPECT_EQ(q, q_ref);
  EXPECT_EQ(f32_bits(ds.download()[0]), f32_bits(s_ref));
  EXPECT_EQ(q[1234], 0xFE);  // -448
  int zeros = 0;
  for (uint8_t b : q) zeros += (b & 0x7F) == 0;
  // scale = 3e5 / 448: |x| < 2^-10 · scale ≈ 0.65 rounds to a zero code, ~48% of a standard normal row.
  EXPECT_GT(zeros, K * 2 / 5) << "the outlier should flush much of the row to zero codes";
}

// The test dequantiser equals the CPU one bit for bit (NaN rows included).
TEST(GpuFp8Quant, DequantizeBitExact) {
  REQUIRE_GPU();
  StreamGuard s;
  const Case c{29, 333, true};
  const std::vector<float> x = make_input(0xF8C1, c);
  std::vector<uint8_t> q(x.size());
  std::vector<float> sc(c.rows), y_ref(x.size());
  ops::quantize_rows_fp8(x.data(), c.rows, c.K, q.data(), sc.data());
  ops::dequantize_rows_fp8(q.data(), sc.data(), c.rows, c.K, y_ref.data());
  DevBuf<uint8_t> dq(q.size());
  DevBuf<float> ds(sc.size()), dy(x.size());
  dq.upload(q);
  ds.upload(sc);
  dy.poison();
  cuda::dequantize_rows_fp8(dq.p, ds.p, c.rows, c.K, dy.p, s.s);
  // NaN rows compare as NaN: the device's NaN arithmetic returns the canonical NaN, the host keeps the
  // operand's payload, and neither is part of the scheme.
  const std::vector<float> y = dy.download();
  ASSERT_EQ(y.size(), y_ref.size());
  int64_t nans = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (std::isnan(y_ref[i])) {
      ++nans;
      EXPECT_TRUE(std::isnan(y[i])) << i;
    } else {
      ASSERT_EQ(f32_bits(y[i]), f32_bits(y_ref[i])) << i;
    }
  }
  EXPECT_GT(nans, 0) << "the input has a non-finite row";
}

TEST(GpuFp8Quant, BadArgumentsThrow) {
  REQUIRE_GPU();
  DevBuf<float> dx(16), ds(2);
  DevBuf<uint8_t> dq(16);
  EXPECT_THROW(cuda::quantize_rows_fp8(dx.p, 2, 0, dq.p, ds.p, nullptr), Error);
  EXPECT_THROW(cuda::quantize_rows_fp8(dx.p, -1, 8, dq.p, ds.p, nullptr), Error);
  EXPECT_THROW(cuda::quantize_rows_fp8(static_cast<const float*>(nullptr), 2, 8, dq.p, ds.p, nullptr), Error);
  EXPECT_NO_THROW(cuda::quantize_rows_fp8(dx.p, 0, 8, dq.p, ds.p, nullptr));  // no rows: nothing to do
}

// norm1 / norm3 / norm2 of the FP8 forward: the LayerNorm kernels' Fp8Rows forms against their bf16 forms
// followed by quantize_rows_fp8 (bytes, scale bits and the updated residual), with a NaN row and a row
// of large values among random ones, per-sample modulation, every form (plain, gated-add, affine-add).
TEST(GpuFp8Quant, LayerNormsQuantiseAsTheQuantiserDoes) {
  REQUIRE_GPU();
  uint64_t seed = 0xF8A0;
  for (int64_t D : {5120, 256, 24}) {
    const int64_t B = 3, S = 37, rows = B * S;
    std::vector<float> x = randn(++seed, rows * D, 2.0f, 0.5f);
    for (int64_t i = 0; i < D; ++i) x[5 * D + i] *= 1e15f;  // large row (its statistics stay finite)
    x[7 * D + D / 2] = std::numeric_limits<float>::quiet_NaN();  // one non-finite row
    const std::vector<uint16_t> a = to_bf16(randn(++seed, rows * D, 1.0f));
    const std::vector<float> mod = randn(++seed, 6 * D, 0.05f), e0 = randn(++seed, B * 6 * D, 0.5f);
    const std::vector<float> w = randn(++seed, D, 0.1f, 1.0f), b = randn(++seed, D, 0.1f);
    DevBuf<float> dmod(mod.size()), de0(e0.size()), dw(D), db(D);
    DevBuf<uint16_t> da(a.size());
    dmod.upload(mod), de0.upload(e0), dw.upload(w), db.upload(b), da.upload(a);
    auto mv = [&](int k) { return cuda::ModVec{dmod.p + k * D, de0.p + k * D, 6 * D, S}; };
    const cuda::ModVec gate = mv(2), shift = mv(3), scale = mv(4);
    auto* ab = reinterpret_cast<const cuda::bf16*>(da.p);
    for (int form = 0; form < 4; ++form) {  // modulate, add + modulate, gated add + modulate, gated add + affine
      const std::string what = cat("D ", D, ", form ", form);
      DevBuf<float> x1(x.size()), x2(x.size()), s1(rows), s2(rows);
      DevBuf<uint16_t> y2(rows * D);
      DevBuf<uint8_t> q1(rows * D), q2(rows * D);
      x1.upload(x), x2.upload(x);
      q1.poison(), q2.poison(), s1.poison(), s2.poison();
      auto* yb = reinterpret_cast<cuda::bf16*>(y2.p);
      const cuda::Fp8Rows out{q1.p, s1.p};
      const cuda::ModVec* g = form >= 2 ? &gate : nullptr;
      if (form == 0) {
        cuda::layernorm_modulate(x1.p, out, rows, D, shift, scale, 1e-6f, nullptr);
        cuda::layernorm_modulate(x2.p, yb, rows, D, shift, scale, 1e-6f, nullptr);
      } else if (form < 3) {
        cuda::residual_add_layernorm_modulate(x1.p, ab, g, out, rows, D, shift, scale, 1e-6f, nullptr);
        cuda::residual_add_layernorm_modulate(x2.p, ab, g, yb, rows, D, shift, scale, 1e-6f, nullptr);
      } else {
        cuda::residual_add_layernorm_affine(x1.p, ab, g, dw.p, db.p, out, rows, D, 1e-6f, nullptr);
        cuda::residual_add_layernorm_affine(x2.p, ab, g, dw.p, db.p, yb, rows, D, 1e-6f, nullptr);
      }
      cuda::quantize_rows_fp8(yb, rows, D, q2.p, s2.p, nullptr);
      const auto gq = q1.download(), wq = q2.download();
      const auto gs = s1.download(), ws = s2.download();
      const auto gx = x1.download(), wx = x2.download();
      int64_t bad = 0;
      for (size_t i = 0; i < gq.size(); ++i) bad += gq[i] != wq[i];
      EXPECT_EQ(bad, 0) << what << ": e4m3 bytes";
      EXPECT_EQ(std::memcmp(gs.data(), ws.data(), gs.size() * 4), 0) << what << ": row scales";
      EXPECT_EQ(std::memcmp(gx.data(), wx.data(), gx.size() * 4), 0) << what << ": residual";
      EXPECT_TRUE(std::isnan(gs[7])) << what << ": the NaN row is marked";
      int64_t finite = 0;
      for (float v : gs) finite += std::isfinite(v) && v > 0;
      EXPECT_EQ(finite, rows - 1) << what;
    }
  }
  DevBuf<float> x(2 * 256);
  DevBuf<uint8_t> q(2 * 256);
  EXPECT_THROW(cuda::layernorm_modulate(x.p, cuda::Fp8Rows{q.p, nullptr}, 2, 256, cuda::ModVec{}, cuda::ModVec{},
                                        1e-6f, nullptr),
               Error);
}
