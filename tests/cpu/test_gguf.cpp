// GGUF: the strict reader (formats/gguf.h), the CPU dequantisers (formats/gguf_quant.h), the test
// writer (testing/gguf_writer.h) and the DiT store (ckpt/gguf_store.h), against the PyPI gguf package:
// - tests/fixtures/gguf/dequant.gguf (tools/make_gguf_fixtures.py): random blocks of every supported
//   type and gguf-py's dequantisation of them, which ours must equal bit for bit; gguf-py's quantisation
//   of random floats, which our writer's must equal byte for byte;
// - meta.gguf: a GGUFWriter file (alignment 64, a KV of every type, tensors of several types and ranks);
// - our writer's files read back by gguf-py through WAN_PYTHON (the same script's `verify` mode);
// - bad inputs: each is one BadInput wan::Error naming the file, and no mutation of a valid file crashes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "ckpt/gguf_store.h"
#include "core/hash.h"
#include "formats/gguf.h"
#include "formats/gguf_quant.h"
#include "models/config.h"
#include "models/dit/weights.h"
#include "testing/gguf_writer.h"
#include "test_util.h"

namespace wan {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

const std::string kFix = std::string(WAN_FIXTURES) + "/gguf";
const GgmlType kDequantTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                                  GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,
                                  GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
void spit(const std::string& p, const std::string& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(b.data(), static_cast<std::streamsize>(b.size()));
}
uint64_t fnv_bytes(const void* p, size_t n) {
  return fnv1a64(std::string_view(static_cast<const char*>(p), n));
}
std::vector<float> dequant(const GgufFile& f, const GgufTensorInfo& t) {
  std::vector<float> out(t.numel);
  gguf_dequantize(t.type, f.tensor_data(t), static_cast<int64_t>(t.numel), out.data());
  return out;
}

TEST(GgufDequant, BitExactWithGgufPy) {
  auto f = GgufFile::open(kFix + "/dequant.gguf");
  for (GgmlType t : kDequantTypes) {
    SCOPED_TRACE(ggml_type_name(t));
    const GgufTensorInfo* q = f->find(cat("q.", ggml_type_name(t)));
    const GgufTensorInfo* ref = f->find(cat("ref.", ggml_type_name(t)));
    ASSERT_TRUE(q && ref);
    EXPECT_EQ(q->type, t);
    ASSERT_EQ(ref->type, GgmlType::F32);
    ASSERT_EQ(q->numel, ref->numel);
    const std::vector<float> ours = dequant(*f, *q);
    const uint8_t* want = f->tensor_data(*ref);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < ours.size(); ++i)
      if (std::memcmp(&ours[i], want + 4 * i, 4) != 0 && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0u) << "first difference at element " << first;
    Tensor d = f->dequantize(q->name);
    EXPECT_EQ(std::memcmp(d.data(), ours.data(), ours.size() * 4), 0);
  }
}

TEST(GgufDequant, WriterQuantisationMatchesGgufPy) {
  auto f = GgufFile::open(kFix + "/dequant.gguf");
  Tensor src = f->get("src");
  for (GgmlType t : {GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0}) {
    SCOPED_TRACE(ggml_type_name(t));
    const GgufTensorInfo* q = f->find(cat("quant.", ggml_type_name(t)));
    ASSERT_TRUE(q);
    EXPECT_EQ(q->type, t);
    const std::string ours = gen::gguf_quantize(t, src.f32(), src.numel());
    ASSERT_EQ(ours.size(), q->nbytes);
    EXPECT_EQ(std::memcmp(ours.data(), f->tensor_data(*q), ours.size()), 0);
  }
}

TEST(GgufDequant, RejectsUnsupportedAndPartialBlocks) {
  std::vector<float> out(256);
  std::string b(512, '\0');
  EXPECT_NE(test::error_of([&] { gguf_dequantize(GgmlType::IQ2_XXS, b.data(), 256, out.data()); }).find("IQ2_XXS"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { gguf_dequantize(GgmlType::Q4_K, b.data(), 128, out.data()); }).find("blocks"),
            std::string::npos);
  EXPECT_FALSE(ggml_type_info(4).has_value());
  EXPECT_EQ(ggml_type_info(12)->type_size, 144u);
}

// ---- meta.gguf: written by gguf.GGUFWriter ----

