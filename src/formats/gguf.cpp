// GGUF reading. The whole file is memory-mapped; open() walks the header with a bounds-checked cursor
// (every read first checks that its bytes lie inside the file, so a truncated or lying file fails
// with one message saying what was being read, at which offset), then checks every tensor's byte
// range against the data section and against the other tensors. Counts are checked against the bytes
// left before anything is reserved for them, and capped (kMaxKVs, kMaxTensors): memory stays a small
// multiple of the file's size whatever the counts claim. Every defect is one wan::Error
// "<file>: [<where>: ]<problem>".
#include "formats/gguf.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/printable.h"

namespace wan {
namespace {

constexpr uint64_t kMaxKVs = uint64_t{1} << 20;      // real files: tens
constexpr uint64_t kMaxTensors = uint64_t{1} << 20;  // real files: a few thousand
constexpr uint64_t kMinKVBytes = 8 + 4 + 1;          // empty key, type, a u8 value
constexpr uint64_t kMinTensorBytes = 8 + 4 + 4 + 8;  // empty name, n_dims 0, type, offset
constexpr uint64_t kMaxI64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::F64); }

uint64_t load_le(const uint8_t* p, uint64_t n) {
  uint64_t v = 0;
  for (uint64_t i = n; i-- > 0;) v = (v << 8) | p[i];
  return v;
}

// Bounds-checked little-endian reader over the mapping. `where` names the part being read (for errors).
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size, const std::string& path) : base_(base), size_(size), path_(path) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  std::string where;

  [[noreturn]] void fail(const std::string& msg) const {
    throw Error(where.empty() ? cat(path_, ": ", msg) : cat(path_, ": ", where, ": ", msg));
  }
  void need(uint64_t n, const char* what) const {
    if (n > left())
      fail(cat("truncated: ", what, " needs ", n, " bytes at offset ", pos_, " but only ", left(),
               " are left (the file has ", size_, ")"));
  }
  uint64_t uint(uint64_t n, const char* what) {
    need(n, what);
    const uint64_t v = load_le(base_ + pos_, n);
    pos_ += n;
    return v;
  }
  uint32_t u32(const char* what) { return static_cast<uint32_t>(uint(4, what)); }
  uint64_t u64(const char* what) { return uint(8, what); }
  std::string str(const char* what) {
    const uint64_t n = u64(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(n));
    pos_ += n;
    return s;
  }
  std::string bytes(uint64_t n, const char* what) {
    need(n, what);
    std::string s(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(n));
    pos_ += n;
    return s;
  }

 private:
  const uint8_t* base_;
  uint64_t size_, pos_ = 0;
  const std::string& path_;
};

// A scalar of type t at the cursor.
uint64_t read_scalar(Cursor& c, GgufValueType t) {
  const uint64_t v = c.uint(gguf_scalar_size(t), "a value");
  if (t == GgufValueType::Bool && v > 1) c.fail(cat("bool value ", v, " (expected 0 or 1)"));
  return v;
}

GgufValue read_value(Cursor& c, uint32_t type) {
  if (!known_value_type(type)) c.fail(cat("unknown value type ", type, " (known: 0..12)"));
  GgufValue v;
  v.type = static_cast<GgufValueType>(type);
  if (v.type == GgufValueType::String) {
    v.str = c.str("a string value");
  } else if (v.type != GgufValueType::Array) {
    v.bits = read_scalar(c, v.type);
  } else {
    const uint32_t et = c.u32("the array element type");
    if (et == static_cast<uint32_t>(GgufValueType::Array)) c.fail("nested arrays are not supported (ggml rejects them too)");
    if (!known_value_type(et)) c.fail(cat("unknown array element type ", et, " (known: 0..12)"));
    v.elem_type = static_cast<GgufValueType>(et);
    v.count = c.u64("the array length");
    if (v.elem_type == GgufValueType::String) {
      // Each string takes at least its 8-byte length: a count the file cannot hold fails before any work.
      if (v.count > c.left() / 8) c.fail(cat("array of ", v.count, " strings cannot fit in the ", c.left(), " bytes left"));
      v.strings.reserve(static_cast<size_t>(v.count));
      for (uint64_t i = 0; i < v.count; ++i) v.strings.push_back(c.str("an array string"));
    } else {
      const uint64_t es = gguf_scalar_size(v.elem_type);
      if (v.count > c.left() / es)
        c.fail(cat("array of ", v.count, " ", gguf_value_type_name(v.elem_type), " cannot fit in the ", c.left(),
                   " bytes left"));
      v.raw = c.bytes(v.count * es, "array elements");
      if (v.elem_type == GgufValueType::Bool)
        for (char b : v.raw)
          if (static_cast<uint8_t>(b) > 1) c.fail(cat("bool array element ", static_cast<int>(static_cast<uint8_t>(b)), " (expected 0 or 1)"));
    }
  }
  return v;
}

