// ggml tensor types as GGUF files store them: the type ids (ggml's numbering, a file-format constant),
// their block geometry, and the CPU dequantisation of the supported ones.
// Invariants: gguf_dequantize is bit-identical to gguf-py's gguf.quants.dequantize (numpy float32:
// every product and sum rounded once, in gguf-py's order, no fused multiply-add — this file is built
// with -ffp-contract=off); f16 scales go through core/dtype.h's exact f16_to_f32. The GPU twin
// (kernels/gguf_dequant.cu) does the same float operations in the same order.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace wan {

// ggml's type ids (ggml.h `enum ggml_type`); ids 4 and 5 were removed from ggml and are unknown here.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9, Q2_K = 10, Q3_K = 11,
  Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19,
  IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28,
  IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct GgmlTypeInfo {
  GgmlType type;
  const char* name;     // "Q4_K", as ggml and gguf-py spell it
  uint32_t block_size;  // elements per block (1 for plain types)
  uint32_t type_size;   // bytes per block
  bool dequantizable;   // gguf_dequantize supports it
};

// The traits of a type id read from a file; nullopt for an id ggml does not define.
std::optional<GgmlTypeInfo> ggml_type_info(uint32_t id);
const GgmlTypeInfo& ggml_info(GgmlType t);  // a known type (throws Internal for a bad enum value)
const char* ggml_type_name(GgmlType t);
// A block type (block_size > 1): its bytes are not a plain array of elements.
bool ggml_is_quantized(GgmlType t);
// "F32 F16 Q4_0 ..." (the dequantizable types), for error messages.
std::string ggml_dequantizable_list();

// Bytes of n elements of type t; throws BadInput when n is not a whole number of blocks or the size
// overflows 64 bits.
uint64_t ggml_nbytes(GgmlType t, uint64_t n_elements);

// out[i] = element i of the tensor whose stored bytes are `blocks` (n_elements / block_size blocks),
// as float32. Throws BadInput for an unsupported type or n_elements not a multiple of the block size.
// Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
void gguf_dequantize(GgmlType t, const void* blocks, int64_t n_elements, float* out);

}  // namespace wan
