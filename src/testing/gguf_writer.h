// A GGUF (v3, little-endian) writer for tests, fuzz seeds and make-checkpoint: KVs of every value type,
// tensors quantised from f32 (F32, F16, BF16, Q8_0) or stored as given raw blocks of any ggml type.
// Invariants: the layout is gguf-py's GGUFWriter's (header, KVs, tensor infos, padding to the
// alignment, then each tensor at an aligned offset, zero-padded), so gguf.GGUFReader and our
// formats/gguf.h both read it; the quantisers are bit-identical to gguf-py's gguf.quants.quantize for
// finite inputs (Q8_0: d = amax / 127, q = round-half-away(x * (1 / d)), d stored as f16); the output
// is a pure function of what was added (no clock, no randomness).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "formats/gguf.h"

namespace wan::gen {

// gguf-py's quantisation of n f32 values to type t (F32, F16, BF16 or Q8_0; n whole blocks).
std::string gguf_quantize(GgmlType t, const float* x, int64_t n);

class GgufWriter {
 public:
  // arch non-empty: general.architecture = arch (first KV, as GGUFWriter does).
  explicit GgufWriter(const std::string& arch = "wan");
  // general.alignment (u32, a power of two); the default is 32 and writes no KV.
  void set_alignment(uint32_t alignment);

  void add_kv(const std::string& key, GgufValue v);  // keys must be unique
  void add_string(const std::string& key, const std::string& s);
  void add_u32(const std::string& key, uint32_t v);
  // A scalar of any numeric or bool type from its little-endian bits (e.g. a float's bit pattern).
  void add_scalar(const std::string& key, GgufValueType t, uint64_t bits);
  void add_i32_array(const std::string& key, const std::vector<int32_t>& v);
  void add_string_array(const std::string& key, const std::vector<std::string>& v);

  // `shape` is the torch shape (at most 5 dims; stored reversed as ggml's ne); its last dim must be a
  // whole number of blocks of t.
  void add_tensor(const std::string& name, const Shape& shape, const float* values, GgmlType t);
  void add_tensor(const std::string& name, const Tensor& f32, GgmlType t);
  // Stores `bytes` as the tensor's data; their size must equal shape x type.
  void add_raw(const std::string& name, const Shape& shape, GgmlType t, std::string bytes);

  std::string bytes() const;                  // the whole file
  void write(const std::string& path) const;  // through OutputFile (a temporary file, renamed)

 private:
  struct Item {
    std::string name;
    Shape shape;
    GgmlType type;
    std::string data;
  };
  uint32_t alignment_ = kGgufDefaultAlignment;
  std::vector<GgufKV> kv_;
  std::vector<Item> tensors_;
};

// Fuzz seeds (tests/fuzz/make_seeds.cpp): a few small (< 8 KB) GGUF files in `dir` (created):
// Wan DiT tensor names with and without ComfyUI's prefix, every dequantisable type, a 5-D tensor, an
// orig_shape KV, KVs of every value type and a non-default alignment.
void write_gguf_seeds(const std::string& dir);

}  // namespace wan::gen
