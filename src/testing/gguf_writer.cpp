// GGUF writer for tests: serialises KVs and tensors in gguf-py's GGUFWriter layout, and quantises f32
// values exactly as gguf-py's numpy code does (float32 operations, in its order, no FMA).
#include "testing/gguf_writer.h"

#include <cmath>
#include <filesystem>
#include <cstring>
#include <set>

#include "core/dtype.h"
#include "core/error.h"
#include "formats/output_file.h"

namespace wan::gen {
namespace {

void put_le(std::string& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
}
void put_str(std::string& out, const std::string& s) {
  put_le(out, s.size(), 8);
  out += s;
}

void put_value(std::string& out, const GgufValue& v) {
  put_le(out, static_cast<uint32_t>(v.type), 4);
  if (v.type == GgufValueType::String) {
    put_str(out, v.str);
  } else if (v.type == GgufValueType::Array) {
    put_le(out, static_cast<uint32_t>(v.elem_type), 4);
    put_le(out, v.count, 8);
    if (v.elem_type == GgufValueType::String) {
      for (const std::string& s : v.strings) put_str(out, s);
    } else {
      out += v.raw;
    }
  } else {
    put_le(out, v.bits, static_cast<int>(gguf_scalar_size(v.type)));
  }
}

// gguf-py's BF16 quantiser: NaNs made quiet keeping their top bits, then round to nearest even.
uint16_t bf16_gguf(float f) {
  uint32_t n = f32_bits(f);
  if ((n & 0x7FFFFFFFu) > 0x7F800000u) n = (n & 0xFFFF0000u) | (64u << 16);
  return static_cast<uint16_t>((static_cast<uint64_t>(n) + (0x7FFFu + ((n >> 16) & 1u))) >> 16);
}

// gguf-py's np_roundf: round half away from zero, as floor(|x|) + floor(2 (|x| - floor(|x|))).
float roundf_gguf(float x) {
  const float a = std::fabs(x);
  const float fl = std::floor(a);
  const float b = fl + std::floor(2.0f * (a - fl));
  const float s = x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : 0.0f;
  return s * b;
}

void quantize_q8_0(const float* x, char* out) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d == 0.0f ? 0.0f : 1.0f / d;
  const uint16_t dh = f32_to_f16(d);
  out[0] = static_cast<char>(dh & 0xFF);
  out[1] = static_cast<char>(dh >> 8);
  for (int j = 0; j < 32; ++j) out[2 + j] = static_cast<char>(static_cast<int8_t>(roundf_gguf(x[j] * id)));
}

}  // namespace

