// The FP8 attention reference (ops/fp8_attention_ref.h), the GPU kernel's oracle: its error against the
// fp32 attention (ops::attention) and its LSE against a double-precision one at odd sizes; the K
// smoothing (a large common key offset changes out by little and shifts the LSE by scale·q·offset); the
// mask (junk keys past k_lens change nothing, bit for bit); both key tiles; thread-count independence
// (child processes with WAN_THREADS = 1, 2, 3); bad shapes. Inputs are fresh Philox draws, fixed seeds.
//
// Bounds: on iid std-1 Gaussians each of the four e4m3 roundings (Q, K, P, V) alone costs ~2.5e-2 rel
// L2 of out (a 3-bit mantissa rounds by ~2.4% RMS, and out, an average of nearly independent v rows,
// keeps that relative error), so the scheme measures ~5e-2 in all: bound 7e-2. The LSE sees only the
// Q and K roundings, as logit errors of ~0.03: measured max |error| ~0.02 over a few hundred rows,
// mean ~0.004: bounds 0.05 and 0.01 (absolute; the LSE's error does not scale with its value).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/philox.h"
#include "core/thread_pool.h"
#include "ops/cpu_ops.h"
#include "ops/fp8_attention_ref.h"
#include "run_util.h"
#include "test_util.h"

using namespace wan;

namespace {

constexpr int64_t D = 128;
const float kScale = 1.0f / std::sqrt(128.0f);
constexpr double kOutBound = 7e-2;     // rel L2 of out against fp32
constexpr double kLseMaxBound = 5e-2;  // max |lse - ref|
constexpr double kLseMeanBound = 1e-2;  // mean |lse - ref|

std::vector<float> randn(uint64_t seed, size_t n, float std_dev = 1.0f, float mean = 0.0f) {
  std::vector<float> v(n);
  philox_normal_fill(seed, 0, v.data(), n);
  for (float& x : v) x = mean + std_dev * x;
  return v;
}

struct Case {
  int64_t B, Lq, Lk, H;
  std::vector<float> q, k, v;
  Case(uint64_t seed, int64_t B_, int64_t Lq_, int64_t Lk_, int64_t H_)
      : B(B_), Lq(Lq_), Lk(Lk_), H(H_), q(randn(seed, B * Lq * H * D)), k(randn(seed + 1, B * Lk * H * D)),
        v(randn(seed + 2, B * Lk * H * D)) {}
};

struct Result {
  std::vector<float> out, lse;
};

Result run_fp8(const Case& c, const int64_t* k_lens = nullptr, int key_tile = 128, float scale = 0.0f) {
  Result r{std::vector<float>(c.q.size()), std::vector<float>(c.B * c.H * c.Lq)};
  ops::attention_fp8_ref(c.q.data(), c.k.data(), c.v.data(), r.out.data(), r.lse.data(), c.B, c.Lq, c.Lk, c.H, D,
                         k_lens, scale, {key_tile});
  return r;
}

std::vector<float> run_fp32(const Case& c, const int64_t* k_lens = nullptr) {
  std::vector<float> out(c.q.size());
  ops::attention(c.q.data(), c.k.data(), c.v.data(), out.data(), c.B, c.Lq, c.Lk, c.H, D, k_lens, kScale);
  return out;
}

// log Σ_j exp(kScale · q_i·k_j) in double, [B, H, Lq].
std::vector<double> lse_double(const Case& c, const int64_t* k_lens = nullptr) {
  std::vector<double> lse(c.B * c.H * c.Lq), s(c.Lk);
  const int64_t row = c.H * D;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t i = 0; i < c.Lq; ++i) {
        const float* qi = c.q.data() + (b * c.Lq + i) * row + h * D;
        const int64_t n = k_lens ? k_lens[b] : c.Lk;
        double mx = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          const float* kj = c.k.data() + (b * c.Lk + j) * row + h * D;
          double dot = 0.0;
          for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qi[d]) * kj[d];
          s[j] = kScale * dot;
          mx = std::max(mx, s[j]);
        }
        for (int64_t j = 0; j < n; ++j) sum += std::exp(s[j] - mx);
        lse[(b * c.H + h) * c.Lq + i] = mx + std::log(sum);
      }
  return lse;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

