// The FP8 attention reference of fp8_attention_ref.h. Work is split into groups of (sample, head)
// pairs: each pair's K/V is smoothed, quantised and decoded once (one task per pair), then one task per
// (pair, 128-query block) runs the scores and the online softmax. The group size only bounds the
// scratch (and follows the thread count); it changes no value, since each value comes from one task.
// Quantised operands are kept decoded (f8e4m3_to_f32 of the byte): every later step reads the value.
#include "ops/fp8_attention_ref.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8_rows.h"
#include "core/thread_pool.h"

namespace wan::ops {
namespace {

constexpr int64_t kD = 128;      // head dim the kernel supports
constexpr int64_t kBlock = 128;  // tokens per Q / K quantisation block
// Lazy rescale: the running max moves only when a tile's exceeds it by more than kLazyThreshold (log2
// units), and P is 2^kLazyOffset-scaled, so P <= 2^(6+2) = 256 stays below e4m3's 448.
constexpr float kLazyThreshold = 2.0f, kLazyOffset = 6.0f;

// One (sample, head)'s smoothed, quantised and decoded keys and values.
struct HeadKV {
  int64_t n = 0;                  // valid keys
  std::array<float, kD> mean{};   // the K smoothing vector
  std::vector<float> kq;          // [n, kD] e4m3 values of k - mean
  std::vector<float> sk;          // [ceil(n / kBlock)] scale of each K block
  std::vector<float> vq;          // [n, kD] e4m3 values of v
  std::array<float, kD> sv{};     // scale of each V channel
};

// Steps 2, 4 and 5 of the scheme for keys kh / values vh (rows `row` floats apart), n valid keys.
void prepare_head(const float* kh, const float* vh, int64_t row, int64_t n, HeadKV& kv) {
  kv.n = n;
  for (int64_t d = 0; d < kD; ++d) {
    double s = 0.0;  // keys in increasing order
    for (int64_t j = 0; j < n; ++j) s += static_cast<double>(kh[j * row + d]);
    kv.mean[d] = static_cast<float>(s / static_cast<double>(n));
  }
  kv.kq.resize(static_cast<size_t>(n * kD));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t d = 0; d < kD; ++d) kv.kq[j * kD + d] = kh[j * row + d] - kv.mean[d];
  const int64_t nkb = (n + kBlock - 1) / kBlock;
  kv.sk.resize(static_cast<size_t>(nkb));
  for (int64_t u = 0; u < nkb; ++u) {
    float* blk = kv.kq.data() + u * kBlock * kD;
    const int64_t cnt = (std::min(n, (u + 1) * kBlock) - u * kBlock) * kD;
    uint32_t amax = 0;
    for (int64_t e = 0; e < cnt; ++e) amax = std::max(amax, fp8::abs_bits(blk[e]));
    const fp8::RowScale rs = fp8::row_scale(amax);
    for (int64_t e = 0; e < cnt; ++e) blk[e] = f8e4m3_to_f32(fp8::quantize(blk[e], rs));
    kv.sk[u] = rs.scale;
  }
  kv.vq.resize(static_cast<size_t>(n * kD));
  for (int64_t d = 0; d < kD; ++d) {
    uint32_t amax = 0;
    for (int64_t j = 0; j < n; ++j) amax = std::max(amax, fp8::abs_bits(vh[j * row + d]));
    const fp8::RowScale rs = fp8::row_scale(amax);
    for (int64_t j = 0; j < n; ++j) kv.vq[j * kD + d] = f8e4m3_to_f32(fp8::quantize(vh[j * row + d], rs));
    kv.sv[d] = rs.scale;
  }
}

// Σ_d a[d]·b[d] of e4m3 values, exact: each product is exact in fp32 (a multiple of 2^-18 below 2^18),
// so 128 of them sum exactly in double in any order; rounded once to fp32 (step 6).
float exact_dot(const float* a, const float* b) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t d = 0; d < kD; d += 8)
    for (int j = 0; j < 8; ++j) acc[j] += static_cast<double>(a[d + j] * b[d + j]);
  return static_cast<float>(((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])));
}

// The online softmax of one query row (steps 8 and 9): s [n] raw scores, fu [K blocks] the score
// factor f of each K block for this row's Q block, pq [bn] scratch. Writes o [kD]; returns m and l.
// lazy: the kernel's lazy rescale (Fp8AttentionRefOptions::lazy_rescale); l_rounded: l_of_rounded_p.
void softmax_row(const float* s, const float* fu, const HeadKV& kv, int64_t bn, bool lazy, bool l_rounded, float* pq,
                 float* o, float& m_out, float& l_out) {
  const float offset = lazy ? kLazyOffset : 8.0f;
  float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
  std::array<float, kD> acc{}, pv;
  for (int64_t j0 = 0; j0 < kv.n; j0 += bn) {
    const int64_t j1 = std::min(j0 + bn, kv.n);
    float tile_max = -std::numeric_limits<float>::infinity();
    for (int64_t j = j0; j < j1; ++j) tile_max = std::fmax(tile_max, s[j] * fu[j / kBlock]);
    const float m_new = lazy ? (tile_max > m + kLazyThreshold ? tile_max : m) : std::fmax(m, tile_max);
    const float alpha = lazy && m_new == m ? 1.0f : std::exp2(m - m_new);  // exp2(-inf) = 0 on the first tile
    // P is scaled by 2^offset so that small probabilities stay in e4m3's normal range.
    const float bias = offset - m_new;
    float sum = 0.0f;
    for (int64_t j = j0; j < j1; ++j) {
      const float p = std::exp2(std::fma(s[j], fu[j / kBlock], bias));
      pq[j - j0] = f8e4m3_to_f32(f32_to_f8e4m3(p));
      sum += l_rounded ? pq[j - j0] : p;
    }
    l = l * alpha + sum;
    pv.fill(0.0f);
    for (int64_t j = j0; j < j1; ++j) {
      const float* vj = kv.vq.data() + j * kD;
      for (int64_t d = 0; d < kD; ++d) pv[d] += pq[j - j0] * vj[d];
    }
    for (int64_t d = 0; d < kD; ++d) acc[d] = acc[d] * alpha + pv[d];
    m = m_new;
  }
  const float inv_l = 1.0f / l;
  for (int64_t d = 0; d < kD; ++d) o[d] = (acc[d] * inv_l) * kv.sv[d];
  m_out = m;
  l_out = l;
}

