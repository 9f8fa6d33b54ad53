// Tests for the safetensors reader and writer: round trips of every dtype on fresh random bytes
// (zero-copy views checked by pointer), metadata, empty tensors, every malformed-file defect the
// reader must reject with one clear error (built byte by byte here), sharded sets and their index
// errors, writer failure paths (tmp file removed, nothing half-written), and a cross-check against
// the Python `safetensors` package in both directions (tools/st_crosscheck.py through WAN_PYTHON).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace wan;

namespace {

using wan::test::TempDir;

uint64_t fresh_seed() { return (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}(); }

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A safetensors file from a header text and `data_len` data bytes (non-zero pattern).
std::string st_bytes(const std::string& header, size_t data_len) {
  std::string s = le64(header.size()) + header;
  for (size_t i = 0; i < data_len; ++i) s.push_back(static_cast<char>(i * 7 + 1));
  return s;
}

std::string to_hex(const void* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  const uint8_t* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    s.push_back(d[b[i] >> 4]);
    s.push_back(d[b[i] & 15]);
  }
  return s;
}

// Runs fn, requires a wan::Error whose message contains every needle.
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> needles) {
  try {
    fn();
  } catch (const Error& e) {
    std::string m = e.what();
    for (const std::string& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "missing '" << n << "' in: " << m;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected wan::Error, got another exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected wan::Error, nothing was thrown";
}

const DType kAllDtypes[] = {DType::F64, DType::F32,    DType::F16,    DType::BF16, DType::F8E4M3, DType::F8E5M2,
                            DType::I64, DType::I32,    DType::I16,    DType::I8,   DType::U8,     DType::Bool};

// Random bytes per tensor name; BOOL gets 0/1 so the file is also valid for other readers.
struct RandomData {
  std::mt19937_64 rng;
  std::map<std::string, std::vector<uint8_t>> bytes;
  explicit RandomData(uint64_t seed) : rng(seed) {}
  void add(const TensorSpec& s) {
    std::vector<uint8_t> b(s.nbytes());
    for (auto& x : b) x = static_cast<uint8_t>(s.dtype == DType::Bool ? rng() & 1 : rng());
    bytes[s.name] = std::move(b);
  }
  TensorFill fill() const {
    return [this](const TensorSpec& s, void* dst) {
      const auto& b = bytes.at(s.name);
      if (!b.empty()) std::memcpy(dst, b.data(), b.size());
    };
  }
};

Shape random_shape(std::mt19937_64& rng) {
  int nd = static_cast<int>(rng() % 4);  // 0..3 dims, a 0-dim scalar included
  std::vector<int64_t> d;
  for (int i = 0; i < nd; ++i) d.push_back(1 + static_cast<int64_t>(rng() % 9));
  return Shape(d);
}

// True when [p, p+n) lies inside the file's data section as mapped (i.e. the view is zero-copy).
bool inside_mapping(const SafetensorsFile& f, const void* p, size_t n) {
  uint8_t head[8] = {};
  std::ifstream(f.path(), std::ios::binary).read(reinterpret_cast<char*>(head), 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | head[i];
  const uint8_t* lo = f.data_section();
  const uint8_t* hi = lo + (fs::file_size(f.path()) - 8 - header_len);
  const uint8_t* q = static_cast<const uint8_t*>(p);
  return q >= lo && q + n <= hi;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Round trips

TEST(Safetensors, RoundTripEveryDtypeZeroCopy) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  TempDir tmp;
  RandomData data(seed);
  // Ordered by element size, largest first (as the reference writer orders them): every tensor
  // then starts aligned for its type, so every view below must be zero-copy.
  std::vector<DType> dtypes(std::begin(kAllDtypes), std::end(kAllDtypes));
  std::stable_sort(dtypes.begin(), dtypes.end(), [](DType a, DType b) { return dtype_size(a) > dtype_size(b); });
  std::vector<TensorSpec> specs;
  for (DType t : dtypes)
    for (int rep = 0; rep < 2; ++rep) {
      TensorSpec s{cat("blocks.", rep, ".", dtype_to_safetensors(t), ".weight"), t, random_shape(data.rng)};
      data.add(s);
      specs.push_back(s);
    }
  const std::string path = tmp.file("model.safetensors");
  std::vector<const void*> dsts;
  std::vector<std::string> order;
  write_safetensors(path, specs, [&](const TensorSpec& s, void* dst) {
    dsts.push_back(dst);
    order.push_back(s.name);
    data.fill()(s, dst);
  });
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  // Streaming: called once per tensor, in order, always into the same reusable buffer.
  ASSERT_EQ(order.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(order[i], specs[i].name);
    EXPECT_EQ(dsts[i], dsts[0]);
  }

  // Layout: header padded with spaces to a multiple of 8, tensors contiguous in the given order.
  const std::string raw = read_all(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(raw[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(raw[8], '{');
  size_t close = raw.rfind('}', 8 + n - 1);
  for (size_t i = close + 1; i < 8 + n; ++i) EXPECT_EQ(raw[i], ' ');
  size_t total = 0;
  for (const auto& s : specs) total += s.nbytes();
  EXPECT_EQ(raw.size(), 8 + n + total);

  auto f = SafetensorsFile::open(path);
  ASSERT_EQ(f->tensors().size(), specs.size());
  uint64_t off = 0;
  std::vector<Tensor> views;
  for (const auto& s : specs) {
    SCOPED_TRACE(s.name);
    const TensorInfo* ti = f->find(s.name);
    ASSERT_NE(ti, nullptr);
    EXPECT_EQ(ti->dtype, s.dtype);
    EXPECT_EQ(ti->shape, s.shape);
    EXPECT_EQ(ti->begin, off);
    EXPECT_EQ(ti->end, off + s.nbytes());
    off += s.nbytes();
    Tensor t = f->get(s.name);
    EXPECT_EQ(t.dtype(), s.dtype);
    EXPECT_EQ(t.shape(), s.shape);
    ASSERT_EQ(t.nbytes(), data.bytes[s.name].size());
    EXPECT_EQ(0, std::memcmp(t.data(), data.bytes[s.name].data(), t.nbytes()));
    EXPECT_TRUE(inside_mapping(*f, t.data(), t.nbytes())) << "view is not zero-copy";
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % dtype_size(s.dtype), 0u);
    views.push_back(t);
  }
  // tensors() is sorted by offset
  for (size_t i = 1; i < f->tensors().size(); ++i) EXPECT_LE(f->tensors()[i - 1].begin, f->tensors()[i].begin);
  EXPECT_TRUE(f->metadata().empty());
  EXPECT_EQ(raw.find("__metadata__"), std::string::npos);

  // Views keep the mapping alive after the file object is gone.
  f.reset();
  for (size_t i = 0; i < specs.size(); ++i)
    EXPECT_EQ(0, std::memcmp(views[i].data(), data.bytes[specs[i].name].data(), views[i].nbytes()));
}

TEST(Safetensors, RoundTripFromHostTensors) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  TempDir tmp;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (DType t : kAllDtypes) {
    Tensor x = Tensor::empty(t, random_shape(rng));
    auto* b = static_cast<uint8_t*>(x.data());
    for (size_t i = 0; i < x.nbytes(); ++i) b[i] = static_cast<uint8_t>(t == DType::Bool ? rng() & 1 : rng() | 1);
    tensors.emplace_back(cat("t_", dtype_name(t)), x);
  }
  const std::string path = tmp.file("host.safetensors");
  write_safetensors(path, tensors, {{"k", "v"}});
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->metadata().at("k"), "v");
  for (const auto& [name, x] : tensors) {
    Tensor y = f->get(name);
    EXPECT_EQ(y.dtype(), x.dtype());
    EXPECT_EQ(y.shape(), x.shape());
    EXPECT_EQ(0, std::memcmp(y.data(), x.data(), x.nbytes())) << name;
  }
}

TEST(Safetensors, MetadataRoundTrip) {
  TempDir tmp;
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"empty", ""}, {"quote\"and\\slash", "line1\nline2\ttab"}, {"unicode", "Wan 2.2 \xe2\x9c\x93 \xe4\xb8\xad"},
      {"json", "{\"nested\": [1, 2]}"}};
  RandomData data(fresh_seed());
  std::vector<TensorSpec> specs = {{"w", DType::F32, {3, 4}}};
  data.add(specs[0]);
  const std::string path = tmp.file("meta.safetensors");
  write_safetensors(path, specs, data.fill(), meta);
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->metadata(), meta);
  EXPECT_EQ(0, std::memcmp(f->get("w").data(), data.bytes["w"].data(), 48));
}

