// safetensors reading and writing.
// Reading: the whole file is memory-mapped; open() validates the 8-byte length, the header bounds,
// the JSON (duplicate keys included, which nlohmann would otherwise silently collapse), every entry
// and every byte range before any tensor is handed out, so a later get() can never read outside
// the mapping. Every defect is one wan::Error "<file>: [tensor '<name>': ]<problem>".
// Writing: header first (padded with spaces to a multiple of 8 so the data section is 8-byte
// aligned), then each tensor contiguously in the given order through one reusable buffer, into a
// unique temporary file that is fsync'ed and renamed over the target (formats/output_file.h), so a
// reader never sees a half-written file and a mapped file is never truncated under its reader.
#include "formats/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "core/error.h"
#include "formats/output_file.h"

namespace wan {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Same limit as the reference implementation: a larger header is almost surely garbage and would
// make us parse (and allocate for) an arbitrary amount of JSON.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeEntry {
  const char* name;
  DType type;
};
constexpr DtypeEntry kDtypes[] = {
    {"F64", DType::F64},         {"F32", DType::F32},         {"F16", DType::F16}, {"BF16", DType::BF16},
    {"F8_E4M3", DType::F8E4M3}, {"F8_E5M2", DType::F8E5M2}, {"I64", DType::I64}, {"I32", DType::I32},
    {"I16", DType::I16},         {"I8", DType::I8},           {"U8", DType::U8},   {"BOOL", DType::Bool},
};

std::optional<DType> parse_dtype(const std::string& s) {
  for (const auto& e : kDtypes)
    if (s == e.name) return e.type;
  return std::nullopt;
}

// A JSON value as it appears in the file, shortened so that a huge bogus value cannot flood the
// error message. Nesting is cut at a few levels: nlohmann's dump() recurses, and a header can nest
// millions deep, which would overflow the stack.
void brief_into(const json& v, std::string& out, int depth) {
  constexpr size_t kMax = 60;
  if (v.is_structured()) {
    const bool arr = v.is_array();
    if (depth >= 4 && !v.empty()) {
      out += arr ? "[...]" : "{...}";
      return;
    }
    out += arr ? '[' : '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end() && out.size() <= kMax; ++it) {
      if (!first) out += ',';
      first = false;
      if (!arr) out += json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace) + ':';
      brief_into(it.value(), out, depth + 1);
    }
    out += arr ? ']' : '}';
  } else {
    out += v.dump(-1, ' ', false, json::error_handler_t::replace);
  }
}
std::string brief(const json& v) {
  std::string s;
  brief_into(v, s, 0);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// nlohmann prefixes messages with "[json.exception.parse_error.101] "; users need only the rest.
std::string json_message(const json::exception& e) {
  std::string m = e.what();
  if (!m.empty() && m[0] == '[') {
    size_t p = m.find("] ");
    if (p != std::string::npos) m = m.substr(p + 2);
  }
  return m;
}

// Parses JSON and rejects duplicate keys in any object (JSON allows them, but for a header they
// mean two conflicting definitions of one tensor and nlohmann would keep only one of them).
json parse_json_strict(const char* p, size_t n, const std::string& path, const char* what) {
  struct Level {
    std::set<std::string> keys;
    std::string parent;  // key under which this object sits ("" at the top)
    std::string last;    // most recent key, the parent of a nested object
  };
  std::vector<Level> open;  // one per object being parsed
  std::optional<std::string> duplicate;
  auto cb = [&](int /*depth*/, json::parse_event_t ev, json& parsed) -> bool {
    switch (ev) {
      case json::parse_event_t::object_start:
        open.push_back({{}, open.empty() ? std::string() : open.back().last, {}});
        break;
      case json::parse_event_t::object_end:
        if (!open.empty()) open.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open.empty() && parsed.is_string()) {
          Level& l = open.back();
          l.last = parsed.get_ref<const std::string&>();
          if (!l.keys.insert(l.last).second && !duplicate)
            duplicate = cat("the key '", l.last, "' twice", l.parent.empty() ? "" : cat(" in '", l.parent, "'"));
        }
        break;
      default:
        break;
    }
    return true;
  };
  // nlohmann stops at a NUL byte as if the input ended there, which would accept "{}\0<junk>";
  // JSON never contains a raw NUL, so any NUL is a defect. An empty file maps to a null pointer,
  // which memchr must not see even for n == 0.
  if (const void* z = n > 0 ? std::memchr(p, 0, n) : nullptr)
    WAN_THROW(path, ": ", what, " is not valid JSON: NUL byte at offset ", static_cast<const char*>(z) - p);
  json j;
  try {
    j = json::parse(p, p + n, cb);
  } catch (const json::exception& e) {
    WAN_THROW(path, ": ", what, " is not valid JSON: ", json_message(e));
  }
  if (duplicate) WAN_THROW(path, ": ", what, " has ", *duplicate);
  return j;
}