int64_t scalar_i64(GgufValueType t, uint64_t bits, const std::string& what) {
  switch (t) {
    case GgufValueType::U8: case GgufValueType::U16: case GgufValueType::U32: case GgufValueType::Bool:
      return static_cast<int64_t>(bits);
    case GgufValueType::I8: return static_cast<int8_t>(bits);
    case GgufValueType::I16: return static_cast<int16_t>(bits);
    case GgufValueType::I32: return static_cast<int32_t>(bits);
    case GgufValueType::I64: return static_cast<int64_t>(bits);
    case GgufValueType::U64:
      WAN_CHECK(bits <= kMaxI64, what, ": u64 value ", bits, " does not fit in int64");
      return static_cast<int64_t>(bits);
    default: WAN_THROW(what, ": a ", gguf_value_type_name(t), " is not an integer");
  }
}
double scalar_f64(GgufValueType t, uint64_t bits, const std::string& what) {
  if (t == GgufValueType::F32) {
    float f;
    const uint32_t b = static_cast<uint32_t>(bits);
    std::memcpy(&f, &b, 4);
    return f;
  }
  if (t == GgufValueType::F64) {
    double d;
    std::memcpy(&d, &bits, 8);
    return d;
  }
  if (t == GgufValueType::U64) return static_cast<double>(bits);
  return static_cast<double>(scalar_i64(t, bits, what));
}

}  // namespace