TEST(Safetensors, EmptyTensors) {
  TempDir tmp;
  RandomData data(fresh_seed());
  std::vector<TensorSpec> specs = {{"a", DType::F32, {0}},     {"b", DType::BF16, {2, 3}}, {"c", DType::I64, {3, 0, 2}},
                                   {"d", DType::U8, {5}},      {"e", DType::F16, {0, 7}},  {"scalar", DType::F64, {}}};
  for (const auto& s : specs) data.add(s);
  const std::string path = tmp.file("empty.safetensors");
  write_safetensors(path, specs, data.fill());
  auto f = SafetensorsFile::open(path);
  ASSERT_EQ(f->tensors().size(), specs.size());
  for (const auto& s : specs) {
    SCOPED_TRACE(s.name);
    Tensor t = f->get(s.name);
    EXPECT_EQ(t.shape(), s.shape);
    EXPECT_EQ(t.numel(), s.shape.numel());
    EXPECT_TRUE(t.defined());
    if (t.nbytes()) {
      EXPECT_EQ(0, std::memcmp(t.data(), data.bytes[s.name].data(), t.nbytes()));
    } else {
      EXPECT_EQ(f->find(s.name)->begin, f->find(s.name)->end);
    }
  }
  EXPECT_EQ(f->get("scalar").numel(), 1);

  // A file of only empty tensors: the data section is empty.
  const std::string p2 = tmp.file("all_empty.safetensors");
  const std::vector<TensorSpec> z = {{"z", DType::F32, {0, 4}}};
  data.add(z[0]);
  write_safetensors(p2, z, data.fill());
  auto g = SafetensorsFile::open(p2);
  EXPECT_EQ(g->get("z").numel(), 0);
}

