// Tests of the torch.save (.pth) reader and writer, on fresh random data, against PyTorch itself:
// files written by torch.save (tools/pth_crosscheck.py make) must read back byte-identical here,
// and files written by write_pth must load byte-identical in torch.load(weights_only=True), with
// and without mmap=True (tools/pth_crosscheck.py check, against a raw dump this test writes).
// Hostile inputs (code-running pickles, broken records, corrupt or truncated zips, legacy files)
// must fail with a wan::Error that names the file, never crash or read outside the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sys/wait.h>

#include "formats/pth.h"
#include "formats/zip.h"

namespace fs = std::filesystem;
using namespace wan;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void spit(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

uint64_t fresh_seed() {
  static const uint64_t s = std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
  return s;
}

// One scratch folder per test process, removed at exit.
const std::string& scratch() {
  static const std::string dir = [] {
    fs::path p = fs::temp_directory_path() / ("wan_test_pth_" + std::to_string(::getpid()));
    fs::remove_all(p);
    fs::create_directories(p);
    std::atexit([] { fs::remove_all(fs::temp_directory_path() / ("wan_test_pth_" + std::to_string(::getpid()))); });
    return p.string();
  }();
  return dir;
}
std::string tmp(const std::string& name) { return scratch() + "/" + name; }

int run_oracle(const std::string& args, std::string* output = nullptr) {
  std::string log = tmp("oracle.log");
  std::string cmd = std::string("'") + WAN_PYTHON + "' '" + WAN_SOURCE_DIR + "/tools/pth_crosscheck.py' " + args +
                    " > '" + log + "' 2>&1";
  int rc = std::system(cmd.c_str());
  if (output) *output = slurp(log);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// torch.save files made once per process (python start-up with torch costs seconds).
const std::string& torch_files() {
  static const std::string dir = [] {
    std::string d = tmp("torch");
    fs::create_directories(d);
    std::string out;
    int rc = run_oracle("make '" + d + "' " + std::to_string(fresh_seed() % 1000000007), &out);
    return rc == 0 ? d : std::string("python oracle failed (rc ") + std::to_string(rc) + "): " + out;
  }();
  return dir;
}
#define REQUIRE_TORCH_FILES()                                                        \
  ASSERT_TRUE(fs::exists(WAN_PYTHON)) << "python oracle missing: " << WAN_PYTHON;   \
  ASSERT_TRUE(fs::is_directory(torch_files())) << torch_files()

struct Expected {
  DType dtype;
  Shape shape;
  std::string bytes;
};
// Reads a manifest + raw dump written by pth_crosscheck.py, in manifest order.
std::vector<std::pair<std::string, Expected>> load_expected(const std::string& stem) {
  auto j = nlohmann::ordered_json::parse(slurp(stem + ".json"));
  std::string raw = slurp(stem + ".bin");
  std::vector<std::pair<std::string, Expected>> out;
  for (auto& [name, m] : j.items()) {
    Expected e{dtype_from_safetensors(m["dtype"].get<std::string>()), Shape(m["shape"].get<std::vector<int64_t>>()),
               raw.substr(m["offset"].get<size_t>(), m["nbytes"].get<size_t>())};
    out.emplace_back(name, std::move(e));
  }
  return out;
}

void expect_identical(const PthFile& f, const std::vector<std::pair<std::string, Expected>>& want) {
  ASSERT_EQ(f.tensors().size(), want.size()) << f.path();
  for (size_t i = 0; i < want.size(); ++i) {
    const auto& [name, e] = want[i];
    SCOPED_TRACE(name);
    EXPECT_EQ(f.tensors()[i].name, name);  // pickle order is kept
    ASSERT_NE(f.find(name), nullptr);
    Tensor t = f.get(name);
    EXPECT_EQ(t.dtype(), e.dtype);
    EXPECT_EQ(t.shape(), e.shape) << t.shape().str() << " vs " << e.shape.str();
    ASSERT_EQ(t.nbytes(), e.bytes.size());
    EXPECT_TRUE(t.view().is_contiguous());
    // Misaligned records (other zip writers) are copied, so elements are always aligned.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % dtype_size(t.dtype()), 0u);
    EXPECT_EQ(std::memcmp(t.data(), e.bytes.data(), e.bytes.size()), 0) << "values differ";
  }
}

// Opens the file and reads every tensor; returns the error message (test failure if none).
std::string open_error(const std::string& path) {
  try {
    auto f = PthFile::open(path);
    for (const auto& t : f->tensors()) f->get(t.name);
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path, 0), 0u) << "error does not name the file: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << path << ": opened without error";
  return {};
}

// Random contents of the right kind for each dtype (finite floats, 0/1 bools).
void random_fill(std::mt19937_64& rng, const TensorSpec& s, void* dst) {
  std::normal_distribution<float> nd(0.f, 2.f);
  auto* b = static_cast<uint8_t*>(dst);
  const int64_t n = s.shape.numel();
  for (int64_t i = 0; i < n; ++i) {
    switch (s.dtype) {
      case DType::F32: { float v = nd(rng); std::memcpy(b + 4 * i, &v, 4); break; }
      case DType::F64: { double v = nd(rng); std::memcpy(b + 8 * i, &v, 8); break; }
      case DType::F16: { uint16_t v = f32_to_f16(nd(rng)); std::memcpy(b + 2 * i, &v, 2); break; }
      case DType::BF16: { uint16_t v = f32_to_bf16(nd(rng)); std::memcpy(b + 2 * i, &v, 2); break; }
      case DType::F8E4M3: b[i] = f32_to_f8e4m3(nd(rng)); break;
      case DType::F8E5M2: b[i] = f32_to_f8e5m2(nd(rng)); break;
      case DType::Bool: b[i] = rng() & 1; break;
      default: {
        uint64_t v = rng();
        std::memcpy(b + dtype_size(s.dtype) * i, &v, dtype_size(s.dtype));
      }
    }
  }
}

// Writes `specs` with random contents through write_pth and the same bytes as a manifest + raw
// dump for the oracle. Returns the expected contents.
std::vector<std::pair<std::string, Expected>> write_random(const std::string& path, const std::vector<TensorSpec>& specs,
                                                           const PthWriteOptions& opt = {}) {
  std::mt19937_64 rng(fresh_seed() ^ std::hash<std::string>{}(path));
  std::map<std::string, std::string> filled;
  write_pth(
      path, specs,
      [&](const TensorSpec& s, void* dst) {
        random_fill(rng, s, dst);
        filled[s.name].assign(static_cast<const char*>(dst), s.nbytes());
      },
      opt);
  std::vector<std::pair<std::string, Expected>> out;
  nlohmann::ordered_json manifest;
  std::string raw;
  for (const auto& s : specs) {
    const std::string& b = filled[s.name];  // empty tensors are never filled
    manifest[s.name] = {{"dtype", dtype_to_safetensors(s.dtype)}, {"shape", s.shape.vec()}, {"offset", raw.size()},
                        {"nbytes", b.size()}};
    raw += b;
    out.push_back({s.name, Expected{s.dtype, s.shape, b}});
  }
  spit(path + ".json", manifest.dump());
  spit(path + ".bin", raw);
  return out;
}

std::vector<TensorSpec> every_kind_of_spec() {
  std::vector<TensorSpec> specs = {
      {"blocks.0.w", DType::F32, {17, 33}}, {"bf", DType::BF16, {8, 5}},      {"h", DType::F16, {3}},
      {"d", DType::F64, {2, 2}},            {"e4", DType::F8E4M3, {16}},       {"e5", DType::F8E5M2, {4, 4}},
      {"l", DType::I64, {5}},               {"i", DType::I32, {3}},            {"s", DType::I16, {3}},
      {"c", DType::I8, {9}},                {"u", DType::U8, {10}},            {"flag", DType::Bool, {6}},
      {"scalar", DType::F32, {}},           {"empty", DType::BF16, {0, 7}},    {"rank6", DType::F32, {2, 1, 2, 1, 3, 2}},
      {"wide", DType::U8, {1, 70000}},      // BININT (> 65535) dims and strides
      {"huge_empty", DType::F32, {0, 3000000000}},  // LONG1 dims and strides, no bytes
  };
  // Crosses the 1000-item SETITEMS batches of the pickle.
  for (int i = 0; i < 1100; ++i) specs.push_back({"many." + std::to_string(i), DType::BF16, {2}});
  return specs;
}

// ---- hand-made archives ----
std::string u32le(uint32_t v) { return std::string{char(v), char(v >> 8), char(v >> 16), char(v >> 24)}; }
std::string S(const std::string& s) { return "X" + u32le(static_cast<uint32_t>(s.size())) + s; }  // BINUNICODE
std::string K(int v) { return std::string("K") + char(v); }                                          // BININT1

// {"w": _rebuild_tensor_v2(storage(FloatStorage, key, numel), offset, (n,), (1,), False, {})}
std::string tensor_pickle(const std::string& key, int numel, int n, int offset) {
  return std::string("\x80\x02}(") + S("w") + "ctorch._utils\n_rebuild_tensor_v2\n((" + S("storage") +
         "ctorch\nFloatStorage\n" + S(key) + S("cpu") + K(numel) + "tQ" + K(offset) + K(n) + "\x85" + K(1) +
         "\x85\x89}tRu.";
}

// A zip in torch's layout around `pkl`, with one 16-byte storage record "data/0".
std::string make_archive(const std::string& name, const std::string& pkl, const std::string& record = std::string(16, 'x')) {
  std::string path = tmp(name + ".pth");
  zip::Writer w(path, {});
  w.add(name + "/data.pkl", pkl.data(), pkl.size());
  w.add(name + "/byteorder", "little", 6);
  w.add(name + "/data/0", record.data(), record.size());
  w.finish();
  return path;
}

void put32(std::string& b, size_t at, uint32_t v) { b.replace(at, 4, u32le(v)); }
uint32_t get32(const std::string& b, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[at + i]);
  return v;
}

}  // namespace

