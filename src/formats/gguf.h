// GGUF reading (memory-mapped, zero-copy, strictly validated): the quantised-model format of ggml,
// llama.cpp, stable-diffusion.cpp and ComfyUI-GGUF. Little-endian versions 2 and 3: "GGUF", u32
// version, u64 tensor count, u64 KV count, the KVs (string key, u32 value type, value), the tensor
// infos (name, u32 n_dims, u64 ne[n_dims] innermost first, u32 ggml type, u64 offset), padding to the
// alignment (general.alignment, u32 power of two, default 32), then the data section.
// Invariants: open() validates everything before returning and never allocates more than a small
// multiple of the file size: every count, length and offset is checked against the bytes left before
// use, with overflow-safe arithmetic; unknown value or ggml types, nested arrays, duplicate keys or
// tensor names, a row (ne[0]) that is not whole blocks, offsets not aligned, outside the data section
// or overlapping another tensor are each one wan::Error "<file>: [tensor '<name>': ]<problem>".
// n_dims may be 5 (ComfyUI-GGUF's fix_5d_tensors.py stores Wan's patch_embedding so), not more.
// Tensor views hold a shared_ptr to the mapping and never outlive it.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/mmap.h"
#include "core/tensor.h"
#include "formats/gguf_quant.h"

namespace wan {

constexpr uint32_t kGgufMaxDims = 5;
constexpr uint32_t kGgufDefaultAlignment = 32;

enum class GgufValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9,
  U64 = 10, I64 = 11, F64 = 12,
};
const char* gguf_value_type_name(GgufValueType t);  // "u32", "string", "array", ...
// Bytes of one scalar of type t (bool 1); 0 for String, Array and unknown types.
uint64_t gguf_scalar_size(GgufValueType t);

// One KV value. Scalars keep their bits in `bits` (little-endian value zero-extended to 64 bits; bool:
// 0 or 1); arrays of scalars keep the elements' file bytes in `raw`; arrays of strings in `strings`.
struct GgufValue {
  GgufValueType type = GgufValueType::U8;
  uint64_t bits = 0;
  std::string str;                   // String
  GgufValueType elem_type = GgufValueType::U8;  // Array
  uint64_t count = 0;                // Array: number of elements
  std::string raw;                   // Array of scalars: count * element size bytes
  std::vector<std::string> strings;  // Array of strings

  bool is_int() const;    // an integer type (not bool)
  bool is_float() const;  // F32 or F64
  // The value as a number; throws BadInput when it is not an integer (resp. number) or does not fit.
  int64_t as_i64() const;
  uint64_t as_u64() const;
  double as_f64() const;
  // Element i of an array of numbers (or bools) as a number; throws for strings or a bad index.
  int64_t array_i64(uint64_t i) const;
  double array_f64(uint64_t i) const;
  std::string str_brief() const;  // short text for inspect / errors
};

struct GgufKV {
  std::string key;
  GgufValue value;
};

struct GgufTensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  std::array<uint64_t, kGgufMaxDims> ne{};  // ggml order: ne[0] is the innermost (row) dimension
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;  // from the start of the data section (a multiple of the alignment)
  uint64_t numel = 0;
  uint64_t nbytes = 0;
  // The torch shape: ne reversed (ne[n_dims-1], ..., ne[0]); n_dims 0 is a scalar.
  Shape torch_shape() const;
};

class GgufFile {
 public:
  static std::shared_ptr<GgufFile> open(const std::string& path);
  const std::string& path() const { return file_->path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_start() const { return data_start_; }  // absolute file offset of the data section
  const std::vector<GgufKV>& metadata() const { return kv_; }  // in file order
  const GgufValue* find_kv(const std::string& key) const;   // nullptr if absent
  // general.architecture when present and a string, else "".
  std::string architecture() const;
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }  // in file order
  const GgufTensorInfo* find(const std::string& name) const;  // nullptr if absent
  // The stored bytes of a tensor (t.nbytes of them), inside the mapping.
  const uint8_t* tensor_data(const GgufTensorInfo& t) const;
  // F32 / F16 / BF16 / F64 / I8..I64 as a zero-copy (or, when misaligned, copied) tensor of the torch
  // shape; throws BadInput for a quantised tensor (use dequantize()).
  Tensor get(const std::string& name) const;
  // Any dequantizable type as a fresh f32 tensor of `shape` (default: the torch shape; numel must match).
  Tensor dequantize(const std::string& name, std::optional<Shape> shape = std::nullopt) const;

 private:
  const GgufTensorInfo& info(const std::string& name) const;
  std::shared_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_start_ = 0;
  std::vector<GgufKV> kv_;
  std::map<std::string, size_t> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
};

// Whether the file at `path` starts with the GGUF magic; false (never throws) when it cannot be read.
bool is_gguf_file(const std::string& path);

}  // namespace wan
