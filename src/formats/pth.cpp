// torch.save (zip) files: reading through zip.h + pickle.h, and writing (see pth.h).
// Reading invariants: open() validates everything get() relies on, so get() cannot read outside
// the mapping: each tensor's storage record exists and is stored uncompressed, and its last
// element (offset + sum((size_i - 1) * stride_i), computed without overflow) lies inside both the
// record and the storage's declared size. Views borrow the mapping (they keep it alive); tensors
// that are strided or misaligned for their element type are copied into contiguous memory.
// Writing invariants: the pickle names every global torch's weights_only unpickler allows and no
// other; the data of each record starts at a multiple of 64 bytes (mmap=True loading and our own
// zero-copy views rely on it); the file appears under its name only once complete.
#include "formats/pth.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "formats/pickle.h"
#include "formats/zip.h"

namespace wan {

using pickle::Kind;
using pickle::Value;
using u128 = unsigned __int128;  // extents: a 63-bit size times a 63-bit stride fits; sums are clamped

struct PthReader {
  PthFile& f;
  const std::string& path;
  // Each dict is flattened once: a pickle can reference one sub-dict from many keys (memo), and
  // levels of {"a": d, "b": d} would list 2^levels tensors from a file of a few hundred bytes. Seen
  // once, the work and the tensor list stay linear in the size of data.pkl.
  std::set<const Value*> flattened{};

  static constexpr int kMaxNesting = 32;

  static std::string key_string(const Value* k) {
    if (k->kind == Kind::Str) return k->s;
    if (k->kind == Kind::Int) return std::to_string(k->i);
    return {};
  }

  void flatten(const Value* dict, const std::string& prefix, int depth) {
    WAN_CHECK(depth <= kMaxNesting, path, ": dicts nested deeper than ", kMaxNesting, " levels");
    WAN_CHECK(flattened.insert(dict).second, path, ": data.pkl reaches one dict through two keys ('",
              prefix.empty() ? "" : prefix.substr(0, prefix.size() - 1), "' is one of them); a state dict's sub-dicts are "
              "distinct");
    for (const auto& [k, v] : dict->dict) {
      std::string key = key_string(k);
      if (key.empty() && k->kind != Kind::Str) continue;  // None/bool keys never name tensors
      std::string name = prefix + key;
      if (v->kind == Kind::Tensor) {
        add_tensor(name, v);
      } else if (v->kind == Kind::Dict) {
        flatten(v, name + ".", depth + 1);
      }
      // Other leaves (ints, strings, lists: epochs, configs) are not weights.
    }
  }

  void add_tensor(const std::string& name, const Value* t) {
    const Value* st = t->storage;
    PthTensorInfo info;
    info.name = name;
    info.dtype = t->dtype;
    info.shape = Shape(t->size);
    info.stride = t->stride;
    info.storage_offset = t->storage_offset;
    info.storage_key = "data/" + st->s;
    auto rec = f.records_.find(info.storage_key);
    WAN_CHECK(rec != f.records_.end(), path, ": tensor '", name, "': storage '", st->s,
              "' has no record in the archive");
    const uint64_t rec_size = rec->second.second;
    // The storage's declared capacity (numel in elements of its type, or bytes when untyped).
    const u128 st_bytes = static_cast<u128>(st->numel) * (st->typed ? dtype_size(st->dtype) : 1);
    WAN_CHECK(st_bytes <= rec_size, path, ": tensor '", name, "': storage '", st->s, "' declares ",
              static_cast<uint64_t>(st_bytes > UINT64_MAX ? UINT64_MAX : st_bytes), " bytes but its record holds ",
              rec_size);
    // numel and extent in 128-bit arithmetic (dims and strides are below 2^63; sums saturate).
    u128 numel = 1, last = static_cast<uint64_t>(t->storage_offset);
    bool empty = false;
    for (size_t i = 0; i < t->size.size(); ++i) {
      if (t->size[i] == 0) empty = true;
      numel *= static_cast<uint64_t>(t->size[i]);
      if (numel > (u128{1} << 62)) numel = u128{1} << 100;  // saturate
      if (t->size[i] > 0) last += static_cast<u128>(t->size[i] - 1) * static_cast<uint64_t>(t->stride[i]);
      if (last > (u128{1} << 100)) last = u128{1} << 100;  // saturate: far beyond any file, no overflow
    }
    WAN_CHECK(empty || numel <= (u128{1} << 62), path, ": tensor '", name, "': shape ",
              info.shape.str(), " is too large");
    if (!empty) {
      u128 end = (last + 1) * dtype_size(t->dtype);
      WAN_CHECK(end <= st_bytes, path, ": tensor '", name, "' (shape ", info.shape.str(), ", offset ",
                t->storage_offset, ") extends to byte ", static_cast<uint64_t>(end > UINT64_MAX ? UINT64_MAX : end),
                " of storage '", st->s, "' which holds ", static_cast<uint64_t>(st_bytes), " bytes");
    }
    WAN_CHECK(!f.index_.count(name), path, ": tensor name '", name, "' appears twice after flattening nested dicts");
    f.index_[name] = f.tensors_.size();
    f.tensors_.push_back(std::move(info));
  }

