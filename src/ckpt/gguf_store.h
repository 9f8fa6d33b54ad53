// A WeightStore over one GGUF DiT file (city96/Wan2.2-*-GGUF, ComfyUI-GGUF's convert.py, sd.cpp):
// official Wan DiT names, optionally prefixed "model.diffusion_model." (stripped, as ComfyUI-GGUF's
// loader does: with the prefix present, unprefixed tensors are unexpected), torch shapes (ggml's ne
// reversed, or the "comfy.gguf.orig_shape.<name>" i32 array when the converter reshaped the tensor).
// Invariants: get() / get_f32() of a quantised tensor dequantise it on the CPU (formats/gguf_quant.h,
// bit-identical to gguf-py) and dtype() says F32 for it (what get() returns; ggml_type() tells the
// stored type); F32 / F16 / BF16 tensors are served zero-copy and raw_span() gives their bytes; a
// quantised tensor's raw_span() has dtype U8, length = its stored bytes, the torch shape and
// RawSpan::ggml_type set (the GPU loader dequantises it, runtime/load_gpu.h).
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/layout.h"
#include "formats/gguf.h"

namespace wan {

constexpr const char* kGgufDitPrefix = "model.diffusion_model.";

// The store; throws BadInput (naming the file) for an unreadable or invalid GGUF file, an orig_shape
// KV that is not an i32 array of the tensor's element count, or a file with no Wan DiT tensor.
std::unique_ptr<WeightStore> open_gguf_dit(const std::string& path);

// The stored type of a tensor of a store made by open_gguf_dit (official name); nullopt for another
// store or an unknown name.
std::optional<GgmlType> gguf_store_type(const WeightStore& store, const std::string& name);

// The bytes of tensor `t` of file `f`, served under torch shape `shape`: float types (F32, F16, BF16)
// as a plain RawSpan of that dtype; any other type as dtype U8 with length = its stored bytes (the
// caller must know the ggml type, t.type, to convert them).
std::optional<RawSpan> gguf_raw_span(const GgufFile& f, const GgufTensorInfo& t, const Shape& shape);

// Official DiT name -> torch shape of every Wan DiT tensor in the file (prefix stripped; other names
// left out): the input of dit_config_from_shapes for layout detection.
std::map<std::string, Shape> gguf_shapes(const std::string& path);

// One row of `wan inspect` for a GGUF file: every tensor in file order, as stored.
struct GgufTensorListing {
  std::string name;  // as in the file
  std::string type;  // "Q4_K", "F32", ...
  Shape shape;       // torch shape (orig_shape KV applied)
  uint64_t bytes = 0;
};
std::vector<GgufTensorListing> gguf_list_tensors(const std::string& path);

}  // namespace wan