static void reads_torch_saved_files_identically() {
  const std::string dir = torch_files();
  expect_identical(*PthFile::open(dir + "/proto4.pth"), load_expected(dir + "/proto4"));
  auto f = PthFile::open(dir + "/mixed.pth");
  expect_identical(*f, load_expected(dir + "/mixed"));

  // Views into the shared storages as torch described them.
  const PthTensorInfo* bt = f->find("base_t");
  ASSERT_NE(bt, nullptr);
  EXPECT_EQ(bt->stride, (std::vector<int64_t>{1, 6}));
  EXPECT_EQ(bt->storage_key, f->find("base")->storage_key);
  const PthTensorInfo* win = f->find("window");
  EXPECT_EQ(win->storage_offset, 8);  // base[1:, 2:5]
  EXPECT_EQ(win->stride, (std::vector<int64_t>{6, 1}));
  // Contiguous aligned tensors are zero-copy views of the mapping: two tensors on one storage sit
  // at their element offsets (2 and 10) in the same record, and a second get() returns the same bytes.
  Tensor a = f->get("share_a"), b = f->get("share_b");
  EXPECT_EQ(f->find("share_a")->storage_key, f->find("share_b")->storage_key);
  EXPECT_EQ(static_cast<const char*>(b.data()) - static_cast<const char*>(a.data()), 8 * 4);
  EXPECT_EQ(f->get("base").data(), f->get("base").data());
  EXPECT_NE(f->get("base_t").data(), f->get("base_t").data());  // transposed: copied each time
  // The transpose really is the transpose of "base" (values, not just the dump).
  Tensor base = f->get("base"), base_t = f->get("base_t");
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 6; ++c) EXPECT_EQ(base.f32()[r * 6 + c], base_t.f32()[c * 4 + r]);
  // A tensor keeps the mapping alive after the file object is gone.
  f.reset();
  for (const auto& [name, e] : load_expected(dir + "/mixed")) {
    if (name != "share_a") continue;
    EXPECT_EQ(std::memcmp(a.data(), e.bytes.data(), a.nbytes()), 0);
  }
}