TEST(GgufReader, ReadsGgufPyFile) {
  auto f = GgufFile::open(kFix + "/meta.gguf");
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_start() % 64, 0u);
  EXPECT_EQ(f->architecture(), "wan");
  auto kv = [&](const char* k) {
    const GgufValue* v = f->find_kv(k);
    EXPECT_TRUE(v) << k;
    return v ? *v : GgufValue{};
  };
  EXPECT_EQ(kv("test.u8").type, GgufValueType::U8);
  EXPECT_EQ(kv("test.u8").as_i64(), 200);
  EXPECT_EQ(kv("test.i8").as_i64(), -100);
  EXPECT_EQ(kv("test.u16").as_i64(), 60000);
  EXPECT_EQ(kv("test.i16").as_i64(), -30000);
  EXPECT_EQ(kv("test.u32").as_u64(), 4000000000u);
  EXPECT_EQ(kv("test.i32").as_i64(), -2000000000);
  EXPECT_EQ(kv("test.f32").as_f64(), 1.5);
  EXPECT_EQ(kv("test.bool").type, GgufValueType::Bool);
  EXPECT_EQ(kv("test.bool").bits, 1u);
  EXPECT_EQ(kv("test.string").str, "h\xC3\xA9llo wan");
  EXPECT_EQ(kv("test.u64").as_u64(), 18000000000000000000ull);
  EXPECT_EQ(kv("test.i64").as_i64(), -9000000000000000000ll);
  EXPECT_EQ(kv("test.f64").as_f64(), -2.25);
  const GgufValue ai = kv("test.arr_i32");
  ASSERT_EQ(ai.count, 3u);
  EXPECT_EQ(ai.elem_type, GgufValueType::I32);
  EXPECT_EQ(ai.array_i64(1), -2);
  EXPECT_EQ(kv("test.arr_f32").array_f64(1), -1.0);
  EXPECT_EQ(kv("test.arr_str").strings, (std::vector<std::string>{"a", "", "bc"}));
  EXPECT_EQ(kv("test.arr_bool").array_i64(0), 1);
  EXPECT_EQ(kv("test.arr_u64").raw.size(), 16u);

  const auto manifest = nlohmann::json::parse(slurp(kFix + "/meta.json"))["tensors"];
  ASSERT_EQ(f->tensors().size(), manifest.size());
  for (size_t i = 0; i < manifest.size(); ++i) {
    const GgufTensorInfo& t = f->tensors()[i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.name, manifest[i]["name"].get<std::string>());
    EXPECT_STREQ(ggml_type_name(t.type), manifest[i]["type"].get<std::string>().c_str());
    EXPECT_EQ(t.offset % 64, 0u);
    const std::vector<float> d = dequant(*f, t);
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv_bytes(d.data(), d.size() * 4)));
    EXPECT_EQ(std::string(hex), manifest[i]["fnv"].get<std::string>());
    EXPECT_EQ(t.torch_shape(), Shape(manifest[i]["shape"].get<std::vector<int64_t>>()));
  }
  EXPECT_EQ(f->find("patch_embedding.weight")->n_dims, 5u);
  EXPECT_EQ(f->get("blocks.0.norm3.weight").dtype(), DType::F32);
  EXPECT_NE(test::error_of([&] { f->get("blocks.0.self_attn.q.weight"); }).find("quantised"), std::string::npos);
  EXPECT_TRUE(is_gguf_file(kFix + "/meta.gguf"));
  EXPECT_FALSE(is_gguf_file(kFix + "/meta.json"));
  EXPECT_FALSE(is_gguf_file(kFix + "/missing.gguf"));
  EXPECT_FALSE(is_gguf_file(kFix));
}

