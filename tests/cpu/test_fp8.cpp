// The FP8 CPU reference (ops/fp8_ref.h, scheme core/fp8_rows.h): bit-exact against PyTorch's float8_e4m3fn
// cast (tests/fixtures/fp8, tools/make_fp8_fixtures.py); the round-trip bound; the amax element at ±448;
// zero, tiny and non-finite rows; ties to even; the bf16 overload; and linear_fp8_ref against the fp32
// Linear of the dequantised operands. Inputs are fresh Philox draws with fixed seeds.
//
// Round-trip bound used (e4m3 has 3 mantissa bits, so round-to-nearest moves a normal value by at most
// 2^-4 of itself; inv, the product, scale and the dequantising product add four fp32 roundings, < 2^-21):
//   |deq - x| <= 2^-4·|x| + 2^-21·|x|              where |x·inv| >= 2^-6 (e4m3 normals),
//   |deq - x| <= 2^-10·scale·(1 + 2^-20) + 2^-21·|x|  below (half the subnormal step 2^-9, times scale).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/philox.h"
#include "formats/safetensors.h"
#include "ops/cpu_ops.h"
#include "ops/fp8_ref.h"

using namespace wan;

namespace {

std::vector<float> randn(uint64_t seed, size_t n, float scale) {
  std::vector<float> v(n);
  philox_normal_fill(seed, 0, v.data(), n);
  for (float& x : v) x *= scale;
  return v;
}

uint32_t bits(float f) { return f32_bits(f); }

struct Quantized {
  std::vector<uint8_t> q;
  std::vector<float> scale;
};
Quantized quantize(const std::vector<float>& x, int64_t rows, int64_t K) {
  Quantized r{std::vector<uint8_t>(x.size()), std::vector<float>(rows)};
  ops::quantize_rows_fp8(x.data(), rows, K, r.q.data(), r.scale.data());
  return r;
}

}  // namespace

// Every case of the torch fixture, bit for bit: q bytes and scale bit patterns.
TEST(Fp8Ref, MatchesTorchFixture) {
  const auto f = SafetensorsFile::open(std::string(WAN_FIXTURES) + "/fp8/quant.safetensors");
  int cases = 0;
  for (const char* name : {"gauss", "bf16", "ties", "subnormal", "outlier", "tiny"}) {
    SCOPED_TRACE(name);
    const Tensor x = f->get(cat(name, ".x")), q = f->get(cat(name, ".q")), s = f->get(cat(name, ".scale"));
    ASSERT_EQ(x.ndim(), 2);
    const int64_t rows = x.dim(0), K = x.dim(1);
    ASSERT_EQ(q.dtype(), DType::U8);
    ASSERT_EQ(q.numel(), rows * K);
    ASSERT_EQ(s.numel(), rows);
    std::vector<uint8_t> got(rows * K, 0xAA);
    std::vector<float> scale(rows, -1.0f);
    if (x.dtype() == DType::BF16)
      ops::quantize_rows_fp8(static_cast<const uint16_t*>(x.data()), rows, K, got.data(), scale.data());
    else
      ops::quantize_rows_fp8(x.f32(), rows, K, got.data(), scale.data());
    const auto* want = static_cast<const uint8_t*>(q.data());
    int bad = 0;
    for (int64_t i = 0; i < rows * K; ++i)
      if (got[i] != want[i] && ++bad <= 5)
        ADD_FAILURE() << "row " << i / K << " col " << i % K << ": got 0x" << std::hex << int(got[i])
                      << " torch 0x" << int(want[i]);
    EXPECT_EQ(bad, 0);
    for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(bits(scale[r]), bits(s.f32()[r])) << "scale of row " << r;
    ++cases;
  }
  EXPECT_EQ(cases, 6);
}

