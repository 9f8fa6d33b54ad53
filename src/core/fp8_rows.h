// The row-wise FP8 (e4m3fn) quantisation scheme, one definition for the CPU reference (ops/fp8_ref.h)
// and the GPU quantiser (kernels/fp8_quant.h), so the two agree bit for bit. For a row x[0..K):
//   amax  = max_k |x_k|, taken as the integer max of the magnitude bits (exact and order-free; NaN and
//           inf patterns order above every finite value, so one non-finite element marks the row);
//   zero row (amax == 0):  scale = 1, every byte 0x00;
//   non-finite row:        scale = NaN, every byte 0x7F (e4m3 NaN): the error reaches the GEMM's
//                          output instead of vanishing;
//   otherwise a = max(amax, 2^-64) (below that 448 / a would overflow fp32 or the scale underflow; such
//           rows quantise to the small codes they give), inv = 448 / a (one correctly rounded fp32
//           division), q_k = e4m3(x_k · inv) (one correctly rounded fp32 multiply, then
//           wan::f32_to_f8e4m3: round to nearest even), scale = a / 448 (fp32).
// Dequantised value: f8e4m3_to_f32(q_k) · scale. |x_k · inv| <= 448·(1 + 2^-23), so the conversion
// only ever sees |v| < 464 (never NaN there), and an unfloored amax element becomes ±448 exactly.
// Device code spells every op as an _rn intrinsic (no contraction); host code builds with
// -ffp-contract=off.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "core/rn_math.h"

namespace wan::fp8 {

constexpr float kE4m3Max = 448.0f;
constexpr uint32_t kMinAmaxBits = 0x1F800000u;  // 2^-64
constexpr uint8_t kNanByte = 0x7F;

enum class RowKind : uint8_t { Finite, Zero, NonFinite };

struct RowScale {
  RowKind kind = RowKind::Zero;
  float inv = 0.0f;    // 448 / a (Finite rows)
  float scale = 1.0f;  // a / 448, 1 for zero rows, NaN for non-finite rows
};

// |x| as bits: the quantity whose integer max is the row's amax.
WAN_HD uint32_t abs_bits(float x) { return f32_bits(x) & 0x7FFFFFFFu; }

// The row's scale from amax_bits = max_k abs_bits(x_k).
WAN_HD RowScale row_scale(uint32_t amax_bits) {
  RowScale r;
  if (amax_bits == 0) return r;
  if (amax_bits >= 0x7F800000u) {
    r.kind = RowKind::NonFinite;
    r.scale = bits_f32(0x7FC00000u);
    return r;
  }
  const float a = bits_f32(amax_bits < kMinAmaxBits ? kMinAmaxBits : amax_bits);
  r.kind = RowKind::Finite;
  r.inv = rn::div(kE4m3Max, a);
  r.scale = rn::div(a, kE4m3Max);
  return r;
}

// The byte of every element of a Zero or NonFinite row.
WAN_HD uint8_t fill_byte(const RowScale& r) { return r.kind == RowKind::NonFinite ? kNanByte : 0x00; }

// One element, the reference conversion.
WAN_HD uint8_t quantize(float x, const RowScale& r) {
  if (r.kind != RowKind::Finite) return fill_byte(r);
  return f32_to_f8e4m3(rn::mul(x, r.inv));
}

WAN_HD float dequantize(uint8_t q, float scale) { return rn::mul(f8e4m3_to_f32(q), scale); }

}  // namespace wan::fp8