TEST(GgufStore, ServesOfficialNamesAndTorchShapes) {
  const std::string path = kFix + "/meta.gguf";
  auto s = open_gguf_dit(path);
  EXPECT_TRUE(s->unexpected().empty());
  EXPECT_EQ(s->names().size(), 9u);
  EXPECT_EQ(s->shape("blocks.0.ffn.0.weight"), (Shape{64, 32}));  // comfy.gguf.orig_shape
  EXPECT_EQ(s->shape("patch_embedding.weight"), (Shape{48, 4, 1, 2, 2}));
  EXPECT_EQ(s->shape("blocks.0.self_attn.q.weight"), (Shape{64, 256}));
  EXPECT_EQ(s->dtype("text_embedding.0.weight"), DType::F16);
  EXPECT_EQ(s->dtype("blocks.0.self_attn.k.weight"), DType::F32);  // quantised: get() is f32
  EXPECT_EQ(gguf_store_type(*s, "blocks.0.self_attn.k.weight"), GgmlType::Q4_K);
  EXPECT_FALSE(gguf_store_type(*s, "nope").has_value());
  auto f = GgufFile::open(path);
  for (const std::string& n : s->names()) {
    SCOPED_TRACE(n);
    const GgufTensorInfo& t = *f->find(n);
    Tensor x = s->get_f32(n);
    EXPECT_EQ(x.shape(), s->shape(n));
    const std::vector<float> d = dequant(*f, t);
    EXPECT_EQ(std::memcmp(x.data(), d.data(), d.size() * 4), 0);
    auto span = s->raw_span(n);
    const auto full = gguf_raw_span(*f, t, s->shape(n));
    ASSERT_TRUE(full);
    EXPECT_EQ(full->offset, f->data_start() + t.offset);
    EXPECT_EQ(full->length, t.nbytes);
    if (ggml_is_quantized(t.type)) {  // the stored blocks, typed for the GPU loader's dequantisation
      ASSERT_TRUE(span);
      EXPECT_EQ(span->ggml_type, static_cast<uint32_t>(t.type));
      EXPECT_EQ(span->length, t.nbytes);
      EXPECT_EQ(full->dtype, DType::U8);
    } else {
      ASSERT_TRUE(span);
      EXPECT_EQ(span->dtype, s->dtype(n));
      EXPECT_EQ(span->length, static_cast<uint64_t>(x.numel()) * dtype_size(span->dtype));
      const std::string bytes = slurp(path).substr(span->offset, span->length);
      EXPECT_EQ(std::memcmp(bytes.data(), s->get(n).data(), bytes.size()), 0);
    }
  }
  EXPECT_EQ(gguf_shapes(path).at("blocks.0.ffn.0.weight"), (Shape{64, 32}));
  const auto list = gguf_list_tensors(path);
  ASSERT_EQ(list.size(), 9u);
  EXPECT_EQ(list[1].type, "Q4_K");
  EXPECT_EQ(list[1].bytes, 32u * 144u);
}

