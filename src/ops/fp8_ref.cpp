// The FP8 CPU reference of fp8_ref.h: the per-element arithmetic is core/fp8_rows.h's; this file only
// loops, multi-threaded over rows.
#include "ops/fp8_ref.h"

#include <array>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8_rows.h"
#include "core/thread_pool.h"
#include "ops/cpu_ops.h"

namespace wan::ops {
namespace {

// The 256 e4m3 codes as fp32 (NaN for 0x7F / 0xFF).
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int i = 0; i < 256; ++i) a[i] = f8e4m3_to_f32(static_cast<uint8_t>(i));
    return a;
  }();
  return t;
}

template <typename Load>
void quantize_rows(const Load& load, int64_t rows, int64_t K, uint8_t* q, float* scale) {
  WAN_CHECK(rows >= 0 && K >= 1, "quantize_rows_fp8: bad shape rows ", rows, " K ", K);
  parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      uint32_t amax = 0;
      for (int64_t k = 0; k < K; ++k) {
        const uint32_t a = fp8::abs_bits(load(r * K + k));
        amax = a > amax ? a : amax;
      }
      const fp8::RowScale rs = fp8::row_scale(amax);
      for (int64_t k = 0; k < K; ++k) q[r * K + k] = fp8::quantize(load(r * K + k), rs);
      scale[r] = rs.scale;
    }
  });
}

// Σ_k a[k]·b[k] exactly: every product of two e4m3 values is exact in fp32 and every partial sum exact
// in double (fp8_ref.h), so the eight independent accumulators give the same value in any order.
double exact_dot(const float* a, const float* b, int64_t K) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8)
    for (int j = 0; j < 8; ++j) acc[j] += static_cast<double>(a[k + j] * b[k + j]);
  for (; k < K; ++k) acc[0] += static_cast<double>(a[k] * b[k]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

void quantize_rows_fp8(const float* x, int64_t rows, int64_t K, uint8_t* q, float* scale) {
  quantize_rows([x](int64_t i) { return x[i]; }, rows, K, q, scale);
}

void quantize_rows_fp8(const uint16_t* x, int64_t rows, int64_t K, uint8_t* q, float* scale) {
  quantize_rows([x](int64_t i) { return bf16_to_f32(x[i]); }, rows, K, q, scale);
}

void dequantize_rows_fp8(const uint8_t* q, const float* scale, int64_t rows, int64_t K, float* y) {
  WAN_CHECK(rows >= 0 && K >= 1, "dequantize_rows_fp8: bad shape rows ", rows, " K ", K);
  parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t k = 0; k < K; ++k) y[r * K + k] = fp8::dequantize(q[r * K + k], scale[r]);
  });
}

void linear_fp8_ref(const uint8_t* xq, const float* scale_x, const uint8_t* wq, const float* scale_w,
                    const float* bias, float* y, int64_t M, int64_t K, int64_t N, bool gelu) {
  WAN_CHECK(M >= 0 && N >= 0 && K >= 1 && K <= (int64_t{1} << 17), "linear_fp8_ref: bad shape M ", M, " K ", K,
            " N ", N, " (K <= 2^17 keeps the sums exact)");
  const auto& t = e4m3_table();
  // Decoded operands: the weight once, each activation row inside its task.
  std::vector<float> wf(static_cast<size_t>(N * K));
  parallel_for(N * K, 1 << 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) wf[i] = t[wq[i]];
  });
  parallel_for(M, 1, [&](int64_t m0, int64_t m1) {
    std::vector<float> xf(static_cast<size_t>(K));
    for (int64_t m = m0; m < m1; ++m) {
      for (int64_t k = 0; k < K; ++k) xf[k] = t[xq[m * K + k]];
      for (int64_t n = 0; n < N; ++n) {
        const float sum = static_cast<float>(exact_dot(xf.data(), wf.data() + n * K, K));
        const float s = scale_x[m] * scale_w[n];
        float v = s * sum;
        if (bias) v += bias[n];
        y[m * N + n] = v;
      }
    }
  });
  if (gelu) gelu_tanh(y, y, M * N);
}

}  // namespace wan::ops
