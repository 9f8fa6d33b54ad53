// ggml type traits and the CPU dequantisation of GGUF tensors (the reference the GPU kernel matches).
// Block layouts are ggml's (ggml-common.h); the float arithmetic is gguf-py's (gguf/quants.py): each
// numpy float32 operation is one rounded C++ float operation here, in the same order, e.g. Q4_K is
// (d * sc) * q - (dmin * m) with three roundings and a rounded subtraction. No FMA: the build passes
// -ffp-contract=off. Bytes are read one at a time (blocks are not aligned: Q5_0's are 22 bytes).
// Large tensors are split over the thread pool by whole blocks (no effect on any value).
#include "formats/gguf_quant.h"

#include <algorithm>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace wan {
namespace {

constexpr int kQK = 256;  // super-block size of the K-quants

constexpr GgmlTypeInfo kTypes[] = {
    {GgmlType::F32, "F32", 1, 4, true},           {GgmlType::F16, "F16", 1, 2, true},
    {GgmlType::Q4_0, "Q4_0", 32, 18, true},       {GgmlType::Q4_1, "Q4_1", 32, 20, true},
    {GgmlType::Q5_0, "Q5_0", 32, 22, true},       {GgmlType::Q5_1, "Q5_1", 32, 24, true},
    {GgmlType::Q8_0, "Q8_0", 32, 34, true},       {GgmlType::Q8_1, "Q8_1", 32, 36, false},
    {GgmlType::Q2_K, "Q2_K", 256, 84, true},      {GgmlType::Q3_K, "Q3_K", 256, 110, true},
    {GgmlType::Q4_K, "Q4_K", 256, 144, true},     {GgmlType::Q5_K, "Q5_K", 256, 176, true},
    {GgmlType::Q6_K, "Q6_K", 256, 210, true},     {GgmlType::Q8_K, "Q8_K", 256, 292, false},
    {GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66, false}, {GgmlType::IQ2_XS, "IQ2_XS", 256, 74, false},
    {GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98, false}, {GgmlType::IQ1_S, "IQ1_S", 256, 50, false},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 18, false},  {GgmlType::IQ3_S, "IQ3_S", 256, 110, false},
    {GgmlType::IQ2_S, "IQ2_S", 256, 82, false},   {GgmlType::IQ4_XS, "IQ4_XS", 256, 136, false},
    {GgmlType::I8, "I8", 1, 1, false},            {GgmlType::I16, "I16", 1, 2, false},
    {GgmlType::I32, "I32", 1, 4, false},          {GgmlType::I64, "I64", 1, 8, false},
    {GgmlType::F64, "F64", 1, 8, false},          {GgmlType::IQ1_M, "IQ1_M", 256, 56, false},
    {GgmlType::BF16, "BF16", 1, 2, true},         {GgmlType::TQ1_0, "TQ1_0", 256, 54, false},
    {GgmlType::TQ2_0, "TQ2_0", 256, 66, false},   {GgmlType::MXFP4, "MXFP4", 32, 17, false},
};