// A tiny Wan DiT in GGUF with ComfyUI's prefix: 2-D weights Q8_0, the rest F32 (as convert.py keeps
// 1-D and small tensors), patch_embedding 5-D; the store serves it and its shapes give the config back.
TEST(GgufStore, TinyDiTRoundTrip) {
  TempDir dir("gguf");
  const DiTConfig cfg = dit_preset("tiny");
  gen::GgufWriter w("wan");
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::map<std::string, std::pair<Tensor, GgmlType>> want;
  for (const auto& [name, shape] : dit_expected_shapes(cfg)) {
    Tensor t = Tensor::empty(DType::F32, shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = nd(rng);
    const GgmlType q = shape.ndim == 2 && shape[-1] % 32 == 0 ? GgmlType::Q8_0 : GgmlType::F32;
    w.add_tensor(kGgufDitPrefix + name, t, q);
    want[name] = {t, q};
  }
  w.add_tensor("first_stage_model.x", Tensor::f32(Shape{4}), GgmlType::F32);  // no DiT tensor
  w.write(dir / "dit.gguf");
  auto s = open_gguf_dit(dir / "dit.gguf");
  EXPECT_EQ(s->unexpected(), std::vector<std::string>{"first_stage_model.x"});
  EXPECT_EQ(s->names().size(), want.size());
  for (const auto& [name, tq] : want) {
    SCOPED_TRACE(name);
    const auto& [t, q] = tq;
    ASSERT_EQ(s->shape(name), t.shape());
    Tensor got = s->get_f32(name);
    std::vector<float> expect(t.numel());
    const std::string stored = gen::gguf_quantize(q, t.f32(), t.numel());
    gguf_dequantize(q, stored.data(), t.numel(), expect.data());
    EXPECT_EQ(std::memcmp(got.data(), expect.data(), expect.size() * 4), 0);
  }
  const DiTConfig back = dit_config_from_shapes(gguf_shapes(dir / "dit.gguf"));
  EXPECT_EQ(back.dim, cfg.dim);
  EXPECT_EQ(back.ffn_dim, cfg.ffn_dim);
  EXPECT_EQ(back.num_layers, cfg.num_layers);
  EXPECT_EQ(back.in_dim, cfg.in_dim);
  EXPECT_EQ(back.text_dim, cfg.text_dim);

  gen::GgufWriter none("llama");
  none.add_tensor("blk.0.attn_q.weight", Tensor::f32(Shape{2, 32}), GgmlType::Q8_0);
  none.write(dir / "llm.gguf");
  EXPECT_NE(test::error_of([&] { open_gguf_dit(dir / "llm.gguf"); }).find("no Wan DiT tensor"), std::string::npos);
}

// ---- our writer, read by us and by gguf-py ----

gen::GgufWriter every_kind_writer(const GgufFile& fix) {
  gen::GgufWriter w("wan");
  w.set_alignment(128);
  w.add_string("general.name", "test");
  w.add_scalar("k.u8", GgufValueType::U8, 7);
  w.add_scalar("k.i8", GgufValueType::I8, 0xF9);  // -7
  w.add_scalar("k.u16", GgufValueType::U16, 65535);
  w.add_scalar("k.i16", GgufValueType::I16, 0x8000);
  w.add_scalar("k.i32", GgufValueType::I32, 0xFFFFFFFF);
  w.add_scalar("k.f32", GgufValueType::F32, f32_bits(0.25f));
  w.add_scalar("k.bool", GgufValueType::Bool, 1);
  w.add_scalar("k.u64", GgufValueType::U64, ~0ull);
  w.add_scalar("k.i64", GgufValueType::I64, static_cast<uint64_t>(-5ll));
  double d = 3.5;
  uint64_t db;
  std::memcpy(&db, &d, 8);
  w.add_scalar("k.f64", GgufValueType::F64, db);
  w.add_i32_array("comfy.gguf.orig_shape.w.q4k", {4, 128});
  w.add_string_array("k.strs", {"x", "yz"});
  std::vector<float> v(64 * 32);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i)) * static_cast<float>(i % 13);
  w.add_tensor("w.f32", Shape{32, 64}, v.data(), GgmlType::F32);
  w.add_tensor("w.f16", Shape{2, 16, 64}, v.data(), GgmlType::F16);
  w.add_tensor("w.bf16", Shape{64, 32}, v.data(), GgmlType::BF16);
  w.add_tensor("w.q8", Shape{64, 32}, v.data(), GgmlType::Q8_0);
  // Raw blocks of every other type, taken from the fixture.
  for (GgmlType t : kDequantTypes) {
    if (!ggml_is_quantized(t) || t == GgmlType::Q8_0) continue;
    const GgufTensorInfo& q = *fix.find(cat("q.", ggml_type_name(t)));
    const int64_t n = ggml_info(t).block_size * 2;
    w.add_raw(cat("w.", ggml_type_name(t)), Shape{2, n / 2}, t,
              std::string(reinterpret_cast<const char*>(fix.tensor_data(q)), ggml_nbytes(t, n)));
  }
  w.add_raw("w.q4k", Shape{2, 256}, GgmlType::Q4_K,
            std::string(reinterpret_cast<const char*>(fix.tensor_data(*fix.find("q.Q4_K"))), 2 * 144));
  w.add_tensor("w.5d", Shape{2, 1, 2, 2, 4}, v.data(), GgmlType::F32);
  return w;
}

TEST(GgufWriter, RoundTripThroughOurReader) {
  TempDir dir("gguf");
  auto fix = GgufFile::open(kFix + "/dequant.gguf");
  every_kind_writer(*fix).write(dir / "ours.gguf");
  auto f = GgufFile::open(dir / "ours.gguf");
  EXPECT_EQ(f->alignment(), 128u);
  EXPECT_EQ(f->find_kv("k.i8")->as_i64(), -7);
  EXPECT_EQ(f->find_kv("k.i16")->as_i64(), -32768);
  EXPECT_EQ(f->find_kv("k.i32")->as_i64(), -1);
  EXPECT_EQ(f->find_kv("k.u64")->as_u64(), ~0ull);
  EXPECT_EQ(f->find_kv("k.i64")->as_i64(), -5);
  EXPECT_EQ(f->find_kv("k.f64")->as_f64(), 3.5);
  EXPECT_EQ(f->find_kv("k.f32")->as_f64(), 0.25);
  EXPECT_EQ(f->find("w.f16")->torch_shape(), (Shape{2, 16, 64}));
  EXPECT_EQ(f->find("w.5d")->n_dims, 5u);
  for (const GgufTensorInfo& t : f->tensors()) EXPECT_EQ(t.offset % 128, 0u) << t.name;
  const Tensor q8 = f->dequantize("w.q8");
  const Tensor f32 = f->get("w.f32");
  for (int64_t i = 0; i < q8.numel(); ++i) EXPECT_NEAR(q8.f32()[i], f32.f32()[i], 0.05f) << i;
  EXPECT_NE(test::error_of([&] { gen::GgufWriter().add_tensor("x", Shape{3, 33}, nullptr, GgmlType::Q8_0); })
                .find("whole number"),
            std::string::npos);
}

