// The CPU side of the attention kernel tests (test_attention_cudnn.cu, test_attention_own.cu), head dim 128,
// softmax scale 1/sqrt(128):
//   checked_rows(Lq, sample_rows, seed)  the query rows checked against the CPU: all of them (sample_rows 0 or
//                                        >= Lq), else the first, the last and distinct random rows (Philox on
//                                        seed + 77) up to sample_rows.
//   attention_reference(...)             for those rows: the fp32 reference (ops::attention on the bf16 inputs),
//                                        the same maths done plainly in bf16 (fp32 scores and softmax, P rounded
//                                        to bf16, fp32 accumulation, output rounded to bf16; the precision rule's
//                                        baseline) and the log-sum-exp with the exp and sum in double.
// q/k/v are read through callables (b, token, e) -> bf16 bits, e in [0, H·128), so each test keeps its own
// layouts (fused QKV views, strides).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/philox.h"
#include "core/thread_pool.h"
#include "gpu_test_util.h"
#include "ops/cpu_ops.h"

namespace wan::gpu_test {

constexpr int64_t kAttnD = 128;
inline const float kAttnScale = static_cast<float>(1.0 / std::sqrt(128.0));

inline std::vector<int64_t> checked_rows(int64_t Lq, int64_t sample_rows, uint64_t seed) {
  std::vector<int64_t> rows;
  if (sample_rows == 0 || sample_rows >= Lq) {
    for (int64_t i = 0; i < Lq; ++i) rows.push_back(i);
    return rows;
  }
  rows = {0, Lq - 1};
  for (uint64_t t = 0; static_cast<int64_t>(rows.size()) < sample_rows; ++t) {
    const int64_t i = static_cast<int64_t>(philox_uniform(seed + 77, t) * Lq) % Lq;
    if (std::find(rows.begin(), rows.end(), i) == rows.end()) rows.push_back(i);
  }
  return rows;
}

// Per checked row r (R = rows.size()): fp32 and plain [B, R, H, 128], lse [B, H, R].
struct AttentionRef {
  int64_t R = 0;
  std::vector<float> fp32, plain;
  std::vector<double> lse;
};

template <class QAt, class KAt, class VAt>
AttentionRef attention_reference(QAt&& qat, KAt&& kat, VAt&& vat, int64_t B, int64_t Lk, int64_t H,
                                 const std::vector<int64_t>& rows, const std::vector<int64_t>& klens) {
  constexpr int64_t D = kAttnD;
  const int64_t R = static_cast<int64_t>(rows.size()), HD = H * D;
  std::vector<float> q(static_cast<size_t>(B * R * HD)), k(static_cast<size_t>(B * Lk * HD)), v(k.size());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t r = 0; r < R; ++r)
      for (int64_t e = 0; e < HD; ++e) q[static_cast<size_t>((b * R + r) * HD + e)] = bf16_to_f32(qat(b, rows[r], e));
    for (int64_t j = 0; j < Lk; ++j)
      for (int64_t e = 0; e < HD; ++e) {
        k[static_cast<size_t>((b * Lk + j) * HD + e)] = bf16_to_f32(kat(b, j, e));
        v[static_cast<size_t>((b * Lk + j) * HD + e)] = bf16_to_f32(vat(b, j, e));
      }
  }
  AttentionRef ref;
  ref.R = R;
  ref.fp32.resize(q.size());
  ops::attention(q.data(), k.data(), v.data(), ref.fp32.data(), B, R, Lk, H, D, klens.empty() ? nullptr : klens.data(),
                 kAttnScale);
  ref.plain.assign(q.size(), 0.f);
  ref.lse.assign(static_cast<size_t>(B * H * R), 0.0);
  parallel_for(B * H * R, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> s(static_cast<size_t>(Lk)), acc(D);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / (H * R), h = (i / R) % H, qi = i % R;
      const int64_t kl = klens.empty() ? Lk : klens[b];
      const float* qr = q.data() + (b * R + qi) * HD + h * D;
      float mx = -INFINITY;
      for (int64_t j = 0; j < kl; ++j) {
        const float* kr = k.data() + (b * Lk + j) * HD + h * D;
        float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t d = 0; d < D; d += 8)
          for (int u = 0; u < 8; ++u) part[u] += qr[d + u] * kr[d + u];
        float dot = 0.f;
        for (int u = 0; u < 8; ++u) dot += part[u];
        s[j] = dot * kAttnScale;
        mx = std::max(mx, s[j]);
      }
      float sum = 0.f;
      double sumd = 0.0;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j < kl; ++j) {
        const float p = std::exp(s[j] - mx);
        sum += p;
        sumd += std::exp(static_cast<double>(s[j]) - mx);
        const float pb = rb(p);
        const float* vr = v.data() + (b * Lk + j) * HD + h * D;
        for (int64_t d = 0; d < D; ++d) acc[d] += pb * vr[d];
      }
      float* o = ref.plain.data() + (b * R + qi) * HD + h * D;
      for (int64_t d = 0; d < D; ++d) o[d] = rb(acc[d] / sum);
      ref.lse[static_cast<size_t>((b * H + h) * R + qi)] = mx + std::log(sumd);
    }
  });
  return ref;
}

}  // namespace wan::gpu_test
