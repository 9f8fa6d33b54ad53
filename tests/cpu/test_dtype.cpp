// Exhaustive and edge-case tests of the scalar dtype conversions (PyTorch semantics).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"
#include "core/philox.h"

using namespace wan;

TEST(DType, Bf16AllValuesRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = bf16_to_f32(static_cast<uint16_t>(h));
    uint16_t back = f32_to_bf16(f);
    if (std::isnan(f)) {
      EXPECT_EQ(back, 0x7FC0) << h;
    } else {
      EXPECT_EQ(back, h) << h;
    }
  }
}

TEST(DType, Bf16TiesToEven) {
  // 1 + 2^-8 is exactly between bf16 1.0 (mantissa even) and 1 + 2^-7: rounds down to even.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), f32_to_bf16(1.0f));
  // 1 + 3*2^-8 is between 1+2^-7 (odd) and 1+2^-6 (even): rounds up to even.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  // Just above the tie rounds up.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f))),
            1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(f32_to_bf16(std::nanf("")), 0x7FC0);
  // Max float rounds to inf in bf16 (as PyTorch).
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
}

// Reference rounding: nearest representable value among a sorted list of all finite values of the
// format, ties to the even encoding; used to check every conversion on many random floats.
template <typename Dec>
static uint32_t reference_round(float x, int nbits, Dec decode, float overflow_limit, uint32_t overflow_code) {
  // Find nearest by brute force over all non-NaN, finite, non-negative encodings.
  uint32_t sign = std::signbit(x) ? (1u << (nbits - 1)) : 0;
  float a = std::fabs(x);
  if (a >= overflow_limit) return sign | overflow_code;
  uint32_t best = 0;
  double best_err = INFINITY;
  for (uint32_t c = 0; c < (1u << (nbits - 1)); ++c) {
    float v = decode(c);
    if (!std::isfinite(v)) continue;
    double err = std::fabs(static_cast<double>(v) - a);
    if (err < best_err || (err == best_err && (c & 1u) == 0)) {
      best_err = err;
      best = c;
    }
  }
  return sign | best;
}

TEST(DType, F16MatchesBruteForceRounding) {
  auto dec = [](uint32_t c) { return f16_to_f32(static_cast<uint16_t>(c)); };
  for (uint64_t i = 0; i < 3000; ++i) {
    // Spread over the f16 range including subnormals and near-overflow.
    float mag = std::ldexp(1.0f + philox_uniform(7, i), static_cast<int>(philox_uniform(8, i) * 44) - 27);
    float x = (i & 1) ? -mag : mag;
    uint32_t ref = reference_round(x, 16, dec, 65520.0f, 0x7C00);
    EXPECT_EQ(f32_to_f16(x), ref) << x;
  }
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (0)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::nanf("")))));
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      EXPECT_EQ(f32_to_f16(f), h);
    }
  }
}

TEST(DType, F8E4M3MatchesPyTorchRules) {
  auto dec = [](uint32_t c) { return f8e4m3_to_f32(static_cast<uint8_t>(c)); };
  // All 256 codes: decode/encode round trip (NaN codes -> 0x7F with sign).
  for (uint32_t c = 0; c < 256; ++c) {
    float f = dec(c);
    if (std::isnan(f)) {
      EXPECT_EQ(f32_to_f8e4m3(f) & 0x7F, 0x7F);
    } else {
      EXPECT_EQ(f32_to_f8e4m3(f), c) << c;
    }
  }
  EXPECT_EQ(dec(0x7E), 448.0f);
  EXPECT_EQ(dec(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(f32_to_f8e4m3(464.0f), 0x7E);  // tie between 448 (even) and 480 (NaN code): even
  EXPECT_EQ(f32_to_f8e4m3(470.0f), 0x7F);  // rounds up into the NaN code, as PyTorch
  EXPECT_EQ(f32_to_f8e4m3(480.0f), 0x7F);
  EXPECT_EQ(f32_to_f8e4m3(-1e9f), 0xFF);
  EXPECT_EQ(f32_to_f8e4m3(std::numeric_limits<float>::infinity()), 0x7F);
  for (uint64_t i = 0; i < 3000; ++i) {
    float mag = std::ldexp(1.0f + philox_uniform(9, i), static_cast<int>(philox_uniform(10, i) * 20) - 12);
    if (mag >= 464.0f) continue;
    float x = (i & 1) ? -mag : mag;
    EXPECT_EQ(f32_to_f8e4m3(x), reference_round(x, 8, dec, 480.0f, 0x7F)) << x;
  }
}

TEST(DType, F8E5M2MatchesPyTorchRules) {
  auto dec = [](uint32_t c) { return f8e5m2_to_f32(static_cast<uint8_t>(c)); };
  for (uint32_t c = 0; c < 256; ++c) {
    float f = dec(c);
    if (std::isnan(f)) {
      EXPECT_EQ(f32_to_f8e5m2(f) & 0x7F, 0x7F);
    } else {
      EXPECT_EQ(f32_to_f8e5m2(f), c) << c;
    }
  }
  EXPECT_EQ(dec(0x7B), 57344.0f);
  EXPECT_EQ(f32_to_f8e5m2(61440.0f), 0x7C);  // tie between 57344 (odd) and 65536 (inf, even): inf
  EXPECT_EQ(f32_to_f8e5m2(1e9f), 0x7C);
  EXPECT_EQ(f32_to_f8e5m2(-std::numeric_limits<float>::infinity()), 0xFC);
  EXPECT_EQ(f32_to_f8e5m2(std::nanf("")), 0x7F);
  for (uint64_t i = 0; i < 3000; ++i) {
    float mag = std::ldexp(1.0f + philox_uniform(11, i), static_cast<int>(philox_uniform(12, i) * 34) - 18);
    float x = (i & 1) ? -mag : mag;
    EXPECT_EQ(f32_to_f8e5m2(x), reference_round(x, 8, dec, 61440.0f, 0x7C)) << x;
  }
}

TEST(DType, BulkConversionsAndNames) {
  // Bulk paths agree exactly with the scalar conversions.
  float src[6] = {1.5f, -2.25f, 3.0e-3f, 100.0f, -0.0f, 7.7e-5f};
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::F8E4M3, DType::F8E5M2}) {
    alignas(8) unsigned char buf[48];
    float back[6];
    convert_from_f32(t, src, buf, 6);
    convert_to_f32(t, buf, back, 6);
    for (int i = 0; i < 6; ++i) {
      float expect = src[i];
      if (t == DType::F16) expect = f16_to_f32(f32_to_f16(src[i]));
      if (t == DType::BF16) expect = bf16_to_f32(f32_to_bf16(src[i]));
      if (t == DType::F8E4M3) expect = f8e4m3_to_f32(f32_to_f8e4m3(src[i]));
      if (t == DType::F8E5M2) expect = f8e5m2_to_f32(f32_to_f8e5m2(src[i]));
      EXPECT_EQ(back[i], expect) << dtype_name(t) << " " << src[i];
    }
    EXPECT_EQ(dtype_from_safetensors(dtype_to_safetensors(t)), t);
  }
  EXPECT_THROW(dtype_from_safetensors("F4"), wan::Error);
  float out[1];
  EXPECT_THROW(convert_to_f32(DType::I64, src, out, 1), wan::Error);
}