const char* gguf_value_type_name(GgufValueType t) {
  static const char* const kNames[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array",
                                       "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? kNames[i] : "unknown";
}

// ---- GgufValue ----

bool GgufValue::is_int() const {
  return gguf_scalar_size(type) != 0 && type != GgufValueType::Bool && type != GgufValueType::F32 &&
         type != GgufValueType::F64;
}
bool GgufValue::is_float() const { return type == GgufValueType::F32 || type == GgufValueType::F64; }
int64_t GgufValue::as_i64() const {
  WAN_CHECK(is_int(), "GGUF value of type ", gguf_value_type_name(type), " is not an integer");
  return scalar_i64(type, bits, "GGUF value");
}
uint64_t GgufValue::as_u64() const {
  WAN_CHECK(is_int(), "GGUF value of type ", gguf_value_type_name(type), " is not an integer");
  if (type == GgufValueType::U64) return bits;
  const int64_t v = as_i64();
  WAN_CHECK(v >= 0, "GGUF value ", v, " is negative");
  return static_cast<uint64_t>(v);
}
double GgufValue::as_f64() const {
  WAN_CHECK(gguf_scalar_size(type) != 0, "GGUF value of type ", gguf_value_type_name(type), " is not a number");
  return scalar_f64(type, bits, "GGUF value");
}
int64_t GgufValue::array_i64(uint64_t i) const {
  WAN_CHECK(type == GgufValueType::Array && gguf_scalar_size(elem_type) != 0 && i < count,
            "GGUF value: no numeric array element ", i);
  const uint64_t es = gguf_scalar_size(elem_type);
  return scalar_i64(elem_type, load_le(reinterpret_cast<const uint8_t*>(raw.data()) + i * es, es), "GGUF array");
}
double GgufValue::array_f64(uint64_t i) const {
  WAN_CHECK(type == GgufValueType::Array && gguf_scalar_size(elem_type) != 0 && i < count,
            "GGUF value: no numeric array element ", i);
  const uint64_t es = gguf_scalar_size(elem_type);
  return scalar_f64(elem_type, load_le(reinterpret_cast<const uint8_t*>(raw.data()) + i * es, es), "GGUF array");
}
std::string GgufValue::str_brief() const {
  auto clip = [](const std::string& s) { return printable(s, 60); };
  if (type == GgufValueType::String) return clip("\"" + str + "\"");
  if (type == GgufValueType::Array) {
    std::string s = cat("[", gguf_value_type_name(elem_type), " x ", count, "]");
    if (elem_type != GgufValueType::String && count > 0 && count <= 8) {
      s = "[";
      for (uint64_t i = 0; i < count; ++i)
        s += cat(i ? ", " : "", elem_type == GgufValueType::F32 || elem_type == GgufValueType::F64
                                    ? cat(array_f64(i))
                                    : elem_type == GgufValueType::U64 ? cat(load_le(reinterpret_cast<const uint8_t*>(raw.data()) + i * 8, 8))
                                                                      : cat(array_i64(i)));
      s += "]";
    }
    return clip(s);
  }
  if (type == GgufValueType::Bool) return bits ? "true" : "false";
  if (is_float()) return cat(as_f64());
  if (type == GgufValueType::U64) return cat(bits);
  return cat(as_i64());
}

// ---- GgufTensorInfo ----

Shape GgufTensorInfo::torch_shape() const {
  std::vector<int64_t> d;
  for (uint32_t i = n_dims; i-- > 0;) d.push_back(static_cast<int64_t>(ne[i]));
  return Shape(d);
}

// ---- GgufFile ----

namespace {

// Reads one tensor info at the cursor (c.where names it).
GgufTensorInfo read_tensor_info(Cursor& c) {
  GgufTensorInfo t;
  t.name = c.str("the tensor name");
  c.where += cat(" '", printable(t.name, 80), "'");
  if (t.name.empty()) c.fail("empty tensor name");
  t.n_dims = c.u32("n_dims");
  if (t.n_dims > kGgufMaxDims) c.fail(cat("n_dims ", t.n_dims, " (at most ", kGgufMaxDims, " supported)"));
  // The product of the non-zero dims must fit int64 too, so that no partial product (torch's order
  // multiplies them the other way round) overflows even when a later dim is 0.
  uint64_t nonzero = 1;
  bool zero = false;
  for (uint32_t i = 0; i < t.n_dims; ++i) {
    t.ne[i] = c.u64("a dimension");
    zero = zero || t.ne[i] == 0;
    if (t.ne[i] > kMaxI64 || (t.ne[i] && (__builtin_mul_overflow(nonzero, t.ne[i], &nonzero) || nonzero > kMaxI64)))
      c.fail(cat("dimension ", i, " (", t.ne[i], ") makes the element count overflow int64"));
  }
  t.numel = zero ? 0 : nonzero;
  const uint32_t type = c.u32("the ggml type");
  const auto info = ggml_type_info(type);
  if (!info) c.fail(cat("unknown ggml type ", type));
  t.type = info->type;
  const uint64_t row = t.n_dims ? t.ne[0] : 1;
  if (row % info->block_size != 0)
    c.fail(cat("row of ", row, " elements (ne[0]) is not a whole number of ", info->name, " blocks (",
               info->block_size, " elements)"));
  if (__builtin_mul_overflow(t.numel / info->block_size, static_cast<uint64_t>(info->type_size), &t.nbytes))
    c.fail(cat("size of ", t.numel, " ", info->name, " elements overflows 64 bits"));
  t.offset = c.u64("the data offset");
  return t;
}

}  // namespace

std::shared_ptr<GgufFile> GgufFile::open(const std::string& path) {
  auto f = std::shared_ptr<GgufFile>(new GgufFile());
  f->file_ = MappedFile::open(path);
  Cursor c(f->file_->data(), f->file_->size(), path);
  c.need(4, "the magic");
  if (std::memcmp(f->file_->data(), "GGUF", 4) != 0) c.fail("not a GGUF file (the magic is not \"GGUF\")");
  c.uint(4, "the magic");
  f->version_ = c.u32("the version");
  if ((f->version_ & 0xFFFF) == 0 && f->version_ != 0) c.fail(cat("version ", f->version_, " looks big-endian (not supported)"));
  if (f->version_ == 1) c.fail("GGUF version 1 is not supported (only 2 and 3)");
  if (f->version_ != 2 && f->version_ != 3) c.fail(cat("unsupported GGUF version ", f->version_, " (only 2 and 3)"));
  const uint64_t n_tensors = c.u64("the tensor count");
  const uint64_t n_kv = c.u64("the KV count");
  if (n_kv > kMaxKVs || n_kv > c.left() / kMinKVBytes)
    c.fail(cat("KV count ", n_kv, " is impossible (", c.left(), " bytes left; at most ", kMaxKVs, " supported)"));
  if (n_tensors > kMaxTensors || n_tensors > c.left() / kMinTensorBytes)
    c.fail(cat("tensor count ", n_tensors, " is impossible (", c.left(), " bytes left; at most ", kMaxTensors,
               " supported)"));

  for (uint64_t i = 0; i < n_kv; ++i) {
    c.where = cat("KV ", i);
    GgufKV kv;
    kv.key = c.str("the key");
    c.where = cat("KV ", i, " '", printable(kv.key, 80), "'");
    if (f->kv_index_.count(kv.key)) c.fail("duplicate key");
    kv.value = read_value(c, c.u32("the value type"));
    f->kv_index_[kv.key] = f->kv_.size();
    f->kv_.push_back(std::move(kv));
  }
  c.where = "general.alignment";
  if (const GgufValue* a = f->find_kv("general.alignment")) {
    if (a->type != GgufValueType::U32) c.fail(cat("is a ", gguf_value_type_name(a->type), ", expected u32"));
    if (a->bits == 0 || (a->bits & (a->bits - 1)) != 0) c.fail(cat(a->bits, " is not a power of two"));
    f->alignment_ = a->bits;
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    c.where = cat("tensor ", i);
    GgufTensorInfo t = read_tensor_info(c);
    if (f->index_.count(t.name)) c.fail("duplicate tensor name");
    if (t.offset % f->alignment_ != 0) c.fail(cat("offset ", t.offset, " is not a multiple of the alignment ", f->alignment_));
    f->index_[t.name] = f->tensors_.size();
    f->tensors_.push_back(std::move(t));
  }
  c.where.clear();
  // The data section starts at the next multiple of the alignment (which may be the end of the file).
  const uint64_t size = f->file_->size();
  const uint64_t a = f->alignment_;
  f->data_start_ = c.pos() + (a - c.pos() % a) % a;
  const uint64_t data_size = f->data_start_ <= size ? size - f->data_start_ : 0;
  std::vector<const GgufTensorInfo*> by_offset;
  for (const GgufTensorInfo& t : f->tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      c.fail(cat("tensor '", printable(t.name, 80), "': bytes [", t.offset, ", +", t.nbytes, ") lie outside the data section (",
                 data_size, " bytes from offset ", f->data_start_, ")"));
    if (t.nbytes) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* x, const GgufTensorInfo* y) { return x->offset < y->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensorInfo* p = by_offset[i - 1];
    if (by_offset[i]->offset < p->offset + p->nbytes)
      c.fail(cat("tensor '", printable(by_offset[i]->name, 80), "' at offset ", by_offset[i]->offset,
                 " overlaps tensor '", printable(p->name, 80),
                 "' [", p->offset, ", ", p->offset + p->nbytes, ")"));
  }
  return f;
}

const GgufValue* GgufFile::find_kv(const std::string& key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].value;
}