static void flattens_nested_dicts_and_skips_non_tensors() {
  auto f = PthFile::open(torch_files() + "/nested.pth");
  auto want = load_expected(torch_files() + "/nested");
  std::vector<std::string> names;
  for (const auto& t : f->tensors()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"model.0.weight", "model.0.bias", "model.1.weight", "model.1.bias",
                                             "ema.inner.w"}));
  expect_identical(*f, want);
}

static void reads_archives_from_other_zip_writers() {
  // Python's zipfile: another top folder, no alignment padding (misaligned elements are copied).
  auto f = PthFile::open(torch_files() + "/pyzip.pth");
  expect_identical(*f, load_expected(torch_files() + "/pyzip"));
  std::string msg = open_error(torch_files() + "/deflated.pth");
  EXPECT_NE(msg.find("is compressed (method 8); only stored entries can be read"), std::string::npos) << msg;
}

static void refuses_legacy_format() {
  std::string msg = open_error(torch_files() + "/legacy.pth");
  EXPECT_NE(msg.find("legacy torch.save format is not supported; re-save with torch>=1.6"), std::string::npos) << msg;
}

// Both the plain layout and the forced-ZIP64 layout, checked in one python run (torch's import
// costs seconds).
TEST(Pth, WrittenFilesLoadInTorch) {
  ASSERT_TRUE(fs::exists(WAN_PYTHON)) << "python oracle missing: " << WAN_PYTHON;
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const std::string path = tmp("written.pth"), path64 = tmp("zip64.pth");
  auto want = write_random(path, every_kind_of_spec());
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  std::vector<TensorSpec> specs64 = {{"a", DType::F32, {9, 7}}, {"b", DType::F8E4M3, {33}}, {"c", DType::I64, {}}};
  auto want64 = write_random(path64, specs64, {.force_zip64 = true});
  std::string out;
  EXPECT_EQ(run_oracle("check '" + path + "' '" + path + ".json' '" + path + ".bin' '" + path64 + "' '" + path64 +
                           ".json' '" + path64 + ".bin'",
                       &out),
            0)
      << out;

  // Our own reader, zero-copy since every record is 64-byte aligned.
  auto f = PthFile::open(path);
  expect_identical(*f, want);
  Tensor w = f->get("blocks.0.w");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.data()) % 64, 0u);
  EXPECT_EQ(slurp(path).find(std::string("PK\x06\x06", 4)), std::string::npos) << "small file needs no ZIP64";

  // Forced ZIP64: end record + locator present and the classic end record saturated, so readers
  // must take the 64-bit values (and the ZIP64 extra fields of every entry).
  const std::string bytes = slurp(path64);
  EXPECT_NE(bytes.find(std::string("PK\x06\x06", 4)), std::string::npos);
  EXPECT_NE(bytes.find(std::string("PK\x06\x07", 4)), std::string::npos);
  ASSERT_GE(bytes.size(), 22u);
  EXPECT_EQ(bytes.substr(bytes.size() - 22 + 16, 4), std::string(4, '\xff'));
  expect_identical(*PthFile::open(path64), want64);
}