// The stated round-trip bound on fresh random rows (odd K, magnitudes over 16 decades), and the largest
// magnitude of each row becomes ±448 exactly.
TEST(Fp8Ref, RoundTripBoundAndAmaxAt448) {
  const int64_t rows = 64, K = 333;
  std::vector<float> x = randn(0xF8A1, rows * K, 1.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < K; ++k) x[r * K + k] *= std::ldexp(1.0f, static_cast<int>(r % 16) * 4 - 30);
  const Quantized qz = quantize(x, rows, K);
  std::vector<float> deq(x.size());
  ops::dequantize_rows_fp8(qz.q.data(), qz.scale.data(), rows, K, deq.data());
  int64_t normals = 0, subnormals = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = qz.scale[r];
    int64_t arg = 0;
    for (int64_t k = 0; k < K; ++k) {
      const float xv = x[r * K + k], d = deq[r * K + k];
      if (std::fabs(xv) > std::fabs(x[r * K + arg])) arg = k;
      // |x·inv| = |x| / scale up to fp32 roundings; at the boundary both bounds are 2^-10·scale.
      const bool normal = std::fabs(xv) / scale >= std::ldexp(1.0f, -6);
      const double bound = normal ? (std::ldexp(1.0, -4) + std::ldexp(1.0, -21)) * std::fabs(xv)
                                  : std::ldexp(1.0, -10) * scale * (1 + std::ldexp(1.0, -20)) +
                                        std::ldexp(1.0, -21) * std::fabs(xv);
      (normal ? normals : subnormals)++;
      ASSERT_LE(std::fabs(static_cast<double>(d) - xv), bound) << "row " << r << " col " << k << " x " << xv;
    }
    const uint8_t qa = qz.q[r * K + arg];
    EXPECT_EQ(qa & 0x7F, 0x7E) << "row " << r << ": amax element code 0x" << std::hex << int(qa);
    EXPECT_EQ((qa >> 7) != 0, std::signbit(x[r * K + arg])) << "row " << r;
  }
  EXPECT_GT(normals, 0);
  EXPECT_GT(subnormals, 0);  // Gaussian rows reach the subnormal codes (|x| < amax / 28672)
}

// Zero rows (with negative zeros), NaN and inf rows, a row below the 2^-64 floor and an fp32-subnormal row.
TEST(Fp8Ref, SpecialRows) {
  const int64_t K = 37, rows = 6;
  std::vector<float> x = randn(0xF8A2, rows * K, 1.0f);
  for (int64_t k = 0; k < K; ++k) x[0 * K + k] = (k % 2) ? -0.0f : 0.0f;
  x[1 * K + 7] = std::numeric_limits<float>::quiet_NaN();
  x[2 * K + 30] = -std::numeric_limits<float>::infinity();
  for (int64_t k = 0; k < K; ++k) x[3 * K + k] *= 1e-30f;  // amax < 2^-64 ≈ 5.4e-20
  for (int64_t k = 0; k < K; ++k) x[4 * K + k] = std::ldexp(x[4 * K + k], -140);  // fp32 subnormals
  const Quantized qz = quantize(x, rows, K);
  EXPECT_EQ(qz.scale[0], 1.0f);
  for (int64_t k = 0; k < K; ++k) EXPECT_EQ(qz.q[0 * K + k], 0x00) << k;
  for (int64_t r : {1, 2}) {
    EXPECT_TRUE(std::isnan(qz.scale[r])) << r;
    for (int64_t k = 0; k < K; ++k) EXPECT_EQ(qz.q[r * K + k], 0x7F) << r << " " << k;
  }
  const float floored = std::ldexp(1.0f, -64) / 448.0f;
  for (int64_t r : {3, 4}) {
    EXPECT_EQ(bits(qz.scale[r]), bits(floored)) << r;
    const float inv = 448.0f / std::ldexp(1.0f, -64);
    for (int64_t k = 0; k < K; ++k)
      EXPECT_EQ(qz.q[r * K + k], f32_to_f8e4m3(x[r * K + k] * inv)) << r << " " << k;
  }
  std::vector<float> deq(x.size());
  ops::dequantize_rows_fp8(qz.q.data(), qz.scale.data(), rows, K, deq.data());
  for (int64_t i = 3 * K; i < 6 * K; ++i) EXPECT_TRUE(std::isfinite(deq[i])) << i;
  // The last row is ordinary: finite scale, its amax element at ±448.
  EXPECT_TRUE(std::isfinite(qz.scale[5]) && qz.scale[5] > 0);
  int64_t arg = 5 * K;
  for (int64_t i = 5 * K; i < 6 * K; ++i)
    if (std::fabs(x[i]) > std::fabs(x[arg])) arg = i;
  EXPECT_EQ(qz.q[arg] & 0x7F, 0x7E);
}