std::string GgufFile::architecture() const {
  const GgufValue* v = find_kv("general.architecture");
  return v && v->type == GgufValueType::String ? v->str : std::string();
}

const GgufTensorInfo* GgufFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::info(const std::string& name) const {
  const GgufTensorInfo* t = find(name);
  if (!t) WAN_THROW(path(), ": tensor '", printable(name, 80), "' not found");
  return *t;
}

const uint8_t* GgufFile::tensor_data(const GgufTensorInfo& t) const {
  // Validated at open(): offset + nbytes <= size - data_start; a zero-byte tensor may sit at the end.
  return t.nbytes ? file_->data() + data_start_ + t.offset : file_->data();
}

Tensor GgufFile::get(const std::string& name) const {
  const GgufTensorInfo& t = info(name);
  DType dt;
  switch (t.type) {
    case GgmlType::F32: dt = DType::F32; break;
    case GgmlType::F16: dt = DType::F16; break;
    case GgmlType::BF16: dt = DType::BF16; break;
    case GgmlType::F64: dt = DType::F64; break;
    case GgmlType::I8: dt = DType::I8; break;
    case GgmlType::I16: dt = DType::I16; break;
    case GgmlType::I32: dt = DType::I32; break;
    case GgmlType::I64: dt = DType::I64; break;
    default:
      WAN_THROW(path(), ": tensor '", printable(name, 80), "' is ", ggml_type_name(t.type), " (quantised): it has no plain dtype");
  }
  const Shape s = t.torch_shape();
  const uint8_t* p = tensor_data(t);
  if (t.nbytes == 0 || reinterpret_cast<uintptr_t>(p) % dtype_size(dt) != 0) {
    Tensor x = Tensor::empty(dt, s);
    if (t.nbytes) std::memcpy(x.data(), p, t.nbytes);
    return x;
  }
  return Tensor::borrow(std::shared_ptr<const void>(file_), p, dt, s);
}

Tensor GgufFile::dequantize(const std::string& name, std::optional<Shape> shape) const {
  const GgufTensorInfo& t = info(name);
  const Shape s = shape ? *shape : t.torch_shape();
  WAN_CHECK(static_cast<uint64_t>(s.numel()) == t.numel, path(), ": tensor '", printable(name, 80), "': shape ", s.str(), " has ",
            s.numel(), " elements, the tensor ", t.numel);
  Tensor out = Tensor::empty(DType::F32, s);
  try {
    gguf_dequantize(t.type, tensor_data(t), static_cast<int64_t>(t.numel), out.f32());
  } catch (const Error& e) {
    throw e.with_context(cat(path(), ": tensor '", printable(name, 80), "'"));
  }
  return out;
}

bool is_gguf_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  char m[4] = {};
  const bool ok = std::fread(m, 1, 4, f) == 4 && std::memcmp(m, "GGUF", 4) == 0;
  std::fclose(f);
  return ok;
}

uint64_t gguf_scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::U8: case GgufValueType::I8: case GgufValueType::Bool: return 1;
    case GgufValueType::U16: case GgufValueType::I16: return 2;
    case GgufValueType::U32: case GgufValueType::I32: case GgufValueType::F32: return 4;
    case GgufValueType::U64: case GgufValueType::I64: case GgufValueType::F64: return 8;
    default: return 0;
  }
}

}  // namespace wan
