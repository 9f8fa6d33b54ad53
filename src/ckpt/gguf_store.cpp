// The GGUF DiT store: maps the file's tensors to official names (ComfyUI-GGUF's prefix rule), applies
// ComfyUI-GGUF's orig_shape KVs, and serves plain tensors zero-copy and quantised ones dequantised.
#include "ckpt/gguf_store.h"

#include <algorithm>
#include <cstdint>

#include "ckpt/names.h"
#include "core/error.h"
#include "core/printable.h"

namespace wan {
namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// The torch shape of t: the converter's "comfy.gguf.orig_shape.<name>" (an i32 array) when present,
// else ne reversed.
Shape torch_shape_of(const GgufFile& f, const GgufTensorInfo& t) {
  const std::string key = "comfy.gguf.orig_shape." + t.name;
  const std::string shown = printable(key, 100);
  const GgufValue* v = f.find_kv(key);
  if (!v) return t.torch_shape();
  WAN_CHECK(v->type == GgufValueType::Array && v->elem_type == GgufValueType::I32 && v->count <= kMaxDims, f.path(),
            ": KV '", shown, "' is ", v->str_brief(), ", expected an array of at most ", kMaxDims, " i32");
  std::vector<int64_t> d;
  uint64_t numel = 1;
  bool zero = false;
  for (uint64_t i = 0; i < v->count; ++i) {
    const int64_t x = v->array_i64(i);
    WAN_CHECK(x >= 0, f.path(), ": KV '", shown, "' has the negative dimension ", x);
    zero = zero || x == 0;
    // Non-zero dims only: no partial product of the shape may overflow int64, whatever the order.
    WAN_CHECK(x == 0 || (!__builtin_mul_overflow(numel, static_cast<uint64_t>(x), &numel) &&
                         numel <= static_cast<uint64_t>(INT64_MAX)),
              f.path(), ": KV '", shown, "' overflows int64 elements");
    d.push_back(x);
  }
  if (zero) numel = 0;
  WAN_CHECK(numel == t.numel, f.path(), ": KV '", shown, "' gives shape ", Shape(d).str(), " (", numel,
            " elements) to tensor '", printable(t.name, 80), "' of ", t.numel, " elements");
  return Shape(d);
}

std::optional<DType> plain_dtype(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return DType::F32;
    case GgmlType::F16: return DType::F16;
    case GgmlType::BF16: return DType::BF16;
    case GgmlType::F64: return DType::F64;
    case GgmlType::I8: return DType::I8;
    case GgmlType::I16: return DType::I16;
    case GgmlType::I32: return DType::I32;
    case GgmlType::I64: return DType::I64;
    default: return std::nullopt;
  }
}

// Official name of file tensor `n` under the file's prefix rule; "" when it is no Wan DiT tensor.
std::string official_name(const std::string& n, bool has_prefix) {
  std::string o = n;
  if (has_prefix) {
    if (!starts_with(n, kGgufDitPrefix)) return "";
    o = n.substr(std::string(kGgufDitPrefix).size());
  }
  return dit_official_to_diffusers(o).empty() ? "" : o;
}

bool file_has_prefix(const GgufFile& f) {
  return std::any_of(f.tensors().begin(), f.tensors().end(),
                     [](const GgufTensorInfo& t) { return starts_with(t.name, kGgufDitPrefix); });
}

class GgufDitStore final : public WeightStore {
 public:
  struct Entry {
    const GgufTensorInfo* t;
    Shape shape;
  };

  explicit GgufDitStore(std::shared_ptr<GgufFile> f) : f_(std::move(f)) {
    const bool prefix = file_has_prefix(*f_);
    for (const GgufTensorInfo& t : f_->tensors()) {
      const std::string o = official_name(t.name, prefix);
      if (o.empty()) unexpected_.push_back(t.name);
      else entries_.emplace(o, Entry{&t, torch_shape_of(*f_, t)});
    }
    std::sort(unexpected_.begin(), unexpected_.end());
    WAN_CHECK(!entries_.empty(), f_->path(), ": no Wan DiT tensor in this GGUF file (architecture '",
              printable(f_->architecture(), 40), "'; expected names like blocks.0.self_attn.q.weight)");
  }

