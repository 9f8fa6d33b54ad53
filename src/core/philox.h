// Counter-based RNG: Philox4x32-10 (Salmon et al., SC'11) and a standard-normal draw that is
// bit-identical on the CPU and the GPU for a given (seed, index).
// Every random number in the engine comes from here: element i of a stream with key `seed` is
// philox_normal(seed, i), so any element can be drawn independently, in any order, on any device.
// Identity across devices: the normal draw uses only IEEE-exact operations (add, mul, div, sqrt,
// fused multiply-add, all correctly rounded on both sides), never libm, and host code is compiled
// without FMA contraction (-ffp-contract=off); device code uses the _rn intrinsics, which are
// never contracted.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define WAN_PHX_HD __host__ __device__ __forceinline__
#else
#define WAN_PHX_HD inline
#include <cmath>
#endif

namespace wan {

struct Philox4 {
  uint32_t v[4];
};

WAN_PHX_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// Philox4x32 with 10 rounds. counter: 128 bits, key: 64 bits.
WAN_PHX_HD Philox4 philox4x32_10(Philox4 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
  constexpr uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(M0, ctr.v[0], hi0, lo0);
    philox_mulhilo(M1, ctr.v[2], hi1, lo1);
    Philox4 n;
    n.v[0] = hi1 ^ ctr.v[1] ^ k0;
    n.v[1] = lo1;
    n.v[2] = hi0 ^ ctr.v[3] ^ k1;
    n.v[3] = lo0;
    ctr = n;
    k0 += W0;
    k1 += W1;
  }
  return ctr;
}