// A JSON non-negative integer, or nothing (negative numbers, floats, strings, ... are refused).
std::optional<uint64_t> as_uint(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    int64_t x = v.get<int64_t>();
    if (x >= 0) return static_cast<uint64_t>(x);
  }
  return std::nullopt;
}

[[noreturn]] void tensor_error(const std::string& path, const std::string& name, const std::string& msg) {
  throw Error(cat(path, ": tensor '", name, "': ", msg));
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Validates one header entry; `data_size` is the byte length of the data section.
TensorInfo parse_entry(const std::string& path, const std::string& name, const json& e, uint64_t data_size) {
  if (!e.is_object())
    tensor_error(path, name, cat("entry is ", e.type_name(), " ", brief(e),
                                 ", expected an object with dtype, shape and data_offsets"));
  for (auto it = e.begin(); it != e.end(); ++it) {
    const std::string& k = it.key();
    if (k != "dtype" && k != "shape" && k != "data_offsets")
      tensor_error(path, name, cat("unexpected field '", k, "' (expected exactly dtype, shape, data_offsets)"));
  }
  for (const char* k : {"dtype", "shape", "data_offsets"})
    if (!e.contains(k)) tensor_error(path, name, cat("missing field '", k, "'"));

  TensorInfo ti;
  ti.name = name;
  const json& dt = e["dtype"];
  if (!dt.is_string()) tensor_error(path, name, cat("dtype is ", dt.type_name(), " ", brief(dt), ", expected a string"));
  auto t = parse_dtype(dt.get<std::string>());
  if (!t)
    tensor_error(path, name, cat("unknown dtype ", brief(dt),
                                 " (known: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U8 BOOL)"));
  ti.dtype = *t;

  const json& sh = e["shape"];
  if (!sh.is_array()) tensor_error(path, name, cat("shape is ", sh.type_name(), " ", brief(sh), ", expected an array"));
  if (sh.size() > static_cast<size_t>(kMaxDims))
    tensor_error(path, name, cat("shape ", brief(sh), " has ", sh.size(), " dims (at most ", kMaxDims, " supported)"));
  std::vector<int64_t> dims;
  uint64_t numel = 1;
  constexpr uint64_t kMaxI64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  for (const json& d : sh) {
    auto v = as_uint(d);
    if (!v) tensor_error(path, name, cat("shape ", brief(sh), " has ", brief(d), ", expected a non-negative integer"));
    if (*v > kMaxI64 || __builtin_mul_overflow(numel, *v, &numel) || numel > kMaxI64)
      tensor_error(path, name, cat("shape ", brief(sh), " has too many elements (overflows 64 bits)"));
    dims.push_back(static_cast<int64_t>(*v));
  }
  ti.shape = Shape(dims);
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(ti.dtype)), &nbytes))
    tensor_error(path, name, cat("shape ", ti.shape.str(), " x ", dt.get<std::string>(), " overflows 64 bits"));

  const json& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    tensor_error(path, name, cat("data_offsets is ", brief(off), ", expected [begin, end]"));
  auto b = as_uint(off[0]), en = as_uint(off[1]);
  if (!b || !en) tensor_error(path, name, cat("data_offsets ", brief(off), " must be non-negative integers"));
  if (*b > *en) tensor_error(path, name, cat("data_offsets [", *b, ", ", *en, "]: begin is after end"));
  if (*en > data_size)
    tensor_error(path, name, cat("data_offsets [", *b, ", ", *en, "] exceed the data section (", data_size, " bytes)"));
  if (*en - *b != nbytes)
    tensor_error(path, name, cat("shape ", ti.shape.str(), " x ", dt.get<std::string>(), " is ", nbytes,
                                 " bytes but data_offsets [", *b, ", ", *en, "] span ", *en - *b, " bytes"));
  ti.begin = *b;
  ti.end = *en;
  return ti;
}