inline float h2f(const uint8_t* p) { return f16_to_f32(static_cast<uint16_t>(p[0] | (p[1] << 8))); }
inline uint32_t u32le(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

// ---- 32-element blocks ----
void deq_q4_0(const uint8_t* b, float* y) {
  const float d = h2f(b);
  for (int j = 0; j < 32; ++j) {
    const int q = ((b[2 + (j & 15)] >> (j < 16 ? 0 : 4)) & 0xF) - 8;
    y[j] = d * static_cast<float>(q);
  }
}
void deq_q4_1(const uint8_t* b, float* y) {
  const float d = h2f(b), m = h2f(b + 2);
  for (int j = 0; j < 32; ++j) {
    const int q = (b[4 + (j & 15)] >> (j < 16 ? 0 : 4)) & 0xF;
    const float t = d * static_cast<float>(q);
    y[j] = t + m;
  }
}
void deq_q5_0(const uint8_t* b, float* y) {
  const float d = h2f(b);
  const uint32_t qh = u32le(b + 2);
  for (int j = 0; j < 32; ++j) {
    const int lo = (b[6 + (j & 15)] >> (j < 16 ? 0 : 4)) & 0xF;
    const int q = (lo | static_cast<int>(((qh >> j) & 1u) << 4)) - 16;
    y[j] = d * static_cast<float>(q);
  }
}
void deq_q5_1(const uint8_t* b, float* y) {
  const float d = h2f(b), m = h2f(b + 2);
  const uint32_t qh = u32le(b + 4);
  for (int j = 0; j < 32; ++j) {
    const int lo = (b[8 + (j & 15)] >> (j < 16 ? 0 : 4)) & 0xF;
    const int q = lo | static_cast<int>(((qh >> j) & 1u) << 4);
    const float t = d * static_cast<float>(q);
    y[j] = t + m;
  }
}
void deq_q8_0(const uint8_t* b, float* y) {
  const float d = h2f(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// ---- 256-element super-blocks ----
void deq_q2_k(const uint8_t* b, float* y) {
  const uint8_t* sc = b;
  const uint8_t* qs = b + 16;
  const float d = h2f(b + 80), dmin = h2f(b + 82);
  for (int i = 0; i < kQK; ++i) {
    const int h = i >> 7, s = (i >> 5) & 3, l = i & 31;
    const int q = (qs[h * 32 + l] >> (2 * s)) & 3;
    const uint8_t g = sc[i >> 4];
    const float dl = d * static_cast<float>(g & 0xF);
    const float ml = dmin * static_cast<float>(g >> 4);
    const float t = dl * static_cast<float>(q);
    y[i] = t - ml;
  }
}
void deq_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = h2f(b + 108);
  float dl[16];
  for (int k = 0; k < 16; ++k) {
    const int lo = (k < 8 ? sc[k] : sc[k - 8] >> 4) & 0xF;
    const int hi = (sc[8 + (k & 3)] >> (2 * (k >> 2))) & 3;
    dl[k] = d * static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(lo | (hi << 4))) - 32);
  }
  for (int i = 0; i < kQK; ++i) {
    const int h = i >> 7, s = (i >> 5) & 3, l = i & 31;
    const int ql = (qs[h * 32 + l] >> (2 * s)) & 3;
    const int qh = ((hmask[l] >> (i >> 5)) & 1) ^ 1;
    y[i] = dl[i >> 4] * static_cast<float>(ql - (qh << 2));
  }
}
// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block (12 packed bytes).
inline void scale_min_k4(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 0x3F;
    *m = s[j + 4] & 0x3F;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
    *m = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
  }
}
void deq_q45_k(const uint8_t* b, float* y, bool five) {
  const float d = h2f(b), dmin = h2f(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;                  // Q5_K only
  const uint8_t* qs = b + (five ? 48 : 16);
  for (int j = 0; j < 8; ++j) {
    int sc = 0, m = 0;
    scale_min_k4(scales, j, &sc, &m);
    const float dj = d * static_cast<float>(sc);
    const float mj = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) {
      int q = (qs[(j >> 1) * 32 + l] >> ((j & 1) * 4)) & 0xF;
      if (five) q |= ((qh[l] >> j) & 1) << 4;
      const float t = dj * static_cast<float>(q);
      y[j * 32 + l] = t - mj;
    }
  }
}
void deq_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const uint8_t* sc = b + 192;
  const float d = h2f(b + 208);
  float ds[16];
  for (int k = 0; k < 16; ++k) ds[k] = d * static_cast<float>(static_cast<int8_t>(sc[k]));
  // Element h*128 + s*32 + l (s = 0..3) takes the low (s even) or high nibble of ql[h*64 + (s&1)*32 + l]
  // and bits 2s..2s+1 of qh[h*32 + l].
  for (int h = 0; h < 2; ++h) {
    for (int s = 0; s < 4; ++s) {
      const uint8_t* lq = ql + h * 64 + (s & 1) * 32;
      const uint8_t* hq = qh + h * 32;
      float* out = y + h * 128 + s * 32;
      const float* dss = ds + h * 8 + s * 2;
      for (int l = 0; l < 32; ++l) {
        const int q = (((lq[l] >> ((s >> 1) * 4)) & 0xF) | (((hq[l] >> (2 * s)) & 3) << 4)) - 32;
        out[l] = dss[l >> 4] * static_cast<float>(q);
      }
    }
  }
}

}  // namespace