TEST(GgufWriter, ReadByGgufPy) {
  // The oracle is part of the test environment (scripts/requirements-oracle.txt): missing is a failure.
  ASSERT_TRUE(fs::exists(WAN_PYTHON) &&
              std::system((std::string("'") + WAN_PYTHON + "' -c 'import gguf' 2>/dev/null").c_str()) == 0)
      << "no python with the gguf package at " << WAN_PYTHON << " (run scripts/setup.sh)";
  TempDir dir("gguf");
  auto fix = GgufFile::open(kFix + "/dequant.gguf");
  every_kind_writer(*fix).write(dir / "ours.gguf");
  const std::string cmd = cat("'", WAN_PYTHON, "' '", WAN_SOURCE_DIR, "/tools/make_gguf_fixtures.py' verify '",
                              dir / "ours.gguf", "' '", dir / "py", "' > '", dir / "log", "' 2>&1");
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << slurp(dir / "log");
  const auto j = nlohmann::json::parse(slurp(dir / "py.json"));
  const std::string blob = slurp(dir / "py.bin");
  auto f = GgufFile::open(dir / "ours.gguf");
  EXPECT_EQ(j["kv"].size(), f->metadata().size());
  for (const GgufKV& kv : f->metadata()) {
    SCOPED_TRACE(kv.key);
    const auto& pj = j["kv"][kv.key];
    ASSERT_FALSE(pj.is_null());
    EXPECT_EQ(pj["type"][0].get<int>(), static_cast<int>(kv.value.type));
    if (kv.value.type == GgufValueType::String) {
      EXPECT_EQ(pj["value"].get<std::string>(), kv.value.str);
    } else if (kv.value.type == GgufValueType::U64) {
      EXPECT_EQ(pj["value"].get<uint64_t>(), kv.value.as_u64());
    } else if (kv.value.is_int()) {
      EXPECT_EQ(pj["value"].get<int64_t>(), kv.value.as_i64());
    } else if (kv.value.is_float()) {
      EXPECT_EQ(pj["value"].get<double>(), kv.value.as_f64());
    }
  }
  EXPECT_EQ(j["kv"]["k.strs"]["value"], nlohmann::json({"x", "yz"}));
  ASSERT_EQ(j["tensors"].size(), f->tensors().size());
  for (size_t i = 0; i < f->tensors().size(); ++i) {
    const GgufTensorInfo& t = f->tensors()[i];
    const auto& pt = j["tensors"][i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(pt["name"].get<std::string>(), t.name);
    EXPECT_STREQ(pt["type"].get<std::string>().c_str(), ggml_type_name(t.type));
    EXPECT_EQ(Shape(pt["shape"].get<std::vector<int64_t>>()), t.torch_shape());
    const std::vector<float> d = dequant(*f, t);
    ASSERT_EQ(pt["nbytes"].get<size_t>(), d.size() * 4);
    EXPECT_EQ(std::memcmp(blob.data() + pt["offset"].get<size_t>(), d.data(), d.size() * 4), 0);
  }
}

TEST(GgufWriter, FuzzSeedsAreValid) {
  TempDir dir("gguf_seeds");
  gen::write_gguf_seeds(dir / "gguf");
  for (const char* name : {"dit.gguf", "comfy_prefix.gguf", "every_type.gguf"}) {
    SCOPED_TRACE(name);
    const std::string p = dir / (std::string("gguf/") + name);
    EXPECT_LT(fs::file_size(p), 8192u);
    auto f = GgufFile::open(p);
    for (const GgufTensorInfo& t : f->tensors()) f->dequantize(t.name);
  }
  auto s = open_gguf_dit(dir / "gguf/comfy_prefix.gguf");
  EXPECT_EQ(s->names().size(), 7u);
  EXPECT_EQ(s->shape("blocks.0.ffn.2.weight"), (Shape{32, 8}));
  EXPECT_TRUE(s->unexpected().empty());
}

// ---- bad inputs ----

// Little-endian building blocks of hand-made GGUF files.
struct Bytes {
  std::string b;
  Bytes& u32(uint32_t v) { return put(v, 4); }
  Bytes& u64(uint64_t v) { return put(v, 8); }
  Bytes& str(const std::string& s) {
    u64(s.size());
    b += s;
    return *this;
  }
  Bytes& put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b += static_cast<char>((v >> (8 * i)) & 0xFF);
    return *this;
  }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b += "GGUF";
    return u32(version).u64(n_tensors).u64(n_kv);
  }
  // A tensor info: name, dims (ggml order), type, offset.
  Bytes& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(ne.size()));
    for (uint64_t n : ne) u64(n);
    return u32(type).u64(offset);
  }
  Bytes& pad(size_t a = 32) {
    b.resize((b.size() + a - 1) / a * a, '\0');
    return *this;
  }
  Bytes& data(size_t n) {
    b.append(n, '\x01');
    return *this;
  }
};