  void read() {
    const uint8_t* data = f.file_->data();
    const size_t size = f.file_->size();
    // torch < 1.6 wrote a bare pickle stream (magic number first) or, before that, a tar file.
    bool zip = size >= 4 && std::memcmp(data, "PK", 2) == 0;
    bool legacy = (size >= 2 && data[0] == 0x80 && data[1] <= 5) ||
                  (size >= 262 && std::memcmp(data + 257, "ustar", 5) == 0);
    WAN_CHECK(!legacy || zip, path, ": legacy torch.save format is not supported; re-save with torch>=1.6");
    WAN_CHECK(zip, path, ": not a torch.save zip archive");
    std::vector<zip::Entry> entries = zip::read_directory(data, size, path);

    const zip::Entry* pkl = nullptr;
    for (const auto& e : entries) {
      if (e.name == "data.pkl" || (e.name.size() > 9 && e.name.compare(e.name.size() - 9, 9, "/data.pkl") == 0)) {
        WAN_CHECK(!pkl, path, ": archive holds two pickles ('", pkl ? pkl->name : "", "' and '", e.name, "')");
        pkl = &e;
      }
    }
    WAN_CHECK(pkl, path, ": zip archive has no data.pkl (not a torch.save file)");
    const std::string prefix = pkl->name.substr(0, pkl->name.size() - 8);  // "<archive>/"
    auto stored = [&](const zip::Entry& e) {
      WAN_CHECK(e.method == 0, path, ": zip entry '", e.name, "' is compressed (method ", e.method,
                "); only stored entries can be read");
    };
    for (const auto& e : entries) {
      if (e.name.compare(0, prefix.size(), prefix) != 0) continue;
      std::string rel = e.name.substr(prefix.size());
      if (rel.compare(0, 5, "data/") == 0) {
        stored(e);
        f.records_[rel] = {static_cast<size_t>(e.data_offset), static_cast<size_t>(e.size)};
      } else if (rel == "byteorder") {
        stored(e);
        WAN_CHECK(e.size <= 16, path, ": byteorder record of ", e.size, " bytes");
        std::string order(reinterpret_cast<const char*>(data + e.data_offset), e.size);
        WAN_CHECK(order == "little", path, ": byteorder is '", order, "'; only little-endian files are supported");
      }
    }
    stored(*pkl);
    const uint8_t* pkl_data = data + pkl->data_offset;
    WAN_CHECK(zip::crc32(0, pkl_data, pkl->size) == pkl->crc32, path, ": ", pkl->name,
              " fails its CRC-32 check (corrupt file)");

    pickle::Unpickler up(pkl_data, pkl->size, path);
    const Value* root = up.load();
    WAN_CHECK(root->kind == Kind::Dict, path, ": data.pkl holds a ", root->kind == Kind::Tensor ? "bare tensor" : "non-dict",
              " value, not a state dict of tensors");
    flatten(root, "", 0);
    WAN_CHECK(!f.tensors_.empty() || root->dict.empty(), path, ": state dict holds no tensors");
  }
};

std::shared_ptr<PthFile> PthFile::open(const std::string& path) {
  auto f = std::make_shared<PthFile>();
  f->file_ = MappedFile::open(path);
  PthReader{*f, path}.read();
  return f;
}

const PthTensorInfo* PthFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Tensor PthFile::get(const std::string& name) const {
  const PthTensorInfo* info = find(name);
  WAN_CHECK(info, path(), ": no tensor '", name, "'");
  const auto& rec = records_.at(info->storage_key);
  const size_t es = dtype_size(info->dtype);
  const int nd = info->shape.ndim;
  if (info->shape.numel() == 0) return Tensor::empty(info->dtype, info->shape);
  const uint8_t* base = file_->data() + rec.first + static_cast<size_t>(info->storage_offset) * es;

  bool contiguous = true;
  int64_t expect = 1;
  for (int i = nd - 1; i >= 0; --i) {
    if (info->shape[i] != 1 && info->stride[i] != expect) contiguous = false;
    expect *= info->shape[i];
  }
  if (contiguous && reinterpret_cast<uintptr_t>(base) % es == 0)
    return Tensor::borrow(file_, base, info->dtype, info->shape);

  // Gather: walk the outer indices like an odometer, copying one innermost row at a time.
  Tensor out = Tensor::empty(info->dtype, info->shape);
  auto* dst = static_cast<uint8_t*>(out.data());
  const int64_t inner = nd ? info->shape[nd - 1] : 1;
  const int64_t inner_stride = nd ? info->stride[nd - 1] : 1;
  std::array<int64_t, kMaxDims> idx{};
  const int64_t rows = info->shape.numel() / inner;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off = 0;
    for (int i = 0; i + 1 < nd; ++i) off += idx[i] * info->stride[i];
    const uint8_t* src = base + off * static_cast<int64_t>(es);
    if (inner_stride == 1) {
      std::memcpy(dst, src, static_cast<size_t>(inner) * es);
    } else {
      for (int64_t j = 0; j < inner; ++j) std::memcpy(dst + j * es, src + j * inner_stride * es, es);
    }
    dst += static_cast<size_t>(inner) * es;
    for (int i = nd - 2; i >= 0; --i) {
      if (++idx[i] < info->shape[i]) break;
      idx[i] = 0;
    }
  }
  return out;
}

