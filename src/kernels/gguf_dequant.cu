// GGUF dequantisation kernels: one template instance per ggml type; each thread produces 8 consecutive
// elements (every block size is a multiple of 8, so they share one block) and stores them as one or
// two 16-byte vectors when dst is 16-byte aligned. The per-element arithmetic mirrors
// formats/gguf_quant.cpp operation for operation, with explicitly rounded intrinsics (no FMA).
// Block bytes are read one at a time: blocks are not aligned (Q5_0's are 22 bytes).
#include "kernels/gguf_dequant.h"

#include "core/error.h"
#include "kernels/check.h"

namespace wan::cuda {
namespace {

struct Geometry {
  uint32_t id, block, bytes;
};
// ggml's block geometry (ggml-common.h) of the supported types.
constexpr Geometry kGeometry[] = {{0, 1, 4},     {1, 1, 2},     {30, 1, 2},    {2, 32, 18},   {3, 32, 20},
                                  {6, 32, 22},   {7, 32, 24},   {8, 32, 34},   {10, 256, 84}, {11, 256, 110},
                                  {12, 256, 144}, {13, 256, 176}, {14, 256, 210}};

const Geometry* geometry(uint32_t id) {
  for (const Geometry& g : kGeometry)
    if (g.id == id) return &g;
  return nullptr;
}

__device__ __forceinline__ float h2f(const uint8_t* p) {
  return f16_to_f32(static_cast<uint16_t>(p[0] | (p[1] << 8)));
}
__device__ __forceinline__ uint32_t u32le(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

// Element j of the block at b, for type T (the CPU reference's arithmetic, element by element).
template <uint32_t T>
__device__ __forceinline__ float element(const uint8_t* b, int j) {
  if constexpr (T == 0) {
    return bits_f32(u32le(b));
  } else if constexpr (T == 1) {
    return h2f(b);
  } else if constexpr (T == 30) {
    return bf16_to_f32(static_cast<uint16_t>(b[0] | (b[1] << 8)));
  } else if constexpr (T == 2) {  // Q4_0: d * (q - 8)
    const int q = ((b[2 + (j & 15)] >> (j < 16 ? 0 : 4)) & 0xF) - 8;
    return __fmul_rn(h2f(b), static_cast<float>(q));
  } else if constexpr (T == 3) {  // Q4_1: d * q + m
    const int q = (b[4 + (j & 15)] >> (j < 16 ? 0 : 4)) & 0xF;
    return __fadd_rn(__fmul_rn(h2f(b), static_cast<float>(q)), h2f(b + 2));
  } else if constexpr (T == 6) {  // Q5_0: d * (q - 16)
    const int lo = (b[6 + (j & 15)] >> (j < 16 ? 0 : 4)) & 0xF;
    const int q = (lo | static_cast<int>(((u32le(b + 2) >> j) & 1u) << 4)) - 16;
    return __fmul_rn(h2f(b), static_cast<float>(q));
  } else if constexpr (T == 7) {  // Q5_1: d * q + m
    const int lo = (b[8 + (j & 15)] >> (j < 16 ? 0 : 4)) & 0xF;
    const int q = lo | static_cast<int>(((u32le(b + 4) >> j) & 1u) << 4);
    return __fadd_rn(__fmul_rn(h2f(b), static_cast<float>(q)), h2f(b + 2));
  } else if constexpr (T == 8) {  // Q8_0: q * d
    return __fmul_rn(static_cast<float>(static_cast<int8_t>(b[2 + j])), h2f(b));
  } else if constexpr (T == 10) {  // Q2_K: (d * sc) * q - (dmin * m)
    const int q = (b[16 + (j >> 7) * 32 + (j & 31)] >> (2 * ((j >> 5) & 3))) & 3;
    const uint8_t g = b[j >> 4];
    const float dl = __fmul_rn(h2f(b + 80), static_cast<float>(g & 0xF));
    const float ml = __fmul_rn(h2f(b + 82), static_cast<float>(g >> 4));
    return __fsub_rn(__fmul_rn(dl, static_cast<float>(q)), ml);
  } else if constexpr (T == 11) {  // Q3_K: (d * (sc - 32)) * q
    const uint8_t* sc = b + 96;
    const int k = j >> 4;
    const int lo = (k < 8 ? sc[k] : sc[k - 8] >> 4) & 0xF;
    const int hi = (sc[8 + (k & 3)] >> (2 * (k >> 2))) & 3;
    const float dl =
        __fmul_rn(h2f(b + 108), static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(lo | (hi << 4))) - 32));
    const int ql = (b[32 + (j >> 7) * 32 + (j & 31)] >> (2 * ((j >> 5) & 3))) & 3;
    const int qh = ((b[j & 31] >> (j >> 5)) & 1) ^ 1;
    return __fmul_rn(dl, static_cast<float>(ql - (qh << 2)));
  } else if constexpr (T == 12 || T == 13) {  // Q4_K / Q5_K: (d * sc) * q - (dmin * m)
    const uint8_t* s = b + 4;
    const int sub = j >> 5, l = j & 31;
    int sc, m;
    if (sub < 4) {
      sc = s[sub] & 0x3F;
      m = s[sub + 4] & 0x3F;
    } else {
      sc = (s[sub + 4] & 0x0F) | ((s[sub - 4] >> 2) & 0x30);
      m = (s[sub + 4] >> 4) | ((s[sub] >> 2) & 0x30);
    }
    int q = (b[(T == 13 ? 48 : 16) + (sub >> 1) * 32 + l] >> ((sub & 1) * 4)) & 0xF;
    if constexpr (T == 13) q |= ((b[16 + l] >> sub) & 1) << 4;
    const float dj = __fmul_rn(h2f(b), static_cast<float>(sc));
    const float mj = __fmul_rn(h2f(b + 2), static_cast<float>(m));
    return __fsub_rn(__fmul_rn(dj, static_cast<float>(q)), mj);
  } else {  // Q6_K (14): (d * sc) * (q - 32)
    const int h = j >> 7, r = j & 127;
    const int lo = (b[h * 64 + (r & 63)] >> ((r >> 6) * 4)) & 0xF;
    const int hi = (b[128 + h * 32 + (r & 31)] >> (2 * (r >> 5))) & 3;
    const float ds = __fmul_rn(h2f(b + 208), static_cast<float>(static_cast<int8_t>(b[192 + (j >> 4)])));
    return __fmul_rn(ds, static_cast<float>((lo | (hi << 4)) - 32));
  }
}

template <uint32_t T, int BS, int TS>
__global__ void dequant_kernel(const uint8_t* __restrict__ src, int64_t n, void* __restrict__ dst, bool bf16,
                               bool vec) {
  const int64_t groups = (n + 7) / 8;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups; g += int64_t{gridDim.x} * blockDim.x) {
    const int64_t e0 = g * 8;
    const int cnt = n - e0 < 8 ? static_cast<int>(n - e0) : 8;
    const uint8_t* b = src + (e0 / BS) * TS;
    const int j0 = static_cast<int>(e0 % BS);
    float y[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) y[k] = k < cnt ? element<T>(b + (BS == 1 ? k * TS : 0), j0 + k) : 0.0f;
    if (bf16) {
      uint16_t h[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) h[k] = f32_to_bf16(y[k]);
      uint16_t* o = static_cast<uint16_t*>(dst) + e0;
      if (vec && cnt == 8) {
        uint4 v;
        v.x = h[0] | (static_cast<uint32_t>(h[1]) << 16);
        v.y = h[2] | (static_cast<uint32_t>(h[3]) << 16);
        v.z = h[4] | (static_cast<uint32_t>(h[5]) << 16);
        v.w = h[6] | (static_cast<uint32_t>(h[7]) << 16);
        *reinterpret_cast<uint4*>(o) = v;
      } else {
        for (int k = 0; k < cnt; ++k) o[k] = h[k];
      }
    } else {
      float* o = static_cast<float*>(dst) + e0;
      if (vec && cnt == 8) {
        reinterpret_cast<float4*>(o)[0] = make_float4(y[0], y[1], y[2], y[3]);
        reinterpret_cast<float4*>(o)[1] = make_float4(y[4], y[5], y[6], y[7]);
      } else {
        for (int k = 0; k < cnt; ++k) o[k] = y[k];
      }
    }
  }
}