// The message of the one BadInput error opening `bytes` gives; checks that it names the file and is
// one line.
std::string open_error(const std::string& bytes) {
  TempDir dir("gguf_bad");
  const std::string p = dir / "bad.gguf";
  spit(p, bytes);
  try {
    GgufFile::open(p);
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::BadInput) << m;
    EXPECT_EQ(m.rfind(p + ": ", 0), 0u) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    return m.substr(p.size() + 2);
  }
  return "(no error)";
}
#define EXPECT_BAD(bytes, text) EXPECT_NE(open_error(bytes).find(text), std::string::npos) << open_error(bytes)

TEST(GgufBadInput, HeaderAndCounts) {
  EXPECT_BAD("", "truncated");
  EXPECT_BAD("GGU", "truncated");
  EXPECT_BAD(Bytes().header(0, 0).b.replace(0, 4, "GGML"), "not a GGUF file");
  EXPECT_BAD(Bytes().header(0, 0, 1).b, "version 1 is not supported");
  EXPECT_BAD(Bytes().header(0, 0, 4).b, "unsupported GGUF version 4");
  EXPECT_BAD(Bytes().header(0, 0, 0x03000000).b, "big-endian");
  EXPECT_BAD(Bytes().header(0, 0).b.substr(0, 20), "truncated: the KV count");
  EXPECT_BAD(Bytes().header(0, uint64_t{1} << 60).b, "KV count 1152921504606846976 is impossible");
  EXPECT_BAD(Bytes().header(~0ull, 0).b, "tensor count");
  EXPECT_BAD(Bytes().header(0, 1).str("k").u32(8).u64(~0ull).b, "truncated: a string value");
  EXPECT_BAD(Bytes().header(0, 1).str("k").u32(9).u32(6).u64(uint64_t{1} << 62).b, "cannot fit");
  EXPECT_BAD(Bytes().header(0, 1).str("k").u32(9).u32(8).u64(uint64_t{1} << 40).b, "cannot fit");
  EXPECT_BAD(Bytes().header(0, 1).u64(~0ull).u32(0).put(0, 1).b, "truncated: the key");
  EXPECT_BAD(Bytes().header(0, 1).str("k").u32(13).u32(0).b, "unknown value type 13");
  EXPECT_BAD(Bytes().header(0, 1).str("k").u32(9).u32(9).u64(1).b, "nested arrays");
  EXPECT_BAD(Bytes().header(0, 1).str("k").u32(9).u32(77).u64(1).b, "unknown array element type 77");
  EXPECT_BAD(Bytes().header(0, 1).str("k").u32(7).put(2, 1).b, "bool value 2");
  EXPECT_BAD(Bytes().header(0, 2).str("k").u32(0).put(1, 1).str("k").u32(0).put(1, 1).b, "KV 1 'k': duplicate key");
}