// ---- writing helpers ----

// Validates the specs (names unique and non-reserved, sizes representable) and returns the padded
// header text.
std::string build_header(const std::string& path, const std::vector<TensorSpec>& specs,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  std::set<std::string> seen;
  uint64_t off = 0;
  for (const TensorSpec& s : specs) {
    WAN_CHECK(!s.name.empty(), path, ": a tensor has an empty name");
    WAN_CHECK(s.name != "__metadata__", path, ": '__metadata__' is reserved and cannot name a tensor");
    WAN_CHECK(seen.insert(s.name).second, path, ": tensor '", s.name, "' is listed twice");
    uint64_t numel = 1;
    for (int i = 0; i < s.shape.ndim; ++i) {
      WAN_CHECK(s.shape.d[i] >= 0, path, ": tensor '", s.name, "': negative dimension in shape ", s.shape.str());
      WAN_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(s.shape.d[i]), &numel), path, ": tensor '",
                s.name, "': shape ", s.shape.str(), " overflows");
    }
    uint64_t nbytes = 0, end = 0;
    WAN_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(s.dtype)), &nbytes) &&
                  !__builtin_add_overflow(off, nbytes, &end),
              path, ": tensor '", s.name, "': size overflows");
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = dtype_to_safetensors(s.dtype);
    e["shape"] = s.shape.vec();
    e["data_offsets"] = nlohmann::ordered_json::array({off, end});
    h[s.name] = std::move(e);
    off = end;
  }
  std::string text;
  try {
    text = h.dump();
  } catch (const json::exception& e) {  // invalid UTF-8 in a name or a metadata string
    WAN_THROW(path, ": cannot encode the header: ", json_message(e));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  WAN_CHECK(text.size() <= kMaxHeaderBytes, path, ": header would be ", text.size(), " bytes (limit ",
            kMaxHeaderBytes, ")");
  return text;
}

// Streams header + tensors; source(i) returns the bytes of tensor i (valid until the next call).
void write_impl(const std::string& path, const std::vector<TensorSpec>& specs,
                const std::map<std::string, std::string>& metadata,
                const std::function<const void*(size_t)>& source) {
  const std::string header = build_header(path, specs, metadata);  // validate before touching the disk
  OutputFile out(path, path);
  uint8_t len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  out.write(len, 8);
  out.write(header.data(), header.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const void* p = source(i);
    size_t nb = specs[i].nbytes();
    if (nb > 0) out.write(p, nb);
  }
  out.commit();
}