// ---- writing ----
namespace {

// Protocol-2 pickle emitter for exactly the state-dict shape torch.save produces.
class PickleOut {
 public:
  std::string bytes;
  void op(uint8_t c) { bytes.push_back(static_cast<char>(c)); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) op(static_cast<uint8_t>(v >> (8 * i)));
  }
  void str(const std::string& s) {  // BINUNICODE, as torch writes
    op('X');
    u32(static_cast<uint32_t>(s.size()));
    bytes += s;
  }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      op('K');
      op(static_cast<uint8_t>(v));
    } else if (v >= 0 && v < 65536) {
      op('M');
      op(static_cast<uint8_t>(v));
      op(static_cast<uint8_t>(v >> 8));
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      op('J');
      u32(static_cast<uint32_t>(v));
    } else {  // LONG1: shortest little-endian two's complement
      uint8_t b[8];
      for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
      int n = 8;
      while (n > 1 && ((b[n - 1] == 0 && !(b[n - 2] & 0x80)) || (b[n - 1] == 0xFF && (b[n - 2] & 0x80)))) --n;
      op(0x8a);
      op(static_cast<uint8_t>(n));
      for (int i = 0; i < n; ++i) op(b[i]);
    }
  }
  void int_tuple(const std::vector<int64_t>& xs) {
    if (xs.empty()) return op(')');
    if (xs.size() > 3) op('(');
    for (int64_t x : xs) integer(x);
    op(xs.size() > 3 ? 't' : static_cast<uint8_t>(0x84 + xs.size()));
  }
  // GLOBAL, memoized so that each name is spelled once.
  void global(const std::string& module, const std::string& name) {
    std::string full = module + "\n" + name + "\n";
    auto it = memo_.find(full);
    if (it != memo_.end()) return get(it->second);
    op('c');
    bytes += full;
    memo_[full] = put();
  }
  // A string pushed once and fetched from the memo afterwards ("storage", "cpu").
  void memo_str(const std::string& s) {
    auto it = memo_.find("\x01" + s);
    if (it != memo_.end()) return get(it->second);
    str(s);
    memo_["\x01" + s] = put();
  }

 private:
  uint32_t put() {
    uint32_t idx = next_++;
    if (idx < 256) {
      op('q');
      op(static_cast<uint8_t>(idx));
    } else {
      op('r');
      u32(idx);
    }
    return idx;
  }
  void get(uint32_t idx) {
    if (idx < 256) {
      op('h');
      op(static_cast<uint8_t>(idx));
    } else {
      op('j');
      u32(idx);
    }
  }
  uint32_t next_ = 0;
  std::map<std::string, uint32_t> memo_;
};