TEST(Pth, RefusesCodeRunningAndMalformedPickles) {
  const std::string big_stride = std::string("\x8a\x08", 2) + std::string("\x00\x00\x00\x00\x00\x00\x00\x40", 8);
  struct Case {
    const char* name;
    std::string pkl;
    const char* expect;
  } cases[] = {
      {"os_system", "\x80\x02" "cos\nsystem\n" + S("ls") + "\x85R.",
       ": refused pickle global 'os.system' (only tensor state dicts are read)"},
      {"posix_system", "\x80\x02" "cposix\nsystem\n" + S("ls") + "\x85R.", "refused pickle global 'posix.system'"},
      {"builtins_eval", std::string("\x80\x04\x95\x10", 4) + std::string(7, '\0') + "\x8c\x08" "builtins" "\x8c\x04" "eval" "\x93" +
                            S("1") + "\x85R.",
       "refused pickle global 'builtins.eval'"},
      {"getattr", "\x80\x02" "cbuiltins\ngetattr\n.", "refused pickle global 'builtins.getattr'"},
      {"torch_load", "\x80\x02" "ctorch\nload\n.", "refused pickle global 'torch.load'"},
      {"inst_opcode", "\x80\x02i", "refused pickle opcode 0x69"},
      {"ff_opcode", "\x80\x02\xff", "refused pickle opcode 0xff"},
      {"call_storage", "\x80\x02" "ctorch\nFloatStorage\n)R.", "refused pickle call of storage type 'torch.FloatStorage'"},
      {"build_list", "\x80\x02]}b.", "refused pickle BUILD of a list"},
      {"bad_persid", "\x80\x02" + S("storage") + "\x85Q.", "refused pickle persistent id"},
      {"truncated", tensor_pickle("0", 4, 4, 0).substr(0, 40), "truncated pickle"},
      {"huge_string", "\x80\x02X\xff\xff\xff\x7f", "truncated pickle: string of 2147483647 bytes"},
      {"memo_miss", std::string("\x80\x02}r\xff\xff\xff\xffj\x01\0\0\0.", 14), "memo key 1 not found"},
      {"deep_marks", "\x80\x02" + std::string(300, '('), "pickle nesting deeper than 256 levels"},
      {"underflow", "\x80\x02\x85.", "stack underflow"},
      {"long_int", "\x80\x02\x8a\x09" + std::string(9, '\1') + ".", "integer of 9 bytes is too large"},
      {"protocol6", "\x80\x06}.", "unsupported pickle protocol 6"},
      {"list_root", "\x80\x02].", "not a state dict"},
      {"no_tensors", "\x80\x02}(" + S("step") + K(3) + "u.", "holds no tensors"},
      {"missing_record", tensor_pickle("7", 4, 4, 0), "tensor 'w': storage '7' has no record in the archive"},
      {"past_storage", tensor_pickle("0", 4, 5, 0), "tensor 'w' (shape [5], offset 0) extends to byte 20 of storage '0' which holds 16 bytes"},
      {"past_by_offset", tensor_pickle("0", 4, 4, 1), "extends to byte 20"},
      {"storage_too_big", tensor_pickle("0", 8, 4, 0), "storage '0' declares 32 bytes but its record holds 16"},
      {"huge_stride",
       "\x80\x02}(" + S("w") + "ctorch._utils\n_rebuild_tensor_v2\n((" + S("storage") + "ctorch\nFloatStorage\n" +
           S("0") + S("cpu") + K(4) + "tQ" + K(0) + K(2) + "\x85" + big_stride + "\x85\x89}tRu.",
       "extends to byte"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = make_archive(c.name, c.pkl);
    std::string msg = open_error(path);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
  }
  // The same hand-made layout with a well-formed pickle reads (the refusals above are specific).
  float vals[4] = {1.5f, -2.25f, 3.f, 1e-3f};
  std::string path = make_archive("good", tensor_pickle("0", 4, 3, 1), std::string(reinterpret_cast<char*>(vals), 16));
  auto f = PthFile::open(path);
  Tensor w = f->get("w");
  ASSERT_EQ(w.shape(), Shape({3}));
  EXPECT_EQ(w.f32()[0], -2.25f);
  EXPECT_EQ(w.f32()[2], 1e-3f);
}

TEST(Pth, RejectsCorruptZips) {
  const std::string good_path = tmp("small.pth");
  write_random(good_path, {{"x", DType::F32, {4, 4}}, {"y", DType::BF16, {3}}});
  const std::string good = slurp(good_path);
  ASSERT_NO_THROW(PthFile::open(good_path));
  const size_t eocd = good.rfind("PK\x05\x06");
  ASSERT_NE(eocd, std::string::npos);
  const size_t cd = get32(good, eocd + 16);
  // The central header of "small/data/0" (the first tensor record).
  size_t h = good.find("small/data/0", cd) - 46;
  ASSERT_EQ(good.substr(h, 4), std::string("PK\x01\x02", 4));

  struct Case {
    const char* name;
    std::string bytes;
    const char* expect;
  };
  std::vector<Case> cases;
  cases.push_back({"empty", "", "not a torch.save zip archive"});
  cases.push_back({"garbage", std::string(500, 'g'), "not a torch.save zip archive"});
  cases.push_back({"half", good.substr(0, good.size() / 2), "no end-of-central-directory record"});
  cases.push_back({"minus_one", good.substr(0, good.size() - 1), "no end-of-central-directory record"});
  std::string b = good;
  put32(b, eocd + 16, 0x7FFFFFF0u);
  cases.push_back({"cd_offset", b, "central directory"});
  b = good;
  put32(b, h + 42, 0x7FFFFFF0u);
  cases.push_back({"local_offset", b, "no local header for 'small/data/0'"});
  b = good;
  put32(b, h + 42, get32(good, h + 42) + 1);
  cases.push_back({"local_shifted", b, "no local header for 'small/data/0'"});
  b = good;
  put32(b, h + 20, 1u << 30);
  put32(b, h + 24, 1u << 30);
  cases.push_back({"entry_size", b, "data of 'small/data/0'"});
  b = good;
  put32(b, h + 20, 80);
  cases.push_back({"size_mismatch", b, "stored entry 'small/data/0' has size 64 but occupies 80 bytes"});
  b = good;
  // data.pkl is the first entry: its bytes follow the local header's name and extra field.
  b[30 + (get32(good, 26) & 0xFFFF) + (get32(good, 28) & 0xFFFF) + 5] ^= 0x5A;
  cases.push_back({"pickle_crc", b, "fails its CRC-32 check"});
  b = good;
  b[h + 46 + 6] = 'X';  // central name "small/Xata/0" no longer matches the local header
  cases.push_back({"name_mismatch", b, "does not match the central directory"});
  {  // No data.pkl at all.
    std::string p = tmp("nopkl.pth");
    zip::Writer w(p, {});
    w.add("nopkl/version", "3\n", 2);
    w.finish();
    cases.push_back({"no_pickle", slurp(p), "has no data.pkl"});
  }
  {  // ZIP64 end record pointing outside the file.
    std::string z = tmp("z64.pth");
    write_random(z, {{"x", DType::F32, {4}}}, {.force_zip64 = true});
    std::string zb = slurp(z);
    size_t rec = zb.rfind("PK\x06\x06");
    ASSERT_NE(rec, std::string::npos);
    zb.replace(rec + 48, 8, std::string("\xf0\xff\xff\xff\xff\xff\xff\x0f", 8));
    cases.push_back({"zip64_cd_offset", zb, "central directory"});
    zb = slurp(z);
    size_t loc = zb.rfind("PK\x06\x07");
    zb.replace(loc + 8, 8, std::string("\xf0\xff\xff\xff\xff\xff\xff\x0f", 8));
    cases.push_back({"zip64_locator", zb, "ZIP64 end record offset"});
  }
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::string p = tmp(std::string("corrupt_") + c.name + ".pth");
    spit(p, c.bytes);
    std::string msg = open_error(p);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
  }
}

