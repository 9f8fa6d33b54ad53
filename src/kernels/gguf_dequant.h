// GPU dequantisation of GGUF tensor data (ggml block types) to f32 or bf16 on a stream.
// The type is ggml's numeric type id as the file stores it (formats/gguf_quant.h's GgmlType values,
// the `ggml_type` a RawSpan will carry): kernels include only core, so the block geometry lives in
// the .cu as constants, not as the formats enum.
// Invariants: the f32 result is bit-identical to the CPU reference gguf_dequantize (same f32
// operations in the same order, __fmul_rn / __fadd_rn / __fsub_rn so nvcc cannot contract them into
// FMAs, f16 scales through core/dtype.h's f16_to_f32); bf16 output is that f32 rounded by core/dtype.h's
// f32_to_bf16 (nearest even, NaN -> 0x7FC0). Any n and alignment (16-byte-aligned dst is faster).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace wan::cuda {

// Whether gguf_dequantize_gpu handles this ggml type id: F32 (0), F16 (1), Q4_0 (2), Q4_1 (3),
// Q5_0 (6), Q5_1 (7), Q8_0 (8), Q2_K (10), Q3_K (11), Q4_K (12), Q5_K (13), Q6_K (14), BF16 (30).
bool gguf_gpu_supported(uint32_t ggml_type);

// dst[i] = element i of the n_elements-element tensor stored as `blocks_dev` (device memory), as
// `dst` (F32 or BF16). Enqueued on `stream`; throws wan::Error (BadInput) for an unsupported type or
// n_elements not a whole number of blocks, and for dst not F32 / BF16.
void gguf_dequantize_gpu(uint32_t ggml_type, const void* blocks_dev, int64_t n_elements, void* dst_dev, DType dst,
                         cudaStream_t stream);

}  // namespace wan::cuda