TEST(Safetensors, ValidHandBuiltFiles) {
  TempDir tmp;
  // Minimal header, a padded one, metadata only, a gap between tensors (allowed), trailing spaces.
  write_raw(tmp.file("min.safetensors"), st_bytes("{}", 0));
  EXPECT_TRUE(SafetensorsFile::open(tmp.file("min.safetensors"))->tensors().empty());
  write_raw(tmp.file("meta_only.safetensors"), st_bytes("{\"__metadata__\": {\"a\": \"b\"}}   ", 0));
  EXPECT_EQ(SafetensorsFile::open(tmp.file("meta_only.safetensors"))->metadata().at("a"), "b");
  const std::string gap =
      R"({"x": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}, "y": {"dtype": "U8", "shape": [2], "data_offsets": [8, 10]}})";
  write_raw(tmp.file("gap.safetensors"), st_bytes(gap, 16));
  auto f = SafetensorsFile::open(tmp.file("gap.safetensors"));
  EXPECT_EQ(static_cast<const uint8_t*>(f->get("y").data())[0], static_cast<uint8_t>(8 * 7 + 1));
}

TEST(Safetensors, MisalignedTensorIsCopiedAligned) {
  TempDir tmp;
  // Header of odd length: the data section starts at an odd address, so the F32 tensor cannot
  // be viewed in place; the U8 one can.
  std::string h = R"({"f": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}, "u": {"dtype": "U8", "shape": [4], "data_offsets": [12, 16]}})";
  if (h.size() % 2 == 0) h += " ";
  const std::string bytes = st_bytes(h, 16);
  write_raw(tmp.file("odd.safetensors"), bytes);
  auto f = SafetensorsFile::open(tmp.file("odd.safetensors"));
  Tensor t = f->get("f");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 4, 0u);
  EXPECT_EQ(0, std::memcmp(t.data(), bytes.data() + 8 + h.size(), 12));
  Tensor u = f->get("u");
  EXPECT_TRUE(inside_mapping(*f, u.data(), 4));
  EXPECT_EQ(0, std::memcmp(u.data(), bytes.data() + 8 + h.size() + 12, 4));

  // Our writer keeps the given order without padding: an F32 after 3 bytes is misaligned, and
  // still reads back exactly.
  const std::vector<TensorSpec> specs = {{"u3", DType::U8, {3}}, {"f", DType::F32, {5}}};
  RandomData data(fresh_seed());
  for (const auto& s : specs) data.add(s);
  write_safetensors(tmp.file("order.safetensors"), specs, data.fill());
  auto g = SafetensorsFile::open(tmp.file("order.safetensors"));
  EXPECT_EQ(g->find("f")->begin, 3u);
  Tensor gf = g->get("f");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(gf.data()) % 4, 0u);
  EXPECT_EQ(0, std::memcmp(gf.data(), data.bytes["f"].data(), 20));
}

TEST(Safetensors, MissingTensorNamesFileAndTensor) {
  TempDir tmp;
  const std::string path = tmp.file("one.safetensors");
  write_safetensors(path, {{"a", DType::U8, {1}}}, [](const TensorSpec&, void* d) { *static_cast<uint8_t*>(d) = 3; });
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->find("nope"), nullptr);
  expect_error([&] { f->get("nope"); }, {path, "tensor 'nope'", "not found"});
  auto set = SafetensorsSet::open(path);
  expect_error([&] { set.get("nope"); }, {path, "tensor 'nope'", "not found"});
  expect_error([&] { set.info("nope"); }, {path, "tensor 'nope'", "not found"});
  expect_error([&] { SafetensorsFile::open(tmp.file("absent.safetensors")); }, {"absent.safetensors", "cannot open"});
  expect_error([&] { SafetensorsFile::open(tmp.str()); }, {tmp.str(), "directory"});
}

// ---------------------------------------------------------------------------------------------
// Malformed files: every defect is one wan::Error naming the file (and the tensor).

namespace {
struct BadCase {
  std::string name;   // file name
  std::string bytes;  // file content
  std::vector<std::string> needles;
};

std::string entry(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return "{\"dtype\": " + dtype + ", \"shape\": " + shape + ", \"data_offsets\": " + offsets + "}";
}
std::string one(const std::string& name, const std::string& e) { return "{\"" + name + "\": " + e + "}"; }
}  // namespace