// Opens corrupted variants of a file; counts those that read and those refused with wan::Error
// (any other outcome fails the test). Thousands of rewrites: on tmpfs when there is one.
struct Fuzzer {
  std::string path = fs::is_directory("/dev/shm") ? "/dev/shm/wan_test_pth_fuzz_" + std::to_string(::getpid()) + ".pth"
                                                  : tmp("fuzz.pth");
  std::mt19937_64 rng{fresh_seed()};
  size_t failures = 0, successes = 0;
  ~Fuzzer() { fs::remove(path); }

  void attempt(const std::string& bytes) {
    spit(path, bytes);
    try {
      auto f = PthFile::open(path);
      for (const auto& t : f->tensors()) {
        Tensor x = f->get(t.name);
        volatile uint8_t sink = 0;
        for (size_t i = 0; i < x.nbytes(); ++i) sink = sink ^ static_cast<const uint8_t*>(x.data())[i];
      }
      ++successes;
    } catch (const Error&) {
      ++failures;
    }
  }
  // Every byte flipped once (by a random non-zero mask). Flips in signatures, offsets, sizes,
  // names and the pickle are caught; flips in tensor bytes, padding, dates and tensor-record
  // CRCs are not (torch checks no CRC at all).
  void flip_each_byte(const std::string& good) {
    failures = successes = 0;
    for (size_t pos = 0; pos < good.size(); ++pos) {
      std::string b = good;
      b[pos] = static_cast<char>(b[pos] ^ static_cast<char>(1 + rng() % 255));
      attempt(b);
    }
    EXPECT_GT(failures, good.size() / 4);
    EXPECT_GT(successes, 0u);
  }
};