// One block of nq <= 128 query rows qh (rows `row` floats apart) against one head's K/V: steps 3, 6, 7,
// the softmax and step 10. lse_h (nullable) points at the block's first row in [Lq].
void attend_qblock(const float* qh, int64_t row, int64_t nq, const HeadKV& kv, float scale, int64_t bn, bool lazy,
                   bool l_rounded, float* oh, float* lse_h) {
  std::vector<float> qf(static_cast<size_t>(nq * kD)), s(static_cast<size_t>(kv.n)), pq(static_cast<size_t>(bn));
  uint32_t amax = 0;
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t d = 0; d < kD; ++d) amax = std::max(amax, fp8::abs_bits(qh[i * row + d]));
  const fp8::RowScale rs = fp8::row_scale(amax);
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t d = 0; d < kD; ++d) qf[i * kD + d] = f8e4m3_to_f32(fp8::quantize(qh[i * row + d], rs));
  const float fl2 = scale * 1.4426950408889634f;
  std::vector<float> fu(kv.sk.size());
  for (size_t u = 0; u < fu.size(); ++u) fu[u] = (fl2 * rs.scale) * kv.sk[u];
  for (int64_t i = 0; i < nq; ++i) {
    for (int64_t j = 0; j < kv.n; ++j) s[j] = exact_dot(qf.data() + i * kD, kv.kq.data() + j * kD);
    float m = 0.0f, l = 0.0f;
    softmax_row(s.data(), fu.data(), kv, bn, lazy, l_rounded, pq.data(), oh + i * row, m, l);
    if (!lse_h) continue;
    // q·mean is the per-row shift the smoothing took out of every score; adding it back makes this the
    // LSE of the unsmoothed scores.
    double dot = 0.0;
    for (int64_t d = 0; d < kD; ++d) dot += static_cast<double>(qh[i * row + d]) * static_cast<double>(kv.mean[d]);
    lse_h[i] = (m + std::log2(l) - (lazy ? kLazyOffset : 8.0f)) * 0.69314718055994531f + scale * static_cast<float>(dot);
  }
}

}  // namespace

void attention_fp8_ref(const float* q, const float* k, const float* v, float* out, float* lse, int64_t B,
                       int64_t Lq, int64_t Lk, int64_t H, int64_t D, const int64_t* k_lens, float scale,
                       const Fp8AttentionRefOptions& opt) {
  WAN_CHECK(D == kD, "attention_fp8_ref: head dim ", D, " (only ", kD, " is supported)");
  WAN_CHECK(B >= 1 && Lq >= 1 && Lk >= 1 && H >= 1, "attention_fp8_ref: bad shape B ", B, " Lq ", Lq, " Lk ", Lk,
            " H ", H);
  WAN_CHECK(q && k && v && out, "attention_fp8_ref: null q, k, v or out");
  WAN_CHECK(opt.key_tile == 128 || opt.key_tile == 256, "attention_fp8_ref: key_tile ", opt.key_tile,
            " (128 or 256)");
  if (scale == 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(kD));
  const int64_t row = H * kD, pairs = B * H, nqb = (Lq + kBlock - 1) / kBlock;
  // Pairs per group: one per thread, fewer where one pair's K/V (8 bytes per key and dim) is large,
  // so that the scratch stays near 256 MiB.
  const int64_t by_memory = std::max<int64_t>(1, (int64_t{1} << 28) / (Lk * kD * 8));
  const int64_t group = std::min({pairs, std::max<int64_t>(1, num_threads()), by_memory});
  std::vector<HeadKV> kv(static_cast<size_t>(group));
  for (int64_t p0 = 0; p0 < pairs; p0 += group) {
    const int64_t np = std::min(group, pairs - p0);
    parallel_for(np, 1, [&](int64_t a0, int64_t a1) {
      for (int64_t a = a0; a < a1; ++a) {
        const int64_t b = (p0 + a) / H, h = (p0 + a) % H;
        const int64_t n = k_lens ? std::clamp<int64_t>(k_lens[b], 1, Lk) : Lk;
        const int64_t off = b * Lk * row + h * kD;
        prepare_head(k + off, v + off, row, n, kv[a]);
      }
    });
    parallel_for(np * nqb, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t a = t / nqb, qb = t % nqb;
        const int64_t b = (p0 + a) / H, h = (p0 + a) % H, i0 = qb * kBlock;
        const int64_t off = (b * Lq + i0) * row + h * kD;
        float* lse_h = lse ? lse + (b * H + h) * Lq + i0 : nullptr;
        attend_qblock(q + off, row, std::min(kBlock, Lq - i0), kv[a], scale, opt.key_tile, opt.lazy_rescale,
                      opt.l_of_rounded_p, out + off,
                      lse_h);
      }
    });
  }
}

}  // namespace wan::ops