void write_text_atomic(const std::string& path, const std::string& text) {
  OutputFile out(path, path);
  out.write(text.data(), text.size());
  out.commit();
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto f = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  f->file_ = MappedFile::open(path);
  const uint8_t* base = f->file_->data();
  const uint64_t size = f->file_->size();
  WAN_CHECK(size >= 8, path, ": file is too short (", size, " bytes) to hold the 8-byte header length");
  const uint64_t n = read_u64_le(base);
  WAN_CHECK(n >= 2, path, ": header length ", n, " is too small (at least 2 bytes: \"{}\")");
  WAN_CHECK(n <= kMaxHeaderBytes, path, ": header length ", n, " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  WAN_CHECK(n <= size - 8, path, ": header length ", n, " extends past the end of the file (", size, " bytes)");
  f->data_start_ = static_cast<size_t>(8 + n);
  const uint64_t data_size = size - 8 - n;

  json h = parse_json_strict(reinterpret_cast<const char*>(base + 8), static_cast<size_t>(n), path, "header");
  WAN_CHECK(h.is_object(), path, ": header is a JSON ", h.type_name(), ", expected an object");

  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      WAN_CHECK(v.is_object(), path, ": __metadata__ is ", v.type_name(), " ", brief(v),
                ", expected an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        WAN_CHECK(m.value().is_string(), path, ": __metadata__ value of '", m.key(), "' is ", m.value().type_name(),
                  " ", brief(m.value()), ", expected a string");
        f->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    f->tensors_.push_back(parse_entry(path, name, v, data_size));
  }

  auto& ts = f->tensors_;
  std::sort(ts.begin(), ts.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end != b.end ? a.end < b.end : a.name < b.name;
  });
  // Sorted by begin, a non-empty range overlaps an earlier one iff it starts before the furthest
  // end seen so far; empty tensors own no bytes and cannot overlap anything.
  const TensorInfo* furthest = nullptr;
  for (const TensorInfo& t : ts) {
    if (t.begin == t.end) continue;
    if (furthest && t.begin < furthest->end)
      tensor_error(path, t.name, cat("data_offsets [", t.begin, ", ", t.end, "] overlap tensor '", furthest->name,
                                     "' [", furthest->begin, ", ", furthest->end, "]"));
    if (!furthest || t.end > furthest->end) furthest = &t;
  }
  for (size_t i = 0; i < ts.size(); ++i) f->index_[ts[i].name] = i;
  return f;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const uint8_t* SafetensorsFile::data_section() const { return file_->data() + data_start_; }

Tensor SafetensorsFile::get(const std::string& name) const {
  const TensorInfo* ti = find(name);
  if (!ti) WAN_THROW(path(), ": tensor '", name, "' not found");
  const uint8_t* p = data_section() + ti->begin;
  // Files from other writers may leave a tensor misaligned for its element type (the header
  // length need not be a multiple of 8); typed access to such memory is undefined, so those
  // tensors (only those) are copied into aligned storage.
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(ti->dtype) != 0) {
    Tensor t = Tensor::empty(ti->dtype, ti->shape);
    if (ti->nbytes()) std::memcpy(t.data(), p, ti->nbytes());
    return t;
  }
  return Tensor::borrow(std::shared_ptr<const void>(file_), p, ti->dtype, ti->shape);
}

// ---------------------------------------------------------------------------------------------
// SafetensorsSet

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Resolves a folder to the one checkpoint it holds.
std::string resolve_folder(const std::string& dir) {
  std::vector<std::string> indexes, singles;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    if (!it->is_regular_file(ec2)) continue;
    std::string fname = it->path().filename().string();
    if (ends_with(fname, ".safetensors.index.json")) indexes.push_back(it->path().string());
    else if (ends_with(fname, ".safetensors")) singles.push_back(it->path().string());
  }
  if (ec) WAN_THROW(dir, ": cannot list folder: ", ec.message());
  std::sort(indexes.begin(), indexes.end());
  std::sort(singles.begin(), singles.end());
  auto names = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& p : v) s += (s.empty() ? "" : ", ") + fs::path(p).filename().string();
    return s;
  };
  if (indexes.size() == 1) return indexes[0];
  WAN_CHECK(indexes.empty(), dir, ": folder holds several index files (", names(indexes), "); pass one of them");
  WAN_CHECK(!singles.empty(), dir, ": folder holds no .safetensors or .safetensors.index.json file");
  WAN_CHECK(singles.size() == 1, dir, ": folder holds ", singles.size(), " .safetensors files (", names(singles),
            ") and no .safetensors.index.json; pass one file or add an index");
  return singles[0];
}

}  // namespace