std::optional<GgmlTypeInfo> ggml_type_info(uint32_t id) {
  for (const GgmlTypeInfo& t : kTypes)
    if (static_cast<uint32_t>(t.type) == id) return t;
  return std::nullopt;
}

const GgmlTypeInfo& ggml_info(GgmlType t) {
  for (const GgmlTypeInfo& i : kTypes)
    if (i.type == t) return i;
  WAN_THROW_INTERNAL("ggml type id ", static_cast<uint32_t>(t), " is not known");
}

const char* ggml_type_name(GgmlType t) { return ggml_info(t).name; }
bool ggml_is_quantized(GgmlType t) { return ggml_info(t).block_size > 1; }

std::string ggml_dequantizable_list() {
  std::string s;
  for (const GgmlTypeInfo& t : kTypes)
    if (t.dequantizable) s += cat(s.empty() ? "" : " ", t.name);
  return s;
}

uint64_t ggml_nbytes(GgmlType t, uint64_t n_elements) {
  const GgmlTypeInfo& i = ggml_info(t);
  WAN_CHECK(n_elements % i.block_size == 0, n_elements, " elements of ", i.name, " are not a whole number of ",
            i.block_size, "-element blocks");
  uint64_t bytes = 0;
  WAN_CHECK(!__builtin_mul_overflow(n_elements / i.block_size, static_cast<uint64_t>(i.type_size), &bytes),
            n_elements, " elements of ", i.name, " overflow 64 bits of bytes");
  return bytes;
}

namespace {

// Blocks [k0, k1) of a tensor of type t (one block = one element for the plain types).
void dequantize_blocks(GgmlType t, const GgmlTypeInfo& info, const uint8_t* p, int64_t k0, int64_t k1, float* out) {
  const size_t ts = info.type_size, bs = info.block_size;
  switch (t) {
    case GgmlType::F32:
      if (k1 > k0) std::memcpy(out + k0, p + 4 * k0, static_cast<size_t>(k1 - k0) * 4);
      return;
    case GgmlType::F16:
      for (int64_t i = k0; i < k1; ++i) out[i] = h2f(p + 2 * i);
      return;
    case GgmlType::BF16:
      for (int64_t i = k0; i < k1; ++i) out[i] = bf16_to_f32(static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)));
      return;
    default:
      break;
  }
  for (int64_t k = k0; k < k1; ++k) {
    const uint8_t* b = p + static_cast<size_t>(k) * ts;
    float* y = out + static_cast<size_t>(k) * bs;
    switch (t) {
      case GgmlType::Q4_0: deq_q4_0(b, y); break;
      case GgmlType::Q4_1: deq_q4_1(b, y); break;
      case GgmlType::Q5_0: deq_q5_0(b, y); break;
      case GgmlType::Q5_1: deq_q5_1(b, y); break;
      case GgmlType::Q8_0: deq_q8_0(b, y); break;
      case GgmlType::Q2_K: deq_q2_k(b, y); break;
      case GgmlType::Q3_K: deq_q3_k(b, y); break;
      case GgmlType::Q4_K: deq_q45_k(b, y, false); break;
      case GgmlType::Q5_K: deq_q45_k(b, y, true); break;
      case GgmlType::Q6_K: deq_q6_k(b, y); break;
      default: WAN_THROW_INTERNAL("no dequantizer for ", info.name);
    }
  }
}

}  // namespace

void gguf_dequantize(GgmlType t, const void* blocks, int64_t n_elements, float* out) {
  const GgmlTypeInfo& info = ggml_info(t);
  WAN_CHECK(info.dequantizable, "cannot dequantize ggml type ", info.name, " (supported: ", ggml_dequantizable_list(),
            ")");
  WAN_CHECK(n_elements >= 0 && n_elements % info.block_size == 0, n_elements, " elements of ", info.name,
            " are not a whole number of ", info.block_size, "-element blocks");
  const auto* p = static_cast<const uint8_t*>(blocks);
  const int64_t n_blocks = n_elements / info.block_size;
  // Each block is independent, so splitting the work over threads changes no result.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / info.block_size);
  if (n_blocks <= grain) return dequantize_blocks(t, info, p, 0, n_blocks, out);
  parallel_for(n_blocks, grain, [&](int64_t k0, int64_t k1) { dequantize_blocks(t, info, p, k0, k1, out); });
}

}  // namespace wan