namespace rng_detail {
// Exact-rounding primitives. On the device the intrinsics forbid contraction into FMAs; on the host
// the build passes -ffp-contract=off.
#if defined(__CUDA_ARCH__)
WAN_PHX_HD double add(double a, double b) { return __dadd_rn(a, b); }
WAN_PHX_HD double sub(double a, double b) { return __dsub_rn(a, b); }
WAN_PHX_HD double mul(double a, double b) { return __dmul_rn(a, b); }
WAN_PHX_HD double fma(double a, double b, double c) { return __fma_rn(a, b, c); }
WAN_PHX_HD double div(double a, double b) { return __ddiv_rn(a, b); }
WAN_PHX_HD double sqrt(double a) { return __dsqrt_rn(a); }
#else
inline double add(double a, double b) { return a + b; }
inline double sub(double a, double b) { return a - b; }
inline double mul(double a, double b) { return a * b; }
inline double fma(double a, double b, double c) { return std::fma(a, b, c); }
inline double div(double a, double b) { return a / b; }
inline double sqrt(double a) { return std::sqrt(a); }
#endif

// ln(u) for u in (0, 1]: u = m * 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s), s = (m-1)/(m+1),
// |s| < 0.1716, series to s^25 (error < 1e-19 relative), plus e * ln 2 in two parts.
WAN_PHX_HD double log_unit(double u) {
  uint64_t bits;
  memcpy(&bits, &u, 8);
  int e = static_cast<int>((bits >> 52) & 0x7FF) - 1023;
  bits = (bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;  // m in [1, 2)
  double m;
  memcpy(&m, &bits, 8);
  if (m > 1.4142135623730951) {
    m = mul(m, 0.5);
    e += 1;
  }
  double s = div(sub(m, 1.0), add(m, 1.0));
  double s2 = mul(s, s);
  // atanh(s)/s = sum s2^k / (2k+1), Horner from k = 12 down.
  double p = 1.0 / 25.0;
  p = fma(p, s2, 1.0 / 23.0);
  p = fma(p, s2, 1.0 / 21.0);
  p = fma(p, s2, 1.0 / 19.0);
  p = fma(p, s2, 1.0 / 17.0);
  p = fma(p, s2, 1.0 / 15.0);
  p = fma(p, s2, 1.0 / 13.0);
  p = fma(p, s2, 1.0 / 11.0);
  p = fma(p, s2, 1.0 / 9.0);
  p = fma(p, s2, 1.0 / 7.0);
  p = fma(p, s2, 1.0 / 5.0);
  p = fma(p, s2, 1.0 / 3.0);
  p = fma(p, s2, 1.0);
  double lnm = mul(mul(2.0, s), p);
  constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  double de = static_cast<double>(e);
  return add(fma(de, kLn2Hi, lnm), mul(de, kLn2Lo));
}

// cos(2*pi*v) for v in [0, 1): octant reduction on the exact fraction v, then Taylor series of
// sin/cos on |x| <= pi/4 (terms to x^18 / x^17: error < 1e-17).
WAN_PHX_HD double sin_poly(double x) {
  double x2 = mul(x, x);
  double p = -1.0 / 355687428096000.0;  // -1/17!
  p = fma(p, x2, 1.0 / 1307674368000.0);
  p = fma(p, x2, -1.0 / 6227020800.0);
  p = fma(p, x2, 1.0 / 39916800.0);
  p = fma(p, x2, -1.0 / 362880.0);
  p = fma(p, x2, 1.0 / 5040.0);
  p = fma(p, x2, -1.0 / 120.0);
  p = fma(p, x2, 1.0 / 6.0);
  // sin x = x - x^3 p'  where p' above holds 1/3! - x^2/5! + ...
  return sub(x, mul(mul(x, x2), p));
}
WAN_PHX_HD double cos_poly(double x) {
  double x2 = mul(x, x);
  double p = 1.0 / 6402373705728000.0;  // 1/18!
  p = fma(p, x2, -1.0 / 20922789888000.0);
  p = fma(p, x2, 1.0 / 87178291200.0);
  p = fma(p, x2, -1.0 / 479001600.0);
  p = fma(p, x2, 1.0 / 3628800.0);
  p = fma(p, x2, -1.0 / 40320.0);
  p = fma(p, x2, 1.0 / 720.0);
  p = fma(p, x2, -1.0 / 24.0);
  p = fma(p, x2, 1.0 / 2.0);
  return sub(1.0, mul(x2, p));
}
WAN_PHX_HD double cos_2pi(double v) {
  // v in [0,1) with 32 significant bits: 8*v splits exactly into octant k and remainder r in [0,1).
  double t = mul(v, 8.0);
  int k = static_cast<int>(t);
  double r = sub(t, static_cast<double>(k));  // exact
  constexpr double kPi4 = 0.78539816339744830962;
  // angle = (k + r) * pi/4. Use symmetric reduction: odd octants measure from the next boundary.
  double x = (k & 1) ? mul(sub(1.0, r), kPi4) : mul(r, kPi4);
  // Octant table for cos(theta), theta = k*pi/4 + rest:
  switch (k) {
    case 0: return cos_poly(x);             // [0, pi/4): cos x
    case 1: return sin_poly(x);             // [pi/4, pi/2): cos(pi/2 - x') = sin x'
    case 2: return -sin_poly(x);            // [pi/2, 3pi/4): cos(pi/2 + x) = -sin x
    case 3: return -cos_poly(x);            // [3pi/4, pi): cos(pi - x') = -cos x'
    case 4: return -cos_poly(x);            // [pi, 5pi/4): cos(pi + x) = -cos x
    case 5: return -sin_poly(x);            // [5pi/4, 3pi/2): cos(3pi/2 - x') = -sin x'
    case 6: return sin_poly(x);             // [3pi/2, 7pi/4): cos(3pi/2 + x) = sin x
    default: return cos_poly(x);            // [7pi/4, 2pi): cos(2pi - x') = cos x'
  }
}
}  // namespace rng_detail

// Standard normal N(0,1) for element `index` of the stream keyed by `seed` (Box-Muller, cosine branch).
WAN_PHX_HD float philox_normal(uint64_t seed, uint64_t index) {
  Philox4 c{{static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0u, 0x6E6F726Du /*"norm"*/}};
  Philox4 r = philox4x32_10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  // u in (0, 1] from 53 bits of (r0, r1); v in [0, 1) from 32 bits of r2. Both exact in double.
  uint64_t bits53 = ((static_cast<uint64_t>(r.v[0]) << 21) ^ (r.v[1] >> 11)) & ((1ull << 53) - 1);
  double u = rng_detail::mul(rng_detail::add(static_cast<double>(bits53), 1.0), 1.0 / 9007199254740992.0);
  double v = rng_detail::mul(static_cast<double>(r.v[2]), 1.0 / 4294967296.0);
  double rad = rng_detail::sqrt(rng_detail::mul(-2.0, rng_detail::log_unit(u)));
  return static_cast<float>(rng_detail::mul(rad, rng_detail::cos_2pi(v)));
}

// Uniform in [0, 1) with 24 random bits (exact float), element `index` of stream `seed`.
WAN_PHX_HD float philox_uniform(uint64_t seed, uint64_t index) {
  Philox4 c{{static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0u, 0x756E6966u /*"unif"*/}};
  Philox4 r = philox4x32_10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return static_cast<float>(r.v[0] >> 8) * (1.0f / 16777216.0f);
}

// Fills dst[i] = philox_normal(seed, offset + i) on the host (multi-threaded).
void philox_normal_fill(uint64_t seed, uint64_t offset, float* dst, size_t n);

}  // namespace wan
