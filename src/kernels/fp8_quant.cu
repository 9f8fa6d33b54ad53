// Row-wise e4m3 quantisation kernels (see fp8_quant.h): one block per row, an integer-max reduction of
// the magnitude bits, core/fp8_rows.h's row scale, then the conversion.
#include "kernels/fp8_quant.h"

#include <cuda_fp8.h>

#include <algorithm>
#include <climits>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8_rows.h"
#include "kernels/check.h"
#include "kernels/fp8_cvt.cuh"

namespace wan::cuda {
namespace {

constexpr int kChunk = 8;                // elements per chunk: one 16-byte bf16 vector, two fp32 vectors
constexpr int kRowThreads = 256;         // block size the launcher aims for (enough loads in flight per SM)
constexpr int kMaxRowThreads = 512;      // with 8 chunks per thread: K <= 32768 stays in registers
constexpr int kMaxChunksPerThread = 8;   // 64 values in registers per thread at most

// Eight consecutive elements, kept raw between the two passes (4 registers for bf16, 8 for fp32).
template <typename T>
struct Chunk;
template <>
struct Chunk<__nv_bfloat16> {
  uint4 u;
  __device__ __forceinline__ void load(const __nv_bfloat16* p) { u = __ldcs(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ void unpack(float (&v)[kChunk]) const {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = __uint_as_float(w[i] << 16);
      v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
  }
};
template <>
struct Chunk<float> {
  float4 a, b;
  __device__ __forceinline__ void load(const float* p) {
    a = __ldcs(reinterpret_cast<const float4*>(p));
    b = __ldcs(reinterpret_cast<const float4*>(p) + 1);
  }
  __device__ __forceinline__ void unpack(float (&v)[kChunk]) const {
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
};

__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(float v) { return v; }

// Max over the block (blockDim.x a multiple of 32, at most kMaxRowThreads); every thread gets it.
__device__ __forceinline__ uint32_t block_max(uint32_t v) {
  __shared__ uint32_t smem[32];
  return block_reduce(v, smem, 0u, MaxU32Op{});
}

// K % 8 == 0, aligned rows: thread t holds chunks t, t + blockDim, ... (at most kChunks) in registers.
template <typename T, int kChunks>
__global__ void __launch_bounds__(kMaxRowThreads)
    quantize_rows_vec_kernel(const T* __restrict__ x, int64_t K, uint8_t* __restrict__ q, float* __restrict__ scale) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * K;
  uint8_t* qr = q + row * K;
  const int chunks = static_cast<int>(K / kChunk);
  Chunk<T> c[kChunks];
  uint32_t amax = 0;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int idx = threadIdx.x + j * blockDim.x;
    if (idx < chunks) {
      c[j].load(xr + static_cast<int64_t>(idx) * kChunk);
      float v[kChunk];
      c[j].unpack(v);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) amax = max(amax, fp8::abs_bits(v[i]));
    }
  }
  const fp8::RowScale rs = fp8::row_scale(block_max(amax));
  if (threadIdx.x == 0) scale[row] = rs.scale;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int idx = threadIdx.x + j * blockDim.x;
    if (idx >= chunks) continue;
    float v[kChunk];
    c[j].unpack(v);
    *reinterpret_cast<uint2*>(qr + static_cast<int64_t>(idx) * kChunk) = quantize8(v, rs);
  }
}

// Any K and alignment: element loops, the row read twice (the second time mostly from L2).
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    quantize_rows_any_kernel(const T* __restrict__ x, int64_t K, uint8_t* __restrict__ q, float* __restrict__ scale) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * K;
  uint8_t* qr = q + row * K;
  uint32_t amax = 0;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) amax = max(amax, fp8::abs_bits(to_f32(xr[k])));
  const fp8::RowScale rs = fp8::row_scale(block_max(amax));
  if (threadIdx.x == 0) scale[row] = rs.scale;
  const bool finite = rs.kind == fp8::RowKind::Finite;
  const uint8_t fill = fp8::fill_byte(rs);
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
    qr[k] = finite ? static_cast<uint8_t>(cvt_e4m3x2(rn::mul(to_f32(xr[k]), rs.inv), 0.0f) & 0xFFu) : fill;
}

__global__ void dequantize_rows_kernel(const uint8_t* __restrict__ q, const float* __restrict__ scale, int64_t rows,
                                       int64_t K, float* __restrict__ y) {
  const int64_t n = rows * K, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = fp8::dequantize(q[i], scale[i / K]);
}