SafetensorsSet SafetensorsSet::open(const std::string& path) {
  SafetensorsSet s;
  s.source_ = path;
  std::error_code ec;
  std::string target = fs::is_directory(path, ec) ? resolve_folder(path) : path;

  if (!ends_with(target, ".json")) {
    s.files_.push_back(SafetensorsFile::open(target));
    for (const TensorInfo& t : s.files_[0]->tensors()) s.where_[t.name] = 0;
    return s;
  }

  // Sharded: {"metadata": {...}, "weight_map": {tensor: shard file relative to the index}}.
  auto idx = MappedFile::open(target);
  json j = parse_json_strict(reinterpret_cast<const char*>(idx->data()), idx->size(), target, "index");
  WAN_CHECK(j.is_object(), target, ": index is a JSON ", j.type_name(), ", expected an object");
  WAN_CHECK(!j.contains("metadata") || j["metadata"].is_object(), target, ": \"metadata\" is ",
            j["metadata"].type_name(), ", expected an object");
  WAN_CHECK(j.contains("weight_map"), target, ": index has no \"weight_map\"");
  const json& wm = j["weight_map"];
  WAN_CHECK(wm.is_object(), target, ": \"weight_map\" is ", wm.type_name(), ", expected an object");
  WAN_CHECK(!wm.empty(), target, ": \"weight_map\" is empty");

  const fs::path dir = fs::path(target).parent_path();
  std::map<std::string, std::string> shard_of;  // tensor -> shard file name
  std::map<std::string, size_t> shard_index;    // shard file name -> index into files_
  for (auto it = wm.begin(); it != wm.end(); ++it) {
    const std::string& name = it.key();
    WAN_CHECK(it.value().is_string(), target, ": tensor '", name, "': weight_map value is ", it.value().type_name(),
              " ", brief(it.value()), ", expected a shard file name");
    const std::string shard = it.value().get<std::string>();
    fs::path sp(shard);
    bool bad = shard.empty() || sp.is_absolute();
    for (const auto& part : sp) bad = bad || part == "..";
    WAN_CHECK(!bad, target, ": tensor '", name, "': shard file name '", shard,
              "' must be a relative path inside the index's folder");
    shard_of[name] = shard;
    shard_index.emplace(shard, 0);
  }
  for (auto& [shard, i] : shard_index) {
    i = s.files_.size();
    try {
      s.files_.push_back(SafetensorsFile::open((dir / shard).string()));
    } catch (const Error& e) {
      throw e.with_context(cat(target, ": shard '", shard, "'"));
    }
  }
  for (const auto& [name, shard] : shard_of) {
    WAN_CHECK(s.files_[shard_index[shard]]->find(name) != nullptr, target, ": tensor '", name,
              "' is mapped to shard '", shard, "' but that shard does not contain it");
    s.where_[name] = shard_index[shard];
  }
  for (const auto& [shard, i] : shard_index) {
    for (const TensorInfo& t : s.files_[i]->tensors()) {
      auto w = shard_of.find(t.name);
      WAN_CHECK(w != shard_of.end(), target, ": tensor '", t.name, "' is in shard '", shard,
                "' but weight_map does not list it");
      WAN_CHECK(w->second == shard, target, ": tensor '", t.name, "' is in two shards: '", w->second, "' and '", shard,
                "'");
    }
  }
  return s;
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> v;
  v.reserve(where_.size());
  for (const auto& [n, i] : where_) v.push_back(n);
  return v;
}

const TensorInfo& SafetensorsSet::info(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) WAN_THROW(source_, ": tensor '", name, "' not found");
  return *files_[it->second]->find(name);
}

Tensor SafetensorsSet::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) WAN_THROW(source_, ": tensor '", name, "' not found");
  return files_[it->second]->get(name);
}

// ---------------------------------------------------------------------------------------------
// Writing