  std::vector<std::string> names() const override {
    std::vector<std::string> v;
    for (const auto& [k, e] : entries_) v.push_back(k);
    return v;
  }
  bool contains(const std::string& name) const override { return entries_.count(name) != 0; }
  Shape shape(const std::string& name) const override { return entry(name).shape; }
  DType dtype(const std::string& name) const override {
    return plain_dtype(entry(name).t->type).value_or(DType::F32);
  }
  Tensor get(const std::string& name) const override {
    const Entry& e = entry(name);
    try {
      if (plain_dtype(e.t->type)) return f_->get(e.t->name).reshape(e.shape);
      return f_->dequantize(e.t->name, e.shape);
    } catch (const Error& err) {
      throw err.with_context(cat("tensor '", printable(name, 80), "'"));
    }
  }
  Tensor get_f32(const std::string& name) const override {
    const Entry& e = entry(name);
    if (!plain_dtype(e.t->type)) return get(name);
    return get(name).to_f32();
  }
  std::vector<std::string> unexpected() const override { return unexpected_; }
  std::optional<RawSpan> raw_span(const std::string& name) const override {
    const Entry& e = entry(name);
    std::optional<RawSpan> r = gguf_raw_span(*f_, *e.t, e.shape);
    if (r && !plain_dtype(e.t->type)) r->ggml_type = static_cast<uint32_t>(e.t->type);
    return r;
  }
  GgmlType type(const std::string& name) const { return entry(name).t->type; }

 private:
  const Entry& entry(const std::string& name) const {
    auto it = entries_.find(name);
    WAN_CHECK(it != entries_.end(), f_->path(), ": tensor '", printable(name, 80), "' not found");
    return it->second;
  }
  std::shared_ptr<GgufFile> f_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> unexpected_;
};

}  // namespace

std::unique_ptr<WeightStore> open_gguf_dit(const std::string& path) {
  return std::make_unique<GgufDitStore>(GgufFile::open(path));
}

std::optional<GgmlType> gguf_store_type(const WeightStore& store, const std::string& name) {
  const auto* s = dynamic_cast<const GgufDitStore*>(&store);
  if (!s || !s->contains(name)) return std::nullopt;
  return s->type(name);
}

std::optional<RawSpan> gguf_raw_span(const GgufFile& f, const GgufTensorInfo& t, const Shape& shape) {
  WAN_CHECK(static_cast<uint64_t>(shape.numel()) == t.numel, f.path(), ": tensor '", printable(t.name, 80), "': shape ", shape.str(),
            " does not hold its ", t.numel, " elements");
  RawSpan r;
  r.path = f.path();
  r.offset = f.data_start() + t.offset;
  r.length = t.nbytes;
  const auto dt = plain_dtype(t.type);
  r.dtype = dt && dtype_is_float(*dt) ? *dt : DType::U8;
  r.shape = shape;
  return r;
}

std::map<std::string, Shape> gguf_shapes(const std::string& path) {
  auto f = GgufFile::open(path);
  const bool prefix = file_has_prefix(*f);
  std::map<std::string, Shape> out;
  for (const GgufTensorInfo& t : f->tensors()) {
    const std::string o = official_name(t.name, prefix);
    if (!o.empty()) out[o] = torch_shape_of(*f, t);
  }
  return out;
}

std::vector<GgufTensorListing> gguf_list_tensors(const std::string& path) {
  auto f = GgufFile::open(path);
  std::vector<GgufTensorListing> out;
  for (const GgufTensorInfo& t : f->tensors())
    out.push_back({t.name, ggml_type_name(t.type), torch_shape_of(*f, t), t.nbytes});
  return out;
}

}  // namespace wan