__global__ void check_cvt_kernel(uint32_t begin, uint32_t end, unsigned long long* mismatches, unsigned int* first) {
  const uint64_t n = static_cast<uint64_t>(end) - begin, stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long bad = 0;
  unsigned int first_bad = 0xFFFFFFFFu;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint32_t b = begin + static_cast<uint32_t>(i);
    const float v = __uint_as_float(b), w = __uint_as_float(b ^ 0x80000000u);
    const uint32_t got = cvt_e4m3x2(v, w);
    const uint32_t want = static_cast<uint32_t>(f32_to_f8e4m3(v)) | (static_cast<uint32_t>(f32_to_f8e4m3(w)) << 8);
    if (got != want) {
      ++bad;
      first_bad = min(first_bad, b);
    }
  }
  if (bad) {
    atomicAdd(mismatches, bad);
    atomicMin(first, first_bad);
  }
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename T>
void launch_quantize(const T* x, int64_t rows, int64_t K, uint8_t* q, float* scale, cudaStream_t stream) {
  WAN_CHECK(rows >= 0 && K >= 1, "quantize_rows_fp8: bad shape rows ", rows, " K ", K);
  WAN_CHECK(rows <= INT_MAX, "quantize_rows_fp8: ", rows, " rows (one block per row: at most ", INT_MAX, ")");
  if (rows == 0) return;
  WAN_CHECK(x && q && scale, "quantize_rows_fp8: null x, q or scale");
  const int64_t chunks = K / kChunk;
  const bool vec = K % kChunk == 0 && aligned(x, 16) && aligned(q, 8) &&
                   chunks <= int64_t{kMaxChunksPerThread} * kMaxRowThreads;
  const unsigned grid = static_cast<unsigned>(rows);
  if (!vec) {
    const int threads = static_cast<int>(std::min<int64_t>(kRowThreads, ceil_div(K, 32) * 32));
    quantize_rows_any_kernel<T><<<grid, threads, 0, stream>>>(x, K, q, scale);
    CUDA_CHECK_LAUNCH();
    return;
  }
  // Fewest chunks per thread that keep the block at kRowThreads (up to kMaxRowThreads for the longest rows).
  int per = 1;
  while (per < kMaxChunksPerThread && ceil_div(chunks, per) > kRowThreads) per *= 2;
  const int threads = static_cast<int>(ceil_div(ceil_div(chunks, per), 32) * 32);
  switch (per) {
    case 1: quantize_rows_vec_kernel<T, 1><<<grid, threads, 0, stream>>>(x, K, q, scale); break;
    case 2: quantize_rows_vec_kernel<T, 2><<<grid, threads, 0, stream>>>(x, K, q, scale); break;
    case 4: quantize_rows_vec_kernel<T, 4><<<grid, threads, 0, stream>>>(x, K, q, scale); break;
    default: quantize_rows_vec_kernel<T, 8><<<grid, threads, 0, stream>>>(x, K, q, scale); break;
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void quantize_rows_fp8(const __nv_bfloat16* x, int64_t rows, int64_t K, uint8_t* q, float* scale,
                       cudaStream_t stream) {
  launch_quantize(x, rows, K, q, scale, stream);
}

void quantize_rows_fp8(const float* x, int64_t rows, int64_t K, uint8_t* q, float* scale, cudaStream_t stream) {
  launch_quantize(x, rows, K, q, scale, stream);
}

void dequantize_rows_fp8(const uint8_t* q, const float* scale, int64_t rows, int64_t K, float* y,
                         cudaStream_t stream) {
  WAN_CHECK(rows >= 0 && K >= 1, "dequantize_rows_fp8: bad shape rows ", rows, " K ", K);
  if (rows == 0) return;
  WAN_CHECK(q && scale && y, "dequantize_rows_fp8: null q, scale or y");
  const int64_t blocks = std::min<int64_t>(ceil_div(rows * K, 256), 65535);
  dequantize_rows_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(q, scale, rows, K, y);
  CUDA_CHECK_LAUNCH();
}

E4m3CvtCheck check_e4m3_conversion(uint32_t begin, uint32_t end, cudaStream_t stream) {
  WAN_CHECK(begin <= end, "check_e4m3_conversion: empty range [", begin, ", ", end, ")");
  E4m3CvtCheck r;
  r.checked = static_cast<uint64_t>(end) - begin;
  if (r.checked == 0) return r;
  unsigned long long* d_bad = nullptr;
  unsigned int* d_first = nullptr;
  CUDA_CHECK(cudaMalloc(&d_bad, sizeof(*d_bad)));
  try {
    CUDA_CHECK(cudaMalloc(&d_first, sizeof(*d_first)));
    CUDA_CHECK(cudaMemsetAsync(d_bad, 0, sizeof(*d_bad), stream));
    CUDA_CHECK(cudaMemsetAsync(d_first, 0xFF, sizeof(*d_first), stream));
    check_cvt_kernel<<<4096, 256, 0, stream>>>(begin, end, d_bad, d_first);
    CUDA_CHECK_LAUNCH();
    unsigned long long bad = 0;
    unsigned int first = 0;
    CUDA_CHECK(cudaMemcpyAsync(&bad, d_bad, sizeof(bad), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaMemcpyAsync(&first, d_first, sizeof(first), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    r.mismatches = bad;
    r.first_mismatch = first;
  } catch (...) {
    cudaFree(d_bad);
    cudaFree(d_first);
    throw;
  }
  cudaFree(d_bad);
  cudaFree(d_first);
  return r;
}

}  // namespace wan::cuda