TEST(GgufBadInput, Alignment) {
  EXPECT_BAD(Bytes().header(0, 1).str("general.alignment").u32(4).u32(48).b, "not a power of two");
  EXPECT_BAD(Bytes().header(0, 1).str("general.alignment").u32(4).u32(0).b, "not a power of two");
  EXPECT_BAD(Bytes().header(0, 1).str("general.alignment").u32(10).u64(64).b, "is a u64, expected u32");
  // Tensor offsets must be multiples of the alignment.
  EXPECT_BAD(Bytes().header(1, 0).tensor("t", {4}, 0, 8).pad().data(64).b, "offset 8 is not a multiple of the alignment 32");
}

TEST(GgufBadInput, TensorInfos) {
  auto one = [](const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t off, size_t data) {
    return Bytes().header(1, 0).tensor(name, std::move(ne), type, off).pad().data(data).b;
  };
  EXPECT_EQ(open_error(one("t", {4}, 0, 0, 16)), "(no error)");
  EXPECT_BAD(one("t", {4}, 4, 0, 16), "unknown ggml type 4");
  EXPECT_BAD(one("t", {4}, 1000, 0, 16), "unknown ggml type 1000");
  EXPECT_BAD(one("t", {48, 2}, 8, 0, 256), "not a whole number of Q8_0 blocks");
  EXPECT_BAD(one("t", {256, 2}, 12, 0, 256), "outside the data section");
  EXPECT_BAD(one("t", {4}, 0, 32, 16), "outside the data section");
  EXPECT_BAD(one("t", {4}, 0, ~0ull - 31, 16), "outside the data section");
  EXPECT_BAD(one("t", {1, 1, 1, 1, 1, 1}, 0, 0, 16), "n_dims 6");
  EXPECT_BAD(one("t", {1ull << 32, 1ull << 32}, 0, 0, 16), "overflow");
  EXPECT_BAD(one("t", {~0ull}, 0, 0, 16), "overflow");
  EXPECT_BAD(one("t", {0, 1ull << 41, 1ull << 41}, 0, 0, 16), "overflow");  // found by fuzz_gguf
  EXPECT_BAD(one("", {4}, 0, 0, 16), "empty tensor name");
  EXPECT_BAD(one("t", {4}, 0, 0, 16).substr(0, 48), "truncated: the ggml type");
  const std::string two_same = Bytes().header(2, 0).tensor("t", {4}, 0, 0).tensor("t", {4}, 0, 32).pad().data(64).b;
  EXPECT_BAD(two_same, "tensor 1 't': duplicate tensor name");
  const std::string overlap = Bytes().header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {4}, 0, 32).pad().data(64).b;
  EXPECT_BAD(overlap, "overlaps tensor 'a'");
  // Zero-element tensors own no bytes: never overlapping, allowed at the end of the data section.
  const std::string empty = Bytes().header(2, 0).tensor("a", {0, 4}, 0, 0).tensor("b", {4}, 0, 0).pad().data(16).b;
  EXPECT_EQ(open_error(empty), "(no error)");
}

// Every truncation and many random mutations of a valid file either open or give one BadInput error.
TEST(GgufBadInput, TruncationsAndMutationsNeverCrash) {
  const std::string good = slurp(kFix + "/meta.gguf");
  auto f = GgufFile::open(kFix + "/meta.gguf");
  size_t header = static_cast<size_t>(f->data_start());
  TempDir dir("gguf_mut");
  const std::string p = dir / "m.gguf";
  auto check = [&](const std::string& bytes) {
    spit(p, bytes);
    try {
      auto g = GgufFile::open(p);
      for (const GgufTensorInfo& t : g->tensors())
        if (ggml_info(t.type).dequantizable && t.numel < (1u << 20)) g->dequantize(t.name);
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  };
  for (size_t n = 0; n < good.size(); n += n < 256 ? 1 : n < header ? 7 : 997) {
    spit(p, good.substr(0, n));
    EXPECT_THROW(GgufFile::open(p), Error) << n;
  }
  std::mt19937_64 rng(1234);
  for (int i = 0; i < 1000; ++i) {
    std::string m = good.substr(0, header + 64);
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % header;
      switch (rng() % 3) {
        case 0: m[at] = static_cast<char>(rng()); break;
        case 1: m[at] ^= static_cast<char>(1u << (rng() % 8)); break;
        default: std::memset(&m[at], rng() % 2 ? 0xFF : 0, std::min<size_t>(8, header - at)); break;
      }
    }
    check(m);
  }
}

}  // namespace
}  // namespace wan