static void survives_byte_flips_of_torch_file() {
  Fuzzer fz;
  fz.flip_each_byte(slurp(torch_files() + "/nested.pth"));  // data descriptors, BUILD, nesting
}

// Every truncation and every single-byte corruption of a small file either reads or fails with
// wan::Error; built with -DWAN_SANITIZE=ON this also shows that no read leaves the file.
TEST(Pth, SurvivesEveryTruncationAndByteFlip) {
  const std::string src = tmp("fuzz_src.pth");
  write_random(src, {{"x", DType::F32, {3, 2}}, {"e", DType::F8E5M2, {5}}}, {.force_zip64 = true});
  const std::string good = slurp(src);
  Fuzzer fz;
  for (size_t n = 0; n < good.size(); ++n) fz.attempt(good.substr(0, n));
  EXPECT_EQ(fz.successes, 0u) << "a truncated file opened";
  EXPECT_EQ(fz.failures, good.size());
  fz.flip_each_byte(good);
}

// One test for every torch-made file: under ctest each test is a process, and each process
// would otherwise pay for its own torch.save run.
TEST(Pth, ReadsTorchSavedFiles) {
  REQUIRE_TORCH_FILES();
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  {
    SCOPED_TRACE("mixed dtypes and views");
    reads_torch_saved_files_identically();
  }
  {
    SCOPED_TRACE("nested dicts");
    flattens_nested_dicts_and_skips_non_tensors();
  }
  {
    SCOPED_TRACE("other zip writers");
    reads_archives_from_other_zip_writers();
  }
  {
    SCOPED_TRACE("legacy");
    refuses_legacy_format();
  }
  {
    SCOPED_TRACE("byte flips of a torch-made file");
    survives_byte_flips_of_torch_file();
  }
}

TEST(Pth, FailedWriteLeavesNoFile) {
  const std::string path = tmp("failed.pth");
  std::vector<TensorSpec> specs = {{"ok", DType::F32, {4}}, {"bad", DType::F32, {4}}};
  try {
    write_pth(path, specs, [](const TensorSpec& s, void* dst) {
      if (s.name == "bad") WAN_THROW("fill failed");
      std::memset(dst, 1, s.nbytes());
    });
    ADD_FAILURE() << "write_pth did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'bad'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_THROW(write_pth(path, {{"a", DType::F32, {1}}, {"a", DType::F32, {1}}}, [](const TensorSpec&, void*) {}),
               Error);
  EXPECT_FALSE(fs::exists(path));
}