struct LseErr {
  double max = 0.0, mean = 0.0;
};
LseErr lse_err(const std::vector<float>& lse, const std::vector<double>& ref) {
  LseErr e;
  for (size_t i = 0; i < lse.size(); ++i) {
    const double d = std::fabs(lse[i] - ref[i]);
    e.max = std::max(e.max, d);
    e.mean += d / static_cast<double>(lse.size());
  }
  return e;
}

void expect_lse_within(const std::vector<float>& lse, const std::vector<double>& ref, const char* what) {
  const LseErr e = lse_err(lse, ref);
  std::printf("%s: lse |error| max %.3e, mean %.3e\n", what, e.max, e.mean);
  EXPECT_LE(e.max, kLseMaxBound) << what;
  EXPECT_LE(e.mean, kLseMeanBound) << what;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// `variant` of the scheme against `base` on case c: as accurate (within 5%), different from it (the option
// is used), and its LSE as exact.
void expect_variant_as_accurate(const Case& c, const ops::Fp8AttentionRefOptions& base,
                                const ops::Fp8AttentionRefOptions& variant, const char* what) {
  const std::vector<float> ref = run_fp32(c);
  const std::vector<double> lref = lse_double(c);
  auto run = [&](const ops::Fp8AttentionRefOptions& o) {
    Result r{std::vector<float>(c.q.size()), std::vector<float>(c.B * c.H * c.Lq)};
    ops::attention_fp8_ref(c.q.data(), c.k.data(), c.v.data(), r.out.data(), r.lse.data(), c.B, c.Lq, c.Lk, c.H, D,
                           nullptr, 0.0f, o);
    return r;
  };
  const Result b = run(base), v = run(variant);
  const double eb = rel_l2(b.out, ref), ev = rel_l2(v.out, ref), between = rel_l2(v.out, b.out);
  std::printf("%s: err %.3e (base %.3e), between %.3e\n", what, ev, eb, between);
  EXPECT_LE(ev, kOutBound) << what;
  EXPECT_LE(ev, 1.05 * eb) << what;
  EXPECT_GT(between, 0.0) << what;
  expect_lse_within(v.lse, lref, what);
}

}  // namespace

// The FP8 scheme against fp32 attention and a double LSE, at sizes with partial Q / K blocks and tiles.
TEST(Fp8AttentionRef, MatchesFp32Attention) {
  struct Size {
    int64_t B, Lq, Lk, H;
  };
  uint64_t seed = 100;
  for (const Size& z : {Size{2, 129, 300, 2}, Size{2, 1, 300, 3}, Size{2, 130, 1, 2}, Size{1, 257, 513, 1}}) {
    SCOPED_TRACE(cat("B ", z.B, " Lq ", z.Lq, " Lk ", z.Lk, " H ", z.H));
    const Case c(seed += 10, z.B, z.Lq, z.Lk, z.H);
    const Result r = run_fp8(c);
    const double e = rel_l2(r.out, run_fp32(c));
    std::printf("B %lld Lq %lld Lk %lld H %lld: out rel L2 %.3e\n", (long long)z.B, (long long)z.Lq,
                (long long)z.Lk, (long long)z.H, e);
    EXPECT_LE(e, kOutBound);
    expect_lse_within(r.lse, lse_double(c), "  vs double");
  }
}

// A large common offset c on every key is softmax-invariant: the smoothing removes it before the
// quantisation, so out moves by a few rounding flips only and the LSE by exactly scale·q·c. (Without
// the smoothing this input costs ~0.14 rel L2 and ~0.4 of LSE, by a torch model of the scheme.)
TEST(Fp8AttentionRef, KeySmoothingRemovesCommonOffset) {
  const Case c(200, 1, 129, 300, 2);
  const std::vector<float> off = randn(210, D, 1.0f, 5.0f);
  Case shifted = c;
  for (size_t e = 0; e < shifted.k.size(); ++e) shifted.k[e] += off[e % D];
  const Result r = run_fp8(c), rs = run_fp8(shifted);
  const double moved = rel_l2(rs.out, r.out), e = rel_l2(rs.out, run_fp32(shifted));
  double worst = 0.0;
  for (int64_t h = 0; h < c.H; ++h)
    for (int64_t i = 0; i < c.Lq; ++i) {
      double qc = 0.0;
      for (int64_t d = 0; d < D; ++d) qc += static_cast<double>(c.q[(i * c.H + h) * D + d]) * off[d];
      const int64_t o = h * c.Lq + i;
      worst = std::max(worst, std::fabs((rs.lse[o] - r.lse[o]) - kScale * qc));
    }
  std::printf("offset keys: out moved by rel L2 %.3e, error vs fp32 %.3e, lse shift error %.3e\n", moved, e, worst);
  EXPECT_LT(moved, 1e-3);
  EXPECT_LE(e, kOutBound);
  EXPECT_LT(worst, 1e-3);
  expect_lse_within(rs.lse, lse_double(shifted), "offset keys vs double");
}