void write_safetensors(const std::string& path, const std::vector<TensorSpec>& specs, const TensorFill& fill,
                       const std::map<std::string, std::string>& metadata) {
  // One buffer sized for the largest tensor, allocated on first use and reused: memory stays at
  // one tensor however large the file. calloc hands out lazily zeroed pages, so bytes a faulty
  // callback leaves unset are zeros rather than leftover heap contents.
  std::unique_ptr<uint8_t, FreeDeleter> buf;
  write_impl(path, specs, metadata, [&](size_t i) -> const void* {
    if (!buf) {
      size_t cap = 64;
      for (const TensorSpec& s : specs) cap = std::max(cap, s.nbytes());
      buf.reset(static_cast<uint8_t*>(std::calloc(cap, 1)));
      if (!buf) WAN_THROW(path, ": cannot allocate a ", cap, "-byte write buffer");
    }
    fill(specs[i], buf.get());
    return buf.get();
  });
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    WAN_CHECK(t.view().device.is_cpu(), path, ": tensor '", name, "' is not on the host");
    WAN_CHECK(t.view().is_contiguous(), path, ": tensor '", name, "' is not contiguous");
    WAN_CHECK(t.numel() == 0 || t.data() != nullptr, path, ": tensor '", name, "' has no data");
    specs.push_back({name, t.dtype(), t.shape()});
  }
  // Host tensors are written straight from their storage: no staging copy.
  write_impl(path, specs, metadata, [&](size_t i) -> const void* { return tensors[i].second.data(); });
}

std::vector<std::string> write_safetensors_sharded(const std::string& dir, const std::string& prefix,
                                                   const std::vector<TensorSpec>& specs, const TensorFill& fill,
                                                   size_t max_shard_bytes) {
  WAN_CHECK(max_shard_bytes > 0, dir, ": max_shard_bytes must be positive");
  WAN_CHECK(!prefix.empty(), dir, ": empty file prefix");
  std::set<std::string> seen;
  for (const TensorSpec& s : specs) WAN_CHECK(seen.insert(s.name).second, dir, ": tensor '", s.name, "' is listed twice");

  // Greedy in the given order; a tensor that does not fit starts a new shard, so one larger than
  // the limit ends up alone.
  std::vector<std::vector<TensorSpec>> groups(1);
  size_t cur = 0;
  uint64_t total = 0;
  for (const TensorSpec& s : specs) {
    size_t nb = s.nbytes();
    if (!groups.back().empty() && (cur + nb > max_shard_bytes || cur + nb < cur)) {
      groups.emplace_back();
      cur = 0;
    }
    groups.back().push_back(s);
    cur += nb;
    total += nb;
  }
  // Loaders in the Hugging Face ecosystem expect format=pt on every shard.
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  if (groups.size() == 1) {
    std::string p = (fs::path(dir) / (prefix + ".safetensors")).string();
    write_safetensors(p, groups[0], fill, meta);
    return {p};
  }

  std::vector<std::string> written;
  try {
    json weight_map = json::object();
    const size_t n = groups.size();
    for (size_t g = 0; g < n; ++g) {
      char name[64];
      std::snprintf(name, sizeof name, "-%05zu-of-%05zu.safetensors", g + 1, n);
      const std::string fname = prefix + name;
      const std::string p = (fs::path(dir) / fname).string();
      write_safetensors(p, groups[g], fill, meta);
      written.push_back(p);
      for (const TensorSpec& s : groups[g]) weight_map[s.name] = fname;
    }
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", std::move(weight_map)}};
    const std::string ip = (fs::path(dir) / (prefix + ".safetensors.index.json")).string();
    std::string text;
    try {
      text = index.dump(2) + "\n";
    } catch (const json::exception& e) {
      WAN_THROW(ip, ": cannot encode the index: ", json_message(e));
    }
    write_text_atomic(ip, text);
    written.push_back(ip);
  } catch (...) {
    // A partial shard set is worse than none: a reader would find shards without an index.
    for (const std::string& p : written) ::unlink(p.c_str());
    throw;
  }
  return written;
}

}  // namespace wan