TEST(Safetensors, MalformedFilesAreRejectedClearly) {
  TempDir tmp;
  const std::string W = "blocks.0.ffn.0.weight";
  const std::string ok = entry("\"F32\"", "[4]", "[0, 16]");
  std::vector<BadCase> cases = {
      {"empty.safetensors", "", {"too short (0 bytes)"}},
      {"trunc_len.safetensors", std::string("\x10\x00\x00\x00\x00", 5), {"too short (5 bytes)"}},
      {"len_small.safetensors", le64(1) + "{", {"header length 1 is too small"}},
      {"len_zero.safetensors", le64(0), {"header length 0 is too small"}},
      {"len_huge.safetensors", le64(200000000) + "{}", {"header length 200000000 exceeds the limit"}},
      {"len_max.safetensors", le64(~0ull) + "{}", {"exceeds the limit"}},
      {"len_beyond.safetensors", le64(1000) + "{}" + std::string(10, ' '), {"header length 1000 extends past the end of the file (20 bytes)"}},
      {"not_json.safetensors", st_bytes("{not json}", 0), {"header is not valid JSON"}},
      {"trunc_json.safetensors", st_bytes("{\"w\": {\"dtype\": \"F32\"", 0), {"header is not valid JSON"}},
      {"nul_pad.safetensors", st_bytes(std::string("{}\0\0\0\0\0\0", 8), 0), {"header is not valid JSON"}},
      {"bad_utf8.safetensors", st_bytes("{\"\xff\": 1}", 0), {"header is not valid JSON"}},
      {"array.safetensors", st_bytes("[1, 2]", 0), {"header is a JSON array, expected an object"}},
      {"string.safetensors", st_bytes("\"hello\"", 0), {"header is a JSON string"}},
      {"deep.safetensors", st_bytes(std::string(300000, '[') + std::string(300000, ']'), 0), {"header is a JSON array"}},
      {"deep_entry.safetensors", st_bytes("{\"" + W + "\": " + std::string(300000, '[') + std::string(300000, ']') + "}", 0),
       {"tensor '" + W + "'", "entry is array [[[[[...]]]]]"}},
      {"deep_meta.safetensors", st_bytes("{\"__metadata__\": {\"k\": " + std::string(300000, '[') + std::string(300000, ']') + "}}", 0),
       {"__metadata__ value of 'k' is array"}},
      {"entry_number.safetensors", st_bytes(one(W, "5"), 16), {"tensor '" + W + "'", "entry is number 5, expected an object"}},
      {"no_dtype.safetensors", st_bytes(one(W, "{\"shape\": [4], \"data_offsets\": [0, 16]}"), 16),
       {"tensor '" + W + "'", "missing field 'dtype'"}},
      {"no_shape.safetensors", st_bytes(one(W, "{\"dtype\": \"F32\", \"data_offsets\": [0, 16]}"), 16),
       {"tensor '" + W + "'", "missing field 'shape'"}},
      {"no_offsets.safetensors", st_bytes(one(W, "{\"dtype\": \"F32\", \"shape\": [4]}"), 16),
       {"tensor '" + W + "'", "missing field 'data_offsets'"}},
      {"extra_field.safetensors",
       st_bytes(one(W, "{\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16], \"foo\": 1}"), 16),
       {"tensor '" + W + "'", "unexpected field 'foo'"}},
      {"dtype_number.safetensors", st_bytes(one(W, entry("5", "[4]", "[0, 16]")), 16), {"tensor '" + W + "'", "dtype is number"}},
      {"dtype_unknown.safetensors", st_bytes(one(W, entry("\"F128\"", "[4]", "[0, 16]")), 16),
       {"tensor '" + W + "'", "unknown dtype \"F128\""}},
      {"dtype_lower.safetensors", st_bytes(one(W, entry("\"f32\"", "[4]", "[0, 16]")), 16), {"tensor '" + W + "'", "unknown dtype \"f32\""}},
      {"dtype_u32.safetensors", st_bytes(one(W, entry("\"U32\"", "[4]", "[0, 16]")), 16), {"tensor '" + W + "'", "unknown dtype \"U32\""}},
      {"shape_number.safetensors", st_bytes(one(W, entry("\"F32\"", "4", "[0, 16]")), 16), {"tensor '" + W + "'", "shape is number"}},
      {"shape_negative.safetensors", st_bytes(one(W, entry("\"F32\"", "[-1, 4]", "[0, 16]")), 16),
       {"tensor '" + W + "'", "shape [-1,4] has -1, expected a non-negative integer"}},
      {"shape_float.safetensors", st_bytes(one(W, entry("\"F32\"", "[1.5]", "[0, 16]")), 16),
       {"tensor '" + W + "'", "has 1.5, expected a non-negative integer"}},
      {"shape_string.safetensors", st_bytes(one(W, entry("\"F32\"", "[\"4\"]", "[0, 16]")), 16),
       {"tensor '" + W + "'", "expected a non-negative integer"}},
      {"shape_bignum.safetensors", st_bytes(one(W, entry("\"F32\"", "[99999999999999999999999]", "[0, 16]")), 16),
       {"tensor '" + W + "'", "expected a non-negative integer"}},
      {"shape_9dims.safetensors", st_bytes(one(W, entry("\"F32\"", "[1,1,1,1,1,1,1,1,4]", "[0, 16]")), 16),
       {"tensor '" + W + "'", "9 dims"}},
      {"shape_overflow.safetensors", st_bytes(one(W, entry("\"F32\"", "[4294967296, 4294967296, 4]", "[0, 16]")), 16),
       {"tensor '" + W + "'", "too many elements"}},
      {"shape_i64max.safetensors", st_bytes(one(W, entry("\"U8\"", "[18446744073709551615]", "[0, 16]")), 16),
       {"tensor '" + W + "'", "too many elements"}},
      {"bytes_overflow.safetensors", st_bytes(one(W, entry("\"F64\"", "[2305843009213693952]", "[0, 16]")), 16),
       {"tensor '" + W + "'", "overflows 64 bits"}},
      {"offsets_string.safetensors", st_bytes(one(W, entry("\"F32\"", "[4]", "\"0,16\"")), 16),
       {"tensor '" + W + "'", "expected [begin, end]"}},
      {"offsets_three.safetensors", st_bytes(one(W, entry("\"F32\"", "[4]", "[0, 16, 32]")), 32),
       {"tensor '" + W + "'", "expected [begin, end]"}},
      {"offsets_negative.safetensors", st_bytes(one(W, entry("\"F32\"", "[4]", "[-16, 0]")), 16),
       {"tensor '" + W + "'", "must be non-negative integers"}},
      {"offsets_float.safetensors", st_bytes(one(W, entry("\"F32\"", "[4]", "[0, 16.0]")), 16),
       {"tensor '" + W + "'", "must be non-negative integers"}},
      {"begin_after_end.safetensors", st_bytes(one(W, entry("\"F32\"", "[1]", "[8, 4]")), 16),
       {"tensor '" + W + "'", "data_offsets [8, 4]: begin is after end"}},
      {"x.safetensors", st_bytes(one(W, entry("\"F32\"", "[16]", "[0, 64]")), 48),
       {"x.safetensors: tensor 'blocks.0.ffn.0.weight': data_offsets [0, 64] exceed the data section (48 bytes)"}},
      {"beyond_u64.safetensors", st_bytes(one(W, entry("\"U8\"", "[1]", "[18446744073709551614, 18446744073709551615]")), 16),
       {"tensor '" + W + "'", "exceed the data section (16 bytes)"}},
      {"size_mismatch.safetensors", st_bytes(one(W, entry("\"F32\"", "[2, 3]", "[0, 20]")), 24),
       {"tensor '" + W + "'", "shape [2, 3] x F32 is 24 bytes but data_offsets [0, 20] span 20 bytes"}},
      {"overlap.safetensors",
       st_bytes("{\"a\": " + entry("\"F32\"", "[4]", "[0, 16]") + ", \"b\": " + entry("\"F32\"", "[4]", "[8, 24]") + "}", 24),
       {"tensor 'b'", "data_offsets [8, 24] overlap tensor 'a' [0, 16]"}},
      {"overlap_same.safetensors",
       st_bytes("{\"a\": " + entry("\"U8\"", "[16]", "[0, 16]") + ", \"b\": " + entry("\"F32\"", "[4]", "[0, 16]") + "}", 16),
       {"tensor 'b'", "overlap tensor 'a'"}},
      {"overlap_inner.safetensors",
       st_bytes("{\"a\": " + entry("\"U8\"", "[32]", "[0, 32]") + ", \"z\": " + entry("\"U8\"", "[4]", "[4, 8]") +
                    ", \"c\": " + entry("\"U8\"", "[8]", "[20, 28]") + "}",
                32),
       {"overlap tensor 'a'"}},
      {"meta_array.safetensors", st_bytes("{\"__metadata__\": [1], \"w\": " + ok + "}", 16), {"__metadata__ is array"}},
      {"meta_number.safetensors", st_bytes("{\"__metadata__\": {\"format\": \"pt\", \"k\": 1}, \"w\": " + ok + "}", 16),
       {"__metadata__ value of 'k' is number 1, expected a string"}},
      {"meta_nested.safetensors", st_bytes("{\"__metadata__\": {\"k\": {\"a\": \"b\"}}}", 0), {"__metadata__ value of 'k' is object"}},
      {"dup_tensor.safetensors", st_bytes("{\"" + W + "\": " + ok + ", \"" + W + "\": " + ok + "}", 16),
       {"header has the key '" + W + "' twice"}},
      {"dup_field.safetensors",
       st_bytes(one(W, "{\"dtype\": \"F32\", \"dtype\": \"F16\", \"shape\": [4], \"data_offsets\": [0, 16]}"), 16),
       {"header has the key 'dtype' twice in '" + W + "'"}},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = tmp.file(c.name);
    write_raw(path, c.bytes);
    std::vector<std::string> needles = c.needles;
    needles.push_back(path + ": ");
    try {
      SafetensorsFile::open(path);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      std::string m = e.what();
      for (const std::string& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "missing '" << n << "' in: " << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << "one line: " << m;
      EXPECT_LT(m.size(), 400u) << m;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "wrong exception type: " << e.what();
    }
    // The set front end reports the same defect.
    expect_error([&] { SafetensorsSet::open(path); }, {path});
  }
}

// ---------------------------------------------------------------------------------------------
// Sharded sets

namespace {
std::vector<TensorSpec> shard_specs(RandomData& data) {
  std::vector<TensorSpec> specs = {
      {"a.weight", DType::BF16, {16, 8}},   // 256 B
      {"a.bias", DType::F32, {8}},          // 32
      {"b.weight", DType::F8E4M3, {20, 10}}, // 200
      {"huge", DType::F32, {32, 4}},        // 512 > limit: alone
      {"c.weight", DType::I64, {10}},       // 80
      {"c.empty", DType::F16, {0, 5}},      // 0
      {"d.weight", DType::F16, {50}},       // 100
      {"d.flag", DType::Bool, {9}},         // 9
  };
  for (const auto& s : specs) data.add(s);
  return specs;
}
}  // namespace

TEST(Safetensors, ShardedWriteAndRead) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  TempDir tmp;
  RandomData data(seed);
  const auto specs = shard_specs(data);
  const size_t limit = 300;
  auto paths = write_safetensors_sharded(tmp.str(), "model", specs, data.fill(), limit);
  ASSERT_GE(paths.size(), 4u);
  const std::string index = tmp.file("model.safetensors.index.json");
  EXPECT_EQ(paths.back(), index);
  const size_t nshards = paths.size() - 1;
  for (size_t i = 0; i < nshards; ++i) {
    char want[64];
    std::snprintf(want, sizeof want, "model-%05zu-of-%05zu.safetensors", i + 1, nshards);
    EXPECT_EQ(fs::path(paths[i]).filename().string(), want);
    auto f = SafetensorsFile::open(paths[i]);
    size_t bytes = 0;
    for (const auto& t : f->tensors()) bytes += t.nbytes();
    EXPECT_TRUE(bytes <= limit || f->tensors().size() == 1) << paths[i];
    EXPECT_EQ(f->metadata().at("format"), "pt");
  }
  for (const auto& p : fs::directory_iterator(tmp.str())) EXPECT_NE(p.path().extension(), ".tmp");

  json j = json::parse(read_all(index));
  size_t total = 0;
  for (const auto& s : specs) total += s.nbytes();
  EXPECT_EQ(j["metadata"]["total_size"].get<size_t>(), total);
  EXPECT_EQ(j["weight_map"].size(), specs.size());
  EXPECT_EQ(SafetensorsFile::open(tmp.file(j["weight_map"]["huge"].get<std::string>()))->tensors().size(), 1u);

  for (const std::string& src : {index, tmp.str()}) {
    SCOPED_TRACE(src);
    auto set = SafetensorsSet::open(src);
    EXPECT_EQ(set.files().size(), nshards);
    EXPECT_EQ(set.source(), src);
    std::vector<std::string> want;
    for (const auto& s : specs) want.push_back(s.name);
    std::sort(want.begin(), want.end());
    EXPECT_EQ(set.names(), want);
    for (const auto& s : specs) {
      EXPECT_TRUE(set.contains(s.name));
      EXPECT_EQ(set.info(s.name).shape, s.shape);
      Tensor t = set.get(s.name);
      EXPECT_EQ(t.dtype(), s.dtype);
      ASSERT_EQ(t.nbytes(), s.nbytes());
      if (t.nbytes()) {
        EXPECT_EQ(0, std::memcmp(t.data(), data.bytes[s.name].data(), t.nbytes())) << s.name;
      }
    }
    EXPECT_FALSE(set.contains("nope"));
  }
}