// Keys past k_lens hold large junk; each sample's result equals, bit for bit, a call on its truncated
// keys alone. Lengths outside [1, Lk] are clamped.
TEST(Fp8AttentionRef, MaskedKeysEnterNothing) {
  Case c(300, 3, 70, 300, 2);
  const int64_t lens[3] = {300, 129, 1};
  const int64_t row = c.H * D;
  const std::vector<float> junk_k = randn(310, c.k.size(), 20.0f, 40.0f), junk_v = randn(311, c.v.size(), 20.0f, 40.0f);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t e = (b * c.Lk + lens[b]) * row; e < (b + 1) * c.Lk * row; ++e) {
      c.k[e] = junk_k[e];
      c.v[e] = junk_v[e];
    }
  const Result masked = run_fp8(c, lens);
  EXPECT_LE(rel_l2(masked.out, run_fp32(c, lens)), kOutBound);
  expect_lse_within(masked.lse, lse_double(c, lens), "masked vs double");
  for (int64_t b = 0; b < c.B; ++b) {
    SCOPED_TRACE(cat("sample ", b, " k_len ", lens[b]));
    Case one(0, 1, c.Lq, lens[b], c.H);
    std::copy_n(c.q.begin() + b * c.Lq * row, c.Lq * row, one.q.begin());
    std::copy_n(c.k.begin() + b * c.Lk * row, lens[b] * row, one.k.begin());
    std::copy_n(c.v.begin() + b * c.Lk * row, lens[b] * row, one.v.begin());
    const Result alone = run_fp8(one);
    EXPECT_TRUE(bitwise_equal(alone.out, {masked.out.begin() + b * c.Lq * row, masked.out.begin() + (b + 1) * c.Lq * row}));
    EXPECT_TRUE(bitwise_equal(alone.lse, {masked.lse.begin() + b * c.H * c.Lq, masked.lse.begin() + (b + 1) * c.H * c.Lq}));
  }
  const int64_t clamped[3] = {999, 129, 0}, full[3] = {300, 129, 1};
  const Result a = run_fp8(c, clamped), b = run_fp8(c, full);
  EXPECT_TRUE(bitwise_equal(a.out, b.out));
  EXPECT_TRUE(bitwise_equal(a.lse, b.lse));
}

// BN = 128 and BN = 256 differ only in where the running max is taken: both meet the bound, and they
// differ from each other by less than half of what either differs from fp32.
TEST(Fp8AttentionRef, KeyTiles) {
  const Case c(400, 1, 129, 700, 2);
  const std::vector<float> ref = run_fp32(c);
  const std::vector<double> lref = lse_double(c);
  const Result t128 = run_fp8(c, nullptr, 128), t256 = run_fp8(c, nullptr, 256);
  const double e128 = rel_l2(t128.out, ref), e256 = rel_l2(t256.out, ref), between = rel_l2(t256.out, t128.out);
  std::printf("key tiles: err 128 %.3e, err 256 %.3e, 256 vs 128 %.3e\n", e128, e256, between);
  EXPECT_LE(e128, kOutBound);
  EXPECT_LE(e256, kOutBound);
  expect_lse_within(t128.lse, lref, "key tile 128 vs double");
  expect_lse_within(t256.lse, lref, "key tile 256 vs double");
  // Only P's rounding moves with the running max (one of the four error sources above).
  EXPECT_GT(between, 0.0);  // the tile is really used
  EXPECT_LT(between, 0.5 * std::min(e128, e256));
}

// The kernel's lazy rescale (the running max moves only by more than 2, P offset 6 instead of 8) against
// the eager one.
TEST(Fp8AttentionRef, LazyRescale) {
  ops::Fp8AttentionRefOptions eager, lazy;
  eager.lazy_rescale = false;
  eager.l_of_rounded_p = lazy.l_of_rounded_p = false;
  expect_variant_as_accurate(Case(410, 2, 129, 700, 2), eager, lazy, "lazy rescale");
}