template <uint32_t T, int BS, int TS>
void launch(const void* src, int64_t n, void* dst, bool bf16, cudaStream_t stream) {
  const int64_t groups = (n + 7) / 8;
  const int64_t blocks = (groups + 255) / 256;
  const unsigned grid = static_cast<unsigned>(blocks > 65535 * 16 ? 65535 * 16 : blocks);
  const bool vec = reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  dequant_kernel<T, BS, TS><<<grid, 256, 0, stream>>>(static_cast<const uint8_t*>(src), n, dst, bf16, vec);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool gguf_gpu_supported(uint32_t ggml_type) { return geometry(ggml_type) != nullptr; }

void gguf_dequantize_gpu(uint32_t ggml_type, const void* blocks_dev, int64_t n_elements, void* dst_dev, DType dst,
                         cudaStream_t stream) {
  const Geometry* g = geometry(ggml_type);
  WAN_CHECK(g != nullptr, "GPU dequantisation does not support ggml type id ", ggml_type);
  WAN_CHECK(n_elements >= 0 && n_elements % g->block == 0, n_elements, " elements of ggml type id ", ggml_type,
            " are not a whole number of ", g->block, "-element blocks");
  WAN_CHECK(dst == DType::F32 || dst == DType::BF16, "GPU dequantisation writes f32 or bf16, not ", dtype_name(dst));
  if (n_elements == 0) return;
  const bool bf16 = dst == DType::BF16;
  switch (ggml_type) {
    case 0: return launch<0, 1, 4>(blocks_dev, n_elements, dst_dev, bf16, stream);
    case 1: return launch<1, 1, 2>(blocks_dev, n_elements, dst_dev, bf16, stream);
    case 30: return launch<30, 1, 2>(blocks_dev, n_elements, dst_dev, bf16, stream);
    case 2: return launch<2, 32, 18>(blocks_dev, n_elements, dst_dev, bf16, stream);
    case 3: return launch<3, 32, 20>(blocks_dev, n_elements, dst_dev, bf16, stream);
    case 6: return launch<6, 32, 22>(blocks_dev, n_elements, dst_dev, bf16, stream);
    case 7: return launch<7, 32, 24>(blocks_dev, n_elements, dst_dev, bf16, stream);
    case 8: return launch<8, 32, 34>(blocks_dev, n_elements, dst_dev, bf16, stream);
    case 10: return launch<10, 256, 84>(blocks_dev, n_elements, dst_dev, bf16, stream);
    case 11: return launch<11, 256, 110>(blocks_dev, n_elements, dst_dev, bf16, stream);
    case 12: return launch<12, 256, 144>(blocks_dev, n_elements, dst_dev, bf16, stream);
    case 13: return launch<13, 256, 176>(blocks_dev, n_elements, dst_dev, bf16, stream);
    case 14: return launch<14, 256, 210>(blocks_dev, n_elements, dst_dev, bf16, stream);
    default: WAN_THROW_INTERNAL("ggml type id ", ggml_type, " has geometry but no kernel");
  }
}

}  // namespace wan::cuda