TEST(Safetensors, ShardedSingleShardWritesNoIndex) {
  TempDir tmp;
  RandomData data(fresh_seed());
  const auto specs = shard_specs(data);
  auto paths = write_safetensors_sharded(tmp.str(), "small", specs, data.fill(), size_t{1} << 20);
  ASSERT_EQ(paths.size(), 1u);
  EXPECT_EQ(paths[0], tmp.file("small.safetensors"));
  EXPECT_FALSE(fs::exists(tmp.file("small.safetensors.index.json")));
  auto set = SafetensorsSet::open(tmp.str());  // folder with one file
  EXPECT_EQ(set.names().size(), specs.size());
  EXPECT_EQ(0, std::memcmp(set.get("b.weight").data(), data.bytes["b.weight"].data(), 200));
}

TEST(Safetensors, IndexErrors) {
  TempDir tmp;
  RandomData data(fresh_seed());
  auto shard = [&](const std::string& name, std::vector<std::string> tensors) {
    std::vector<TensorSpec> specs;
    for (const auto& t : tensors) {
      specs.push_back({t, DType::F32, {2, 2}});
      data.add(specs.back());
    }
    write_safetensors(tmp.file(name), specs, data.fill());
  };
  shard("s1.safetensors", {"a", "b"});
  shard("s2.safetensors", {"b", "c"});  // b is in both
  shard("s3.safetensors", {"d", "x"});  // x is listed nowhere
  auto index = [&](const std::string& name, const std::string& text) {
    write_raw(tmp.file(name), text);
    return tmp.file(name);
  };
  std::string p;

  p = index("missing.safetensors.index.json", R"({"weight_map": {"a": "s1.safetensors", "q": "nope.safetensors"}})");
  expect_error([&] { SafetensorsSet::open(p); }, {p, "shard 'nope.safetensors'", "cannot open"});

  p = index("notin.safetensors.index.json", R"({"weight_map": {"a": "s1.safetensors", "c": "s1.safetensors"}})");
  expect_error([&] { SafetensorsSet::open(p); },
               {p, "tensor 'c' is mapped to shard 's1.safetensors' but that shard does not contain it"});

  p = index("two.safetensors.index.json",
            R"({"metadata": {"total_size": 48}, "weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s2.safetensors"}})");
  expect_error([&] { SafetensorsSet::open(p); }, {p, "tensor 'b' is in two shards", "s1.safetensors", "s2.safetensors"});

  p = index("unlisted.safetensors.index.json", R"({"weight_map": {"d": "s3.safetensors"}})");
  expect_error([&] { SafetensorsSet::open(p); }, {p, "tensor 'x' is in shard 's3.safetensors' but weight_map does not list it"});

  p = index("notjson.safetensors.index.json", "{\"weight_map\": ");
  expect_error([&] { SafetensorsSet::open(p); }, {p, "index is not valid JSON"});
  p = index("nomap.safetensors.index.json", R"({"metadata": {}})");
  expect_error([&] { SafetensorsSet::open(p); }, {p, "no \"weight_map\""});
  p = index("mapnum.safetensors.index.json", R"({"weight_map": {"a": 3}})");
  expect_error([&] { SafetensorsSet::open(p); }, {p, "tensor 'a'", "weight_map value is number"});
  p = index("dup.safetensors.index.json", R"({"weight_map": {"a": "s1.safetensors", "a": "s2.safetensors"}})");
  expect_error([&] { SafetensorsSet::open(p); }, {p, "key 'a' twice in 'weight_map'"});
  p = index("abs.safetensors.index.json", R"({"weight_map": {"a": "/etc/passwd"}})");
  expect_error([&] { SafetensorsSet::open(p); }, {p, "tensor 'a'", "relative path"});
  p = index("dotdot.safetensors.index.json", R"({"weight_map": {"a": "../s1.safetensors"}})");
  expect_error([&] { SafetensorsSet::open(p); }, {p, "relative path"});
  p = index("arr.safetensors.index.json", "[]");
  expect_error([&] { SafetensorsSet::open(p); }, {p, "index is a JSON array"});

  // A corrupt shard: the error names the index, the shard and the shard's own defect.
  write_raw(tmp.file("bad.safetensors"), st_bytes(one("w", entry("\"F32\"", "[4]", "[0, 64]")), 16));
  p = index("corrupt.safetensors.index.json", R"({"weight_map": {"w": "bad.safetensors"}})");
  expect_error([&] { SafetensorsSet::open(p); }, {p, "shard 'bad.safetensors'", "tensor 'w'", "exceed the data section"});

  // Folders: several index files, several files without an index, nothing at all.
  expect_error([&] { SafetensorsSet::open(tmp.str()); }, {tmp.str(), "several index files"});
  TempDir d2;
  write_safetensors(d2.file("one.safetensors"), {{"a", DType::F32, {2, 2}}}, data.fill());
  write_raw(d2.file("two.safetensors"), st_bytes("{}", 0));
  expect_error([&] { SafetensorsSet::open(d2.str()); }, {d2.str(), "2 .safetensors files", "no .safetensors.index.json"});
  TempDir d3;
  write_raw(d3.file("readme.txt"), "hi");
  expect_error([&] { SafetensorsSet::open(d3.str()); }, {d3.str(), "no .safetensors"});
}