// The legacy typed-storage class torch.save names for a dtype, or nullptr when torch uses an
// UntypedStorage plus _rebuild_tensor_v3 (float8).
const char* storage_class(DType t) {
  switch (t) {
    case DType::F32: return "FloatStorage";
    case DType::F64: return "DoubleStorage";
    case DType::F16: return "HalfStorage";
    case DType::BF16: return "BFloat16Storage";
    case DType::I64: return "LongStorage";
    case DType::I32: return "IntStorage";
    case DType::I16: return "ShortStorage";
    case DType::I8: return "CharStorage";
    case DType::U8: return "ByteStorage";
    case DType::Bool: return "BoolStorage";
    case DType::F8E4M3:
    case DType::F8E5M2: return nullptr;
  }
  return nullptr;
}

std::string state_dict_pickle(const std::vector<TensorSpec>& specs) {
  PickleOut p;
  p.op(0x80);
  p.op(2);
  p.global("collections", "OrderedDict");
  p.op(')');
  p.op('R');
  // Batches of 1000 items per SETITEMS, as CPython's pickler does.
  for (size_t b = 0; b < specs.size(); b += 1000) {
    p.op('(');
    for (size_t i = b; i < std::min(specs.size(), b + 1000); ++i) {
      const TensorSpec& s = specs[i];
      const char* cls = storage_class(s.dtype);
      std::vector<int64_t> shape = s.shape.vec(), stride(shape.size());
      int64_t st = 1;
      for (size_t d = shape.size(); d-- > 0;) {
        stride[d] = st;
        st *= shape[d];
      }
      p.str(s.name);
      p.global("torch._utils", cls ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3");
      p.op('(');
      p.op('(');  // persistent id ("storage", type, key, location, numel)
      p.memo_str("storage");
      if (cls) {
        p.global("torch", cls);
      } else {
        p.global("torch.storage", "UntypedStorage");
      }
      p.str(std::to_string(i));
      p.memo_str("cpu");
      p.integer(cls ? s.shape.numel() : static_cast<int64_t>(s.nbytes()));  // untyped: bytes
      p.op('t');
      p.op('Q');
      p.integer(0);
      p.int_tuple(shape);
      p.int_tuple(stride);
      p.op(0x89);  // requires_grad = False
      p.global("collections", "OrderedDict");
      p.op(')');
      p.op('R');  // backward hooks: OrderedDict()
      if (!cls) p.global("torch", s.dtype == DType::F8E4M3 ? "float8_e4m3fn" : "float8_e5m2");
      p.op('t');
      p.op('R');
    }
    p.op('u');
  }
  p.op('.');
  return p.bytes;
}

}  // namespace

void write_pth(const std::string& path, const std::vector<TensorSpec>& specs, const TensorFill& fill,
               const PthWriteOptions& opt) {
  std::set<std::string> names;
  size_t max_bytes = 0;
  for (const auto& s : specs) {
    WAN_CHECK(!s.name.empty(), path, ": empty tensor name");
    WAN_CHECK(names.insert(s.name).second, path, ": tensor '", s.name, "' listed twice");
    for (int d = 0; d < s.shape.ndim; ++d)
      WAN_CHECK(s.shape[d] >= 0, path, ": tensor '", s.name, "' has negative shape ", s.shape.str());
    max_bytes = std::max(max_bytes, s.nbytes());
  }
  std::string stem = std::filesystem::path(path).stem().string();
  if (stem.empty()) stem = "archive";
  const std::string tmp = path + ".tmp";
  try {
    zip::Writer w(tmp, {opt.force_zip64, 64});
    auto add_str = [&](const std::string& rel, const std::string& s) { w.add(stem + "/" + rel, s.data(), s.size()); };
    add_str("data.pkl", state_dict_pickle(specs));
    add_str(".format_version", "1");
    add_str(".storage_alignment", "64");
    add_str("byteorder", "little");
    std::shared_ptr<void> buf = aligned_alloc_shared(std::max<size_t>(max_bytes, 1));
    for (size_t i = 0; i < specs.size(); ++i) {
      const size_t n = specs[i].nbytes();
      if (n) WAN_WITH_CONTEXT(cat(path, ": tensor '", specs[i].name, "'"), fill(specs[i], buf.get()));
      w.add(cat(stem, "/data/", i), buf.get(), n);
    }
    add_str("version", "3\n");
    w.finish();
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    WAN_THROW(path, ": cannot rename from ", tmp, ": ", ec.message());
  }
}

}  // namespace wan