// Exact midpoints between neighbouring e4m3 codes go to the even code (amax 448 makes inv exactly 1).
TEST(Fp8Ref, TiesToEven) {
  const float s = std::ldexp(1.0f, -9);  // smallest subnormal
  struct Case {
    float v;
    uint8_t code;
  };
  const Case cases[] = {{1.0625f, 0x38},  {1.1875f, 0x3A}, {1.3125f, 0x3A}, {400.0f, 0x7C}, {432.0f, 0x7E},
                        {0.5f * s, 0x00}, {1.5f * s, 0x02}, {2.5f * s, 0x02}, {7.5f * s, 0x08}, {3.0f, 0x44},
                        {416.0f, 0x7D},   {s, 0x01}};
  std::vector<float> x = {448.0f};
  for (const Case& c : cases) x.push_back(c.v), x.push_back(-c.v);
  const int64_t K = static_cast<int64_t>(x.size());
  const Quantized qz = quantize(x, 1, K);
  EXPECT_EQ(qz.scale[0], 1.0f);
  EXPECT_EQ(qz.q[0], 0x7E);
  for (size_t i = 0; i < std::size(cases); ++i) {
    EXPECT_EQ(qz.q[1 + 2 * i], cases[i].code) << cases[i].v;
    EXPECT_EQ(qz.q[2 + 2 * i], cases[i].code | 0x80) << -cases[i].v;
  }
}

// The bf16 overload reads the bf16 values exactly: same bytes and scales as the fp32 path on them.
TEST(Fp8Ref, Bf16InputEqualsItsFloatValues) {
  const int64_t rows = 9, K = 130;
  std::vector<uint16_t> xb(rows * K);
  std::vector<float> xf(rows * K);
  const auto v = randn(0xF8A3, rows * K, 2.5f);
  for (size_t i = 0; i < v.size(); ++i) xb[i] = f32_to_bf16(v[i]), xf[i] = bf16_to_f32(xb[i]);
  std::vector<uint8_t> qb(rows * K);
  std::vector<float> sb(rows);
  ops::quantize_rows_fp8(xb.data(), rows, K, qb.data(), sb.data());
  const Quantized qf = quantize(xf, rows, K);
  EXPECT_EQ(qb, qf.q);
  EXPECT_EQ(std::memcmp(sb.data(), qf.scale.data(), rows * sizeof(float)), 0);
}

// linear_fp8_ref = scale_x·scale_w·(exact sum) (+ bias, GELU): against ops::linear on the dequantised
// operands (fp32 sums in another order: relative error far under 1e-5 here), with and without bias / GELU.
TEST(Fp8Ref, LinearMatchesDequantisedLinear) {
  const int64_t M = 13, K = 96, N = 24;
  const auto x = randn(0xF8A4, M * K, 1.0f), w = randn(0xF8A5, N * K, 0.05f), b = randn(0xF8A6, N, 0.5f);
  const Quantized xq = quantize(x, M, K), wq = quantize(w, N, K);
  std::vector<float> xd(x.size()), wd(w.size());
  ops::dequantize_rows_fp8(xq.q.data(), xq.scale.data(), M, K, xd.data());
  ops::dequantize_rows_fp8(wq.q.data(), wq.scale.data(), N, K, wd.data());
  for (bool bias : {false, true}) {
    for (bool gelu : {false, true}) {
      std::vector<float> ref(M * N), got(M * N, std::nanf(""));
      ops::linear(xd.data(), wd.data(), bias ? b.data() : nullptr, ref.data(), M, K, N);
      if (gelu) ops::gelu_tanh(ref.data(), ref.data(), M * N);
      ops::linear_fp8_ref(xq.q.data(), xq.scale.data(), wq.q.data(), wq.scale.data(), bias ? b.data() : nullptr,
                          got.data(), M, K, N, gelu);
      double num = 0, den = 0;
      for (int64_t i = 0; i < M * N; ++i) {
        ASSERT_TRUE(std::isfinite(got[i])) << i;
        num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
        den += double(ref[i]) * ref[i];
      }
      EXPECT_LE(std::sqrt(num / den), 1e-5) << "bias " << bias << " gelu " << gelu;
    }
  }
  // The quantisation itself is visible: the fp8 Linear is not the fp32 Linear of the originals.
  std::vector<float> orig(M * N), q8(M * N);
  ops::linear(x.data(), w.data(), nullptr, orig.data(), M, K, N);
  ops::linear_fp8_ref(xq.q.data(), xq.scale.data(), wq.q.data(), wq.scale.data(), nullptr, q8.data(), M, K, N, false);
  double num = 0, den = 0;
  for (int64_t i = 0; i < M * N; ++i) {
    num += (double(q8[i]) - orig[i]) * (double(q8[i]) - orig[i]);
    den += double(orig[i]) * orig[i];
  }
  EXPECT_GT(std::sqrt(num / den), 1e-3);
  EXPECT_LT(std::sqrt(num / den), 6e-2);
}