// ---------------------------------------------------------------------------------------------
// Writer failure paths

TEST(Safetensors, WriterRejectsBadSpecsBeforeWriting) {
  TempDir tmp;
  auto fill = [](const TensorSpec&, void* d) { std::memset(d, 1, 4); };
  const std::string p = tmp.file("dup.safetensors");
  expect_error([&] { write_safetensors(p, {{"w", DType::F32, {1}}, {"w", DType::F32, {1}}}, fill); }, {p, "tensor 'w' is listed twice"});
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  expect_error([&] { write_safetensors(p, {{"__metadata__", DType::F32, {1}}}, fill); }, {p, "reserved"});
  expect_error([&] { write_safetensors(p, {{"neg", DType::F32, {-1}}}, fill); }, {p, "tensor 'neg'", "negative"});
  expect_error([&] { write_safetensors_sharded(tmp.str(), "m", {{"w", DType::F32, {1}}, {"w", DType::F32, {1}}}, fill, 100); },
               {"tensor 'w' is listed twice"});
  const std::string nodir = tmp.file("no/such/dir/x.safetensors");
  expect_error([&] { write_safetensors(nodir, {{"w", DType::F32, {1}}}, fill); }, {nodir, "does not exist"});
  EXPECT_TRUE(fs::is_empty(tmp.str()));
}