// The default options are the kernel's scheme (attention_fp8.h): the lazy rescale and the row sums of the
// rounded P.
TEST(Fp8AttentionRef, DefaultsAreTheKernelsScheme) {
  const ops::Fp8AttentionRefOptions o;
  EXPECT_EQ(o.key_tile, 128);
  EXPECT_TRUE(o.lazy_rescale);
  EXPECT_TRUE(o.l_of_rounded_p);
}

// The kernel's row sum of the e4m3-rounded P (l_of_rounded_p) against the sum before rounding, both with
// the lazy rescale as the kernel runs it.
TEST(Fp8AttentionRef, RowSumOfRoundedP) {
  ops::Fp8AttentionRefOptions before, after;
  before.lazy_rescale = after.lazy_rescale = true;
  before.l_of_rounded_p = false;
  after.l_of_rounded_p = true;
  expect_variant_as_accurate(Case(411, 2, 129, 700, 2), before, after, "row sum of rounded P");
}

// One case's out and lse as an FNV-1a digest, the same whatever the thread count; here the pool's run
// must equal a serial one (a nested parallel_for runs serially, core/thread_pool.h). Also the child of
// ThreadCountIndependent, which reads the digest line.
TEST(Fp8AttentionRef, SerialEqualsPool) {
  const Case c(500, 2, 300, 260, 3);
  const int64_t lens[2] = {260, 131};
  const Result pooled = run_fp8(c, lens);
  Result serial;
  parallel_for(2, 1, [&](int64_t b, int64_t) {
    if (b == 0) serial = run_fp8(c, lens);
  });
  EXPECT_TRUE(bitwise_equal(pooled.out, serial.out));
  EXPECT_TRUE(bitwise_equal(pooled.lse, serial.lse));
  uint64_t h = 1469598103934665603ull;
  for (const std::vector<float>* x : {&pooled.out, &pooled.lse})
    for (float f : *x) h = (h ^ f32_bits(f)) * 1099511628211ull;
  std::printf("threads %d digest %016llx\n", num_threads(), static_cast<unsigned long long>(h));
}

TEST(Fp8AttentionRef, ThreadCountIndependent) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::vector<std::string> digests;
  for (const char* n : {"1", "2", "3"}) {
    test::EnvGuard env;
    env.set("WAN_THREADS", n);
    const test::RunResult r = test::run_captured(self, {"--gtest_filter=Fp8AttentionRef.SerialEqualsPool"});
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    const size_t at = r.out.find("digest ");
    ASSERT_NE(at, std::string::npos) << r.out;
    EXPECT_NE(r.out.find(cat("threads ", n, " digest")), std::string::npos) << r.out;
    digests.push_back(r.out.substr(at, 23));
  }
  EXPECT_EQ(digests[0], digests[1]);
  EXPECT_EQ(digests[0], digests[2]);
}

TEST(Fp8AttentionRef, RefusesBadShapes) {
  const Case c(600, 1, 4, 4, 1);
  std::vector<float> out(c.q.size());
  auto call = [&](int64_t B, int64_t Lq, int64_t Lk, int64_t H, int64_t d, int tile, const float* q) {
    return test::error_of([&] {
      ops::attention_fp8_ref(q, c.k.data(), c.v.data(), out.data(), nullptr, B, Lq, Lk, H, d, nullptr, 0.0f, {tile});
    });
  };
  EXPECT_EQ(call(1, 4, 4, 1, 128, 128, c.q.data()), "(no error)");
  EXPECT_NE(call(1, 4, 4, 1, 64, 128, c.q.data()).find("head dim 64"), std::string::npos);
  EXPECT_NE(call(1, 1, 4, 1, 256, 128, c.q.data()).find("head dim 256"), std::string::npos);
  for (int64_t z : {0, -1}) {
    EXPECT_NE(call(z, 4, 4, 1, 128, 128, c.q.data()).find("bad shape"), std::string::npos);
    EXPECT_NE(call(1, z, 4, 1, 128, 128, c.q.data()).find("bad shape"), std::string::npos);
    EXPECT_NE(call(1, 4, z, 1, 128, 128, c.q.data()).find("bad shape"), std::string::npos);
    EXPECT_NE(call(1, 4, 4, z, 128, 128, c.q.data()).find("bad shape"), std::string::npos);
  }
  EXPECT_NE(call(1, 4, 4, 1, 128, 64, c.q.data()).find("key_tile 64"), std::string::npos);
  EXPECT_NE(call(1, 4, 4, 1, 128, 128, nullptr).find("null"), std::string::npos);
}
