// Element types and exact scalar conversions.
// Conversions follow PyTorch (c10/util/{BFloat16,Half,Float8_e4m3fn,Float8_e5m2}.h): round to
// nearest even; bf16 NaN -> 0x7FC0; f16 overflow -> inf; e4m3fn has no inf: |x| >= 480 (and inf,
// NaN) -> NaN 0x7F (sign kept); e5m2: |x| >= 65536 -> inf, NaN -> 0x7F (sign kept).
// These functions are __host__ __device__ so GPU kernels convert bit-identically.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#if defined(__CUDACC__)
#define WAN_HD __host__ __device__ __forceinline__
#else
#define WAN_HD inline
#endif

namespace wan {

enum class DType : uint8_t { F32, F64, F16, BF16, F8E4M3, F8E5M2, I64, I32, I16, I8, U8, Bool };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "f32", "bf16", ...
// safetensors dtype strings ("F32", "BF16", "F8_E4M3", ...); throws wan::Error for unknown ones.
DType dtype_from_safetensors(std::string_view s);
const char* dtype_to_safetensors(DType t);
bool dtype_is_float(DType t);

WAN_HD uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
WAN_HD float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// ---- bfloat16 ----
WAN_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;  // NaN (PyTorch: canonical positive NaN)
  uint32_t rounding_bias = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}
WAN_HD float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

// ---- float16 (IEEE binary16) ----
WAN_HD float f16_to_f32(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        mant <<= 1;
        ++e;
      } while ((mant & 0x400u) == 0);
      mant &= 0x3FFu;
      out = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 0x1F) {
    out = sign | 0x7F800000u | (mant << 13);
  } else {
    out = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  return bits_f32(out);
}
WAN_HD uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (a < 0x38800000u) {  // below the smallest normal (2^-14): subnormal or zero
    if (a < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to 0 (tie at 2^-25 -> even 0)
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126u - e;  // so that the result is m >> (shift) with 10-bit mantissa scale
    // value = m * 2^(e-150); f16 subnormal unit = 2^-24 -> q = m * 2^(e-126) = m >> (126-e)
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // normal: rebias exponent, round mantissa from 23 to 10 bits (carry may bump the exponent)
  uint32_t r = a - 0x38000000u;  // exponent - 112
  uint32_t q = r >> 13;
  uint32_t rem = r & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

// ---- float8 e4m3fn (bias 7, no inf, NaN = S.1111.111, max 448) ----
WAN_HD float f8e4m3_to_f32(uint8_t v) {
  uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  uint32_t exp = (v >> 3) & 0xFu;
  uint32_t mant = v & 0x7u;
  if (exp == 0xF && mant == 0x7) return bits_f32(sign | 0x7FC00000u);
  if (exp == 0) {
    if (mant == 0) return bits_f32(sign);
    float r = static_cast<float>(mant) * 0.001953125f;  // mant * 2^-9
    return (sign ? -r : r);
  }
  return bits_f32(sign | ((exp + 120u) << 23) | (mant << 20));
}
WAN_HD uint8_t f32_to_f8e4m3(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 24) & 0x80u;
  uint32_t a = u & 0x7FFFFFFFu;
  if (a >= 0x43F00000u) return static_cast<uint8_t>(sign | 0x7Fu);  // >= 480, inf, NaN -> NaN
  if (a < 0x3C800000u) {  // < 2^-6: subnormal range, unit 2^-9
    // q = round_half_even(a_value / 2^-9)
    if (a < 0x3A000000u) return static_cast<uint8_t>(sign);  // < 2^-11 (half of smallest 2^-10 step?)
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    // value = m * 2^(e-150); q = value / 2^-9 = m * 2^(e-141) = m >> (141 - e)
    uint32_t shift = 141u - e;
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint8_t>(sign | q);
  }
  uint32_t r = a - 0x3C000000u;  // rebias exponent by 120
  uint32_t q = r >> 20;
  uint32_t rem = r & 0xFFFFFu;
  if (rem > 0x80000u || (rem == 0x80000u && (q & 1u))) ++q;
  return static_cast<uint8_t>(sign | q);  // values in [464, 480) round to 448 (0x7E)
}

// ---- float8 e5m2 (bias 15, IEEE-like with inf) ----
WAN_HD float f8e5m2_to_f32(uint8_t v) { return f16_to_f32(static_cast<uint16_t>(v) << 8); }
WAN_HD uint8_t f32_to_f8e5m2(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 24) & 0x80u;
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint8_t>(sign | 0x7Fu);  // NaN
  if (a >= 0x47800000u) return static_cast<uint8_t>(sign | 0x7Cu);  // >= 65536 (and inf) -> inf
  if (a < 0x38800000u) {  // < 2^-14: subnormal, unit 2^-16
    if (a < 0x37000000u) return static_cast<uint8_t>(sign);  // < 2^-17 (tie to even 0 at 2^-17)
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    // q = value / 2^-16 = m * 2^(e-134) = m >> (134 - e)
    uint32_t shift = 134u - e;
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint8_t>(sign | q);
  }
  uint32_t r = a - 0x38000000u;  // rebias by 112
  uint32_t q = r >> 21;
  uint32_t rem = r & 0x1FFFFFu;
  if (rem > 0x100000u || (rem == 0x100000u && (q & 1u))) ++q;
  return static_cast<uint8_t>(sign | q);  // [57344+, 65536) may round up to 0x7C (inf) as PyTorch
}

// Converts n elements of any float dtype to f32 (dst) / from f32 (src). Throws for non-float types.
void convert_to_f32(DType src_type, const void* src, float* dst, size_t n);
void convert_from_f32(DType dst_type, const float* src, void* dst, size_t n);

}  // namespace wan