TEST(Safetensors, FailingFillRemovesTmpAndKeepsOldFile) {
  TempDir tmp;
  const std::string p = tmp.file("keep.safetensors");
  write_safetensors(p, {{"old", DType::U8, {3}}}, [](const TensorSpec&, void* d) { std::memset(d, 9, 3); });
  const std::string before = read_all(p);
  struct Boom : std::runtime_error {
    Boom() : std::runtime_error("boom") {}
  };
  int calls = 0;
  EXPECT_THROW(write_safetensors(p, {{"a", DType::F32, {8}}, {"b", DType::F32, {8}}},
                                 [&](const TensorSpec& s, void* d) {
                                   if (++calls == 2) throw Boom();
                                   std::memset(d, 1, s.nbytes());
                                 }),
               Boom);
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  EXPECT_EQ(read_all(p), before);
  EXPECT_EQ(SafetensorsFile::open(p)->tensors().at(0).name, "old");

  // Sharded: a failure in a later shard removes the shards already written and writes no index.
  TempDir d;
  calls = 0;
  std::vector<TensorSpec> specs = {{"a", DType::F32, {64}}, {"b", DType::F32, {64}}, {"c", DType::F32, {64}}};
  EXPECT_THROW(write_safetensors_sharded(d.str(), "m", specs,
                                         [&](const TensorSpec& s, void* dst) {
                                           if (++calls == 3) throw Error("fill failed for " + s.name);
                                           std::memset(dst, 2, s.nbytes());
                                         },
                                         300),
               Error);
  EXPECT_TRUE(fs::is_empty(d.str()));
}