std::string gguf_quantize(GgmlType t, const float* x, int64_t n) {
  const uint64_t nbytes = ggml_nbytes(t, static_cast<uint64_t>(n));
  std::string out(static_cast<size_t>(nbytes), '\0');
  char* p = out.data();
  switch (t) {
    case GgmlType::F32:
      if (n) std::memcpy(p, x, static_cast<size_t>(n) * 4);
      break;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_f16(x[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
      break;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = bf16_gguf(x[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
      break;
    case GgmlType::Q8_0:
      for (int64_t b = 0; b < n / 32; ++b) quantize_q8_0(x + 32 * b, p + 34 * b);
      break;
    default:
      WAN_THROW("GGUF writer: cannot quantise to ", ggml_type_name(t), " (F32, F16, BF16, Q8_0; use add_raw)");
  }
  return out;
}

GgufWriter::GgufWriter(const std::string& arch) {
  if (!arch.empty()) add_string("general.architecture", arch);
}

void GgufWriter::set_alignment(uint32_t alignment) {
  WAN_CHECK(alignment != 0 && (alignment & (alignment - 1)) == 0, "GGUF writer: alignment ", alignment,
            " is not a power of two");
  alignment_ = alignment;
  add_u32("general.alignment", alignment);
}

void GgufWriter::add_kv(const std::string& key, GgufValue v) {
  for (const GgufKV& kv : kv_) WAN_CHECK(kv.key != key, "GGUF writer: key '", key, "' added twice");
  kv_.push_back({key, std::move(v)});
}
void GgufWriter::add_string(const std::string& key, const std::string& s) {
  GgufValue v;
  v.type = GgufValueType::String;
  v.str = s;
  add_kv(key, std::move(v));
}
void GgufWriter::add_u32(const std::string& key, uint32_t x) { add_scalar(key, GgufValueType::U32, x); }
void GgufWriter::add_scalar(const std::string& key, GgufValueType t, uint64_t bits) {
  WAN_CHECK(gguf_scalar_size(t) != 0, "GGUF writer: ", gguf_value_type_name(t), " is not a scalar type");
  GgufValue v;
  v.type = t;
  v.bits = bits;
  add_kv(key, std::move(v));
}
void GgufWriter::add_i32_array(const std::string& key, const std::vector<int32_t>& a) {
  GgufValue v;
  v.type = GgufValueType::Array;
  v.elem_type = GgufValueType::I32;
  v.count = a.size();
  for (int32_t x : a) put_le(v.raw, static_cast<uint32_t>(x), 4);
  add_kv(key, std::move(v));
}
void GgufWriter::add_string_array(const std::string& key, const std::vector<std::string>& a) {
  GgufValue v;
  v.type = GgufValueType::Array;
  v.elem_type = GgufValueType::String;
  v.count = a.size();
  v.strings = a;
  add_kv(key, std::move(v));
}

void GgufWriter::add_tensor(const std::string& name, const Shape& shape, const float* values, GgmlType t) {
  add_raw(name, shape, t, gguf_quantize(t, values, shape.numel()));
}
void GgufWriter::add_tensor(const std::string& name, const Tensor& f32, GgmlType t) {
  Tensor c = f32.to_f32();
  add_tensor(name, c.shape(), c.f32(), t);
}

void GgufWriter::add_raw(const std::string& name, const Shape& shape, GgmlType t, std::string bytes) {
  WAN_CHECK(!name.empty(), "GGUF writer: empty tensor name");
  WAN_CHECK(shape.ndim <= static_cast<int>(kGgufMaxDims), "GGUF writer: tensor '", name, "' has ", shape.ndim,
            " dims (at most ", kGgufMaxDims, ")");
  for (const Item& i : tensors_) WAN_CHECK(i.name != name, "GGUF writer: tensor '", name, "' added twice");
  const GgmlTypeInfo& info = ggml_info(t);
  const int64_t row = shape.ndim ? shape[-1] : 1;
  WAN_CHECK(row % info.block_size == 0, "GGUF writer: tensor '", name, "': last dim ", row,
            " is not a whole number of ", info.name, " blocks");
  const uint64_t want = ggml_nbytes(t, static_cast<uint64_t>(shape.numel()));
  WAN_CHECK(bytes.size() == want, "GGUF writer: tensor '", name, "': ", bytes.size(), " bytes given, ", shape.str(),
            " of ", info.name, " is ", want);
  tensors_.push_back({name, shape, t, std::move(bytes)});
}

std::string GgufWriter::bytes() const {
  std::string out = "GGUF";
  put_le(out, 3, 4);
  put_le(out, tensors_.size(), 8);
  put_le(out, kv_.size(), 8);
  for (const GgufKV& kv : kv_) {
    put_str(out, kv.key);
    put_value(out, kv.value);
  }
  auto padded = [&](uint64_t n) { return n + (alignment_ - n % alignment_) % alignment_; };
  uint64_t offset = 0;
  for (const Item& t : tensors_) {
    put_str(out, t.name);
    put_le(out, static_cast<uint32_t>(t.shape.ndim), 4);
    for (int i = t.shape.ndim - 1; i >= 0; --i) put_le(out, static_cast<uint64_t>(t.shape[i]), 8);
    put_le(out, static_cast<uint32_t>(t.type), 4);
    put_le(out, offset, 8);
    offset = padded(offset + t.data.size());
  }
  out.resize(padded(out.size()), '\0');
  for (const Item& t : tensors_) {
    out += t.data;
    out.resize(padded(out.size()), '\0');
  }
  return out;
}

namespace {

// Raw blocks of any type with a recognisable pattern; every f16 field at the start or end of a block
// reads as a finite number (pattern bytes stay below 0x7C in the high byte).
std::string pattern_blocks(GgmlType t, int64_t n_elements) {
  std::string b(ggml_nbytes(t, static_cast<uint64_t>(n_elements)), '\0');
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>((i * 37 + 11) % 0x7B);
  return b;
}

}  // namespace

void write_gguf_seeds(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::vector<float> v(512);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(static_cast<int>(i % 17) - 8) * 0.125f;
  for (const bool prefixed : {false, true}) {
    const std::string p = prefixed ? "model.diffusion_model." : "";
    GgufWriter w("wan");
    w.add_u32("general.file_type", 7);
    w.add_i32_array("comfy.gguf.orig_shape." + p + "blocks.0.ffn.2.weight", {32, 8});
    w.add_tensor(p + "blocks.0.self_attn.q.weight", Shape{4, 64}, v.data(), GgmlType::Q8_0);
    w.add_tensor(p + "blocks.0.self_attn.k.weight", Shape{4, 64}, v.data(), GgmlType::F16);
    w.add_tensor(p + "blocks.0.self_attn.v.weight", Shape{4, 64}, v.data(), GgmlType::BF16);
    w.add_raw(p + "blocks.0.ffn.0.weight", Shape{1, 256}, GgmlType::Q4_K, pattern_blocks(GgmlType::Q4_K, 256));
    w.add_raw(p + "blocks.0.ffn.2.weight", Shape{256}, GgmlType::Q6_K, pattern_blocks(GgmlType::Q6_K, 256));
    w.add_tensor(p + "blocks.0.norm3.weight", Shape{8}, v.data(), GgmlType::F32);
    w.add_tensor(p + "patch_embedding.weight", Shape{2, 2, 1, 2, 2}, v.data(), GgmlType::F32);
    w.write(dir + (prefixed ? "/comfy_prefix.gguf" : "/dit.gguf"));
  }
  GgufWriter w("wan");
  w.set_alignment(64);
  uint64_t bits = 0;
  for (uint32_t t = 0; t <= static_cast<uint32_t>(GgufValueType::F64); ++t) {
    const auto vt = static_cast<GgufValueType>(t);
    if (vt == GgufValueType::String || vt == GgufValueType::Array) continue;
    w.add_scalar(cat("k.", gguf_value_type_name(vt)), vt, vt == GgufValueType::Bool ? 1 : (bits += 0x41));
  }
  w.add_string_array("k.strings", {"a", "bc"});
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K,
                     GgmlType::Q5_K})
  {
    const int64_t n = ggml_info(t).block_size;
    w.add_raw(cat("t.", ggml_type_name(t)), Shape{n}, t, pattern_blocks(t, n));
  }
  w.write(dir + "/every_type.gguf");
}

void GgufWriter::write(const std::string& path) const {
  const std::string b = bytes();
  OutputFile out(path, path);
  out.write(b.data(), b.size());
  out.commit();
}

}  // namespace wan::gen
