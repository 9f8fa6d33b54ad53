// Philox4x32-10 known-answer vectors, the exactness of the normal transform's math, and the
// statistics of the normal stream.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/philox.h"

using namespace wan;

TEST(Philox, KnownAnswerVectors) {
  // Random123 kat_vectors for philox4x32_10.
  Philox4 r = philox4x32_10({{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
  r = philox4x32_10({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(r.v[0], 0x408f276du);
  EXPECT_EQ(r.v[1], 0x41c83b0eu);
  EXPECT_EQ(r.v[2], 0xa20bc7c6u);
  EXPECT_EQ(r.v[3], 0x6d5451fdu);
  r = philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(r.v[0], 0xd16cfe09u);
  EXPECT_EQ(r.v[1], 0x94fdccebu);
  EXPECT_EQ(r.v[2], 0x5001e420u);
  EXPECT_EQ(r.v[3], 0x24126ea1u);
}

TEST(Philox, OwnMathMatchesLibm) {
  for (uint64_t i = 0; i < 200000; ++i) {
    double u = (static_cast<double>(i) + 0.5) / 200000.0;
    double l = rng_detail::log_unit(u);
    EXPECT_NEAR(l, std::log(u), 4e-16 * std::max(1.0, std::fabs(std::log(u)))) << u;
    double c = rng_detail::cos_2pi(u);
    EXPECT_NEAR(c, std::cos(2.0 * M_PI * u), 2e-15) << u;
  }
  EXPECT_NEAR(rng_detail::log_unit(1.0), 0.0, 1e-300);
  EXPECT_NEAR(rng_detail::log_unit(std::ldexp(1.0, -53)), -53 * std::log(2.0), 1e-13);
}

TEST(Philox, NormalStreamStatisticsAndDeterminism) {
  const size_t n = 1 << 20;
  std::vector<float> a(n), b(n);
  philox_normal_fill(1234, 0, a.data(), n);
  philox_normal_fill(1234, 0, b.data(), n);
  EXPECT_EQ(a, b);
  double s = 0, s2 = 0, s4 = 0;
  size_t tail = 0;
  for (float v : a) {
    ASSERT_TRUE(std::isfinite(v));
    s += v;
    s2 += double(v) * v;
    s4 += double(v) * v * v * v;
    tail += std::fabs(v) > 3.0f;
  }
  double mean = s / n, var = s2 / n - mean * mean, kurt = s4 / n / (var * var);
  EXPECT_NEAR(mean, 0.0, 5e-3);
  EXPECT_NEAR(var, 1.0, 5e-3);
  EXPECT_NEAR(kurt, 3.0, 0.03);
  EXPECT_NEAR(double(tail) / n, 0.0026998, 3e-4);
  // Index addressing: an offset stream is the same stream shifted; another seed differs.
  std::vector<float> c(1000);
  philox_normal_fill(1234, 5000, c.data(), c.size());
  for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(c[i], a[5000 + i]);
  EXPECT_NE(philox_normal(1234, 0), philox_normal(1235, 0));
  // Adjacent elements are uncorrelated.
  double cov = 0;
  for (size_t i = 0; i + 1 < n; ++i) cov += double(a[i]) * a[i + 1];
  EXPECT_NEAR(cov / n, 0.0, 5e-3);
}

TEST(Philox, UniformRange) {
  double s = 0;
  for (uint64_t i = 0; i < 100000; ++i) {
    float u = philox_uniform(3, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    s += u;
  }
  EXPECT_NEAR(s / 100000, 0.5, 5e-3);
}