TEST(Safetensors, WriteFailureIsReported) {
  // A file-size limit makes write(2) fail part-way (EFBIG): the same path a full disk (ENOSPC)
  // takes. The error names the file, the tmp file is removed.
  TempDir tmp;
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 1 << 20;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  const std::string p = tmp.file("big.safetensors");
  std::string msg;
  try {
    write_safetensors(p, {{"w", DType::F32, {1 << 20}}}, [](const TensorSpec& s, void* d) { std::memset(d, 5, s.nbytes()); });
  } catch (const Error& e) {
    msg = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_NE(msg.find(p + ": write failed"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::strerror(EFBIG)), std::string::npos) << msg;
  EXPECT_TRUE(fs::is_empty(tmp.str())) << "the temporary file was left behind";
}

TEST(Safetensors, LargeTensorStreamsAndMaps) {
  TempDir tmp;
  const std::string p = tmp.file("large.safetensors");
  const uint64_t seed = fresh_seed();
  const int64_t n = 24 << 20;  // 48 MiB of bf16
  auto pattern = [seed](size_t i) { return static_cast<uint8_t>((i * 2654435761u) ^ (seed >> (i % 56))); };
  write_safetensors(p, {{"big", DType::BF16, {n / 1024, 1024}}, {"tail", DType::U8, {3}}},
                    [&](const TensorSpec& s, void* d) {
                      auto* b = static_cast<uint8_t*>(d);
                      for (size_t i = 0; i < s.nbytes(); ++i) b[i] = pattern(i);
                    });
  auto f = SafetensorsFile::open(p);
  Tensor t = f->get("big");
  ASSERT_EQ(t.nbytes(), static_cast<size_t>(2 * n));
  EXPECT_TRUE(inside_mapping(*f, t.data(), t.nbytes()));
  const auto* b = static_cast<const uint8_t*>(t.data());
  size_t bad = 0;
  for (size_t i = 0; i < t.nbytes(); i += 4093) bad += b[i] != pattern(i);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(b[t.nbytes() - 1], pattern(t.nbytes() - 1));
}

// ---------------------------------------------------------------------------------------------
// Cross-check with the Python reference implementation

namespace {
int run_python(const std::string& args) {
  const std::string cmd = std::string("'") + WAN_PYTHON + "' '" + WAN_SOURCE_DIR + "/tools/st_crosscheck.py' " + args;
  int rc = std::system(cmd.c_str());
  return (rc != -1 && WIFEXITED(rc)) ? WEXITSTATUS(rc) : -1;
}
}  // namespace

TEST(Safetensors, CrossCheckPythonWritesWeRead) {
  ASSERT_TRUE(fs::exists(WAN_PYTHON)) << "python oracle missing: " << WAN_PYTHON;
  TempDir tmp;
  const uint64_t seed = fresh_seed() % 1000000007;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::string st = tmp.file("py.safetensors"), ex = tmp.file("py.json");
  ASSERT_EQ(run_python("write '" + st + "' '" + ex + "' " + std::to_string(seed)), 0);
  json want = json::parse(read_all(ex));
  auto f = SafetensorsFile::open(st);
  std::map<std::string, std::string> meta;
  for (auto& [k, v] : want["metadata"].items()) meta[k] = v.get<std::string>();
  EXPECT_EQ(f->metadata(), meta);
  ASSERT_EQ(f->tensors().size(), want["tensors"].size());
  std::set<std::string> dtypes;
  for (auto& [name, w] : want["tensors"].items()) {
    SCOPED_TRACE(name);
    const TensorInfo* ti = f->find(name);
    ASSERT_NE(ti, nullptr);
    EXPECT_EQ(std::string(dtype_to_safetensors(ti->dtype)), w["dtype"].get<std::string>());
    EXPECT_EQ(ti->shape.vec(), w["shape"].get<std::vector<int64_t>>());
    Tensor t = f->get(name);
    EXPECT_EQ(to_hex(t.data(), t.nbytes()), w["hex"].get<std::string>());
    EXPECT_TRUE(inside_mapping(*f, t.data(), t.nbytes()));
    dtypes.insert(w["dtype"].get<std::string>());
  }
  EXPECT_EQ(dtypes.size(), 12u);  // every dtype, bf16 and both float8 included
}

TEST(Safetensors, CrossCheckWeWritePythonReads) {
  ASSERT_TRUE(fs::exists(WAN_PYTHON)) << "python oracle missing: " << WAN_PYTHON;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  TempDir tmp;
  RandomData data(seed);
  std::vector<TensorSpec> specs;
  for (DType t : kAllDtypes) {
    specs.push_back({cat("layer.", dtype_name(t)), t, random_shape(data.rng)});
    data.add(specs.back());
  }
  specs.push_back({"empty", DType::BF16, {0, 4}});
  data.add(specs.back());
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"writer", "wan"}};
  const std::string st = tmp.file("ours.safetensors");
  write_safetensors(st, specs, data.fill(), meta);

  json want;
  want["metadata"] = meta;
  for (const auto& s : specs) {
    const auto& b = data.bytes[s.name];
    want["tensors"][s.name] = {{"dtype", dtype_to_safetensors(s.dtype)}, {"shape", s.shape.vec()}, {"hex", to_hex(b.data(), b.size())}};
  }
  const std::string ex = tmp.file("ours.json");
  write_raw(ex, want.dump());
  EXPECT_EQ(run_python("check '" + st + "' '" + ex + "'"), 0);

  // The checker must notice a single flipped byte (otherwise the check above proves nothing).
  std::string& hex = want["tensors"]["layer.f32"]["hex"].get_ref<std::string&>();
  if (hex.empty()) {
    hex = "00";
  } else {
    hex[0] = hex[0] == '0' ? '1' : '0';
  }
  write_raw(ex, want.dump());
  EXPECT_EQ(run_python("check '" + st + "' '" + ex + "' 2>/dev/null"), 1);
}
