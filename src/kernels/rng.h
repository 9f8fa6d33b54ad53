// GPU side of the engine RNG: fills device memory with the same values philox_normal gives on the host.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace wan::cuda {
// dst[i] = philox_normal(seed, offset + i), i < n (float32, device memory).
void philox_normal_fill(float* dst, size_t n, uint64_t seed, uint64_t offset, cudaStream_t stream);
// bf16 variant: dst[i] = bf16(philox_normal(seed, offset + i) * scale) (for random weights at real sizes).
void philox_normal_fill_bf16(uint16_t* dst, size_t n, uint64_t seed, uint64_t offset, float scale,
                             cudaStream_t stream);
int device_count();  // 0 when there is no usable device (no driver, no GPU): never throws
}  // namespace wan::cuda
