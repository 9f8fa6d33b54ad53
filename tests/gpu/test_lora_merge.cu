// The GPU LoRA merge (kernels/lora_merge.h) and the streaming upload's merge path (runtime/load_gpu.h
// LoadTarget::merge, models/weights_gpu.h apply_weight_merges):
// (a) the kernel equals a plain CPU loop written in the documented order (per term Σ_r with separate
//     multiply and add, delta = Σ scale·term + Σ scale·diff, w + delta) bit for bit, for f32 / bf16 /
//     f16 factors, ranks that are not multiples of the 16-rank slice, shapes that are not multiples of
//     the 64 x 64 tile, several stacked terms and full deltas, a bias (one row);
// (b) a bf16 tensor streamed from a file with a merge hook, through 64-byte chunks (a tensor spans many
//     chunks, which arrive in any order) and several readers, lands as round_bf16(f32(w) + delta),
//     bit for bit, next to an unmerged tensor that is untouched; the same through the getter fallback;
// (c) apply_weight_merges on weights already on the device (the random-weights path) likewise.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "../cpu/test_util.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "formats/safetensors.h"
#include "gpu_test_util.h"
#include "kernels/check.h"
#include "kernels/lora_merge.h"
#include "models/weights_gpu.h"
#include "runtime/load_gpu.h"

using namespace wan;
using namespace wan::gpu_test;
namespace fs = std::filesystem;

namespace {

struct HostTerm {
  std::vector<float> up, down;  // f32 values (already representable in `dtype`)
  int rank = 0;
  float scale = 1;
  DType dtype = DType::F32;
};
struct HostDiff {
  std::vector<float> d;
  float scale = 1;
  DType dtype = DType::F32;
};

std::vector<float> rand_vals(std::mt19937& g, size_t n, float sd, DType t) {
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<float> v(n);
  for (float& x : v) {
    x = nd(g);
    if (t != DType::F32) {  // representable in the stored dtype
      uint16_t b = 0;
      convert_from_f32(t, &x, &b, 1);
      convert_to_f32(t, &b, &x, 1);
    }
  }
  return v;
}

// The documented order, on the host (this test file is built without contraction as the engine).
void cpu_merge(std::vector<float>& w, int64_t rows, int64_t cols, const std::vector<HostTerm>& terms,
               const std::vector<HostDiff>& diffs) {
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t i = 0; i < cols; ++i) {
      float delta = 0.0f;
      for (const HostTerm& t : terms) {
        float s = 0.0f;
        for (int r = 0; r < t.rank; ++r) {
          const float p = t.up[static_cast<size_t>(o * t.rank + r)] * t.down[static_cast<size_t>(r * cols + i)];
          s = s + p;
        }
        const float ds = t.scale * s;
        delta = delta + ds;
      }
      for (const HostDiff& d : diffs) {
        const float x = d.scale * d.d[static_cast<size_t>(o * cols + i)];
        delta = delta + x;
      }
      float& wv = w[static_cast<size_t>(o * cols + i)];
      wv = wv + delta;
    }
}

// Device copy of f32 values stored as `t`.
struct DevStored {
  void* p = nullptr;
  DevStored(const std::vector<float>& v, DType t) {
    const size_t bytes = v.size() * dtype_size(t);
    std::vector<uint8_t> b(bytes);
    if (t == DType::F32) std::memcpy(b.data(), v.data(), bytes);
    else convert_from_f32(t, v.data(), b.data(), v.size());
    CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
    CUDA_CHECK(cudaMemcpy(p, b.data(), bytes, cudaMemcpyHostToDevice));
  }
  ~DevStored() { cudaFree(p); }
  DevStored(const DevStored&) = delete;
};

// Runs the kernel on w (stored as `wdt`: F32, or BF16 holding w0 rounded) with the host terms; returns
// the device result widened to f32.
std::vector<float> gpu_merge(const std::vector<float>& w0, int64_t rows, int64_t cols,
                             const std::vector<HostTerm>& terms, const std::vector<HostDiff>& diffs,
                             DType wdt = DType::F32) {
  std::vector<std::unique_ptr<DevStored>> keep;
  std::vector<cuda::LoraTermDev> dt;
  std::vector<cuda::DiffTermDev> dd;
  for (const HostTerm& t : terms) {
    keep.push_back(std::make_unique<DevStored>(t.up, t.dtype));
    keep.push_back(std::make_unique<DevStored>(t.down, t.dtype));
    dt.push_back({keep[keep.size() - 2]->p, keep.back()->p, t.dtype, t.dtype, t.rank, t.scale});
  }
  for (const HostDiff& d : diffs) {
    keep.push_back(std::make_unique<DevStored>(d.d, d.dtype));
    dd.push_back({keep.back()->p, d.dtype, d.scale});
  }
  if (wdt == DType::BF16) {
    std::vector<uint16_t> b(w0.size());
    convert_from_f32(DType::BF16, w0.data(), b.data(), b.size());
    DevBuf<uint16_t> w(b.size());
    w.upload(b);
    cuda::lora_merge(w.p, DType::BF16, rows, cols, dt.data(), static_cast<int>(dt.size()), dd.data(),
                     static_cast<int>(dd.size()), nullptr);
    const std::vector<uint16_t> got = w.download();
    std::vector<float> out(got.size());
    for (size_t i = 0; i < got.size(); ++i) out[i] = bf16_to_f32(got[i]);
    return out;
  }
  DevBuf<float> w(w0.size());
  w.upload(w0);
  cuda::lora_merge_f32(w.p, rows, cols, dt.data(), static_cast<int>(dt.size()), dd.data(),
                       static_cast<int>(dd.size()), nullptr);
  return w.download();
}

void expect_bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  size_t bad = 0, first = a.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0) {
      if (!bad) first = i;
      ++bad;
    }
  EXPECT_EQ(bad, 0u) << "first difference at " << first << ": " << (first < a.size() ? a[first] : 0) << " vs "
                     << (first < b.size() ? b[first] : 0);
}

}  // namespace

TEST(LoraMerge, KernelEqualsTheDocumentedCpuOrderBitForBit) {
  REQUIRE_GPU();
  std::mt19937 g(7);
  struct Case {
    int64_t rows, cols;
    std::vector<int> ranks;
    DType dt;
    int diffs;
  };
  const Case cases[] = {{64, 64, {16}, DType::F32, 0},    {130, 77, {5}, DType::BF16, 0},
                        {200, 300, {64, 3}, DType::F16, 1}, {1, 333, {}, DType::F32, 2},
                        {97, 129, {33}, DType::BF16, 1},    {256, 96, {1, 2, 4, 8}, DType::F32, 0}};
  for (const Case& c : cases) {
    std::vector<float> w = rand_vals(g, static_cast<size_t>(c.rows * c.cols), 0.05f, DType::F32);
    std::vector<HostTerm> terms;
    for (int r : c.ranks) {
      HostTerm t;
      t.rank = r;
      t.dtype = c.dt;
      t.scale = 0.25f + 0.5f * static_cast<float>(terms.size());
      t.up = rand_vals(g, static_cast<size_t>(c.rows * r), 0.1f, c.dt);
      t.down = rand_vals(g, static_cast<size_t>(r * c.cols), 0.1f, c.dt);
      terms.push_back(std::move(t));
    }
    std::vector<HostDiff> diffs;
    for (int k = 0; k < c.diffs; ++k) diffs.push_back({rand_vals(g, w.size(), 0.01f, c.dt), 0.7f, c.dt});
    const std::vector<float> got = gpu_merge(w, c.rows, c.cols, terms, diffs);
    std::vector<float> want = w;
    cpu_merge(want, c.rows, c.cols, terms, diffs);
    SCOPED_TRACE(testing::Message() << c.rows << "x" << c.cols << " " << dtype_name(c.dt));
    expect_bits_equal(got, want);
    // the merge changed the weight (a no-op kernel would pass the equality for empty terms only)
    EXPECT_NE(std::memcmp(got.data(), w.data(), w.size() * 4), 0);
    // In place on a bf16 weight: the widened weight merged as above, rounded once.
    std::vector<uint16_t> wb(w.size()), wantb(w.size());
    convert_from_f32(DType::BF16, w.data(), wb.data(), w.size());
    std::vector<float> w16(w.size());
    for (size_t i = 0; i < w.size(); ++i) w16[i] = bf16_to_f32(wb[i]);
    std::vector<float> want16 = w16;
    cpu_merge(want16, c.rows, c.cols, terms, diffs);
    convert_from_f32(DType::BF16, want16.data(), wantb.data(), w.size());
    for (size_t i = 0; i < w.size(); ++i) want16[i] = bf16_to_f32(wantb[i]);
    expect_bits_equal(gpu_merge(w16, c.rows, c.cols, terms, diffs, DType::BF16), want16);
  }
}

TEST(LoraMerge, RefusesTooManyTermsAndBadDtypes) {
  REQUIRE_GPU();
  DevBuf<float> w(16);
  std::vector<cuda::LoraTermDev> many(cuda::kMaxLoraTerms + 1, {w.p, w.p, DType::F32, DType::F32, 1, 1.f});
  EXPECT_THROW(cuda::lora_merge_f32(w.p, 4, 4, many.data(), static_cast<int>(many.size()), nullptr, 0, nullptr),
               Error);
  cuda::LoraTermDev bad{w.p, w.p, DType::F8E4M3, DType::F32, 1, 1.f};
  EXPECT_THROW(cuda::lora_merge_f32(w.p, 4, 4, &bad, 1, nullptr, 0, nullptr), Error);
  cuda::LoraTermDev good{w.p, w.p, DType::F32, DType::F32, 1, 1.f};
  EXPECT_THROW(cuda::lora_merge(w.p, DType::F16, 4, 4, &good, 1, nullptr, 0, nullptr), Error);
}

// (b) + (c): a file of two bf16 tensors; one merged on the way in.
TEST(LoraMerge, StreamedAndFallbackAndDrawnWeightsMergeBeforeTheirOneRounding) {
  REQUIRE_GPU();
  test::TempDir dir("lora_merge_load");
  std::mt19937 g(11);
  const int64_t rows = 96, cols = 80, rank = 7;
  const std::vector<float> wa = rand_vals(g, static_cast<size_t>(rows * cols), 0.05f, DType::BF16);
  const std::vector<float> wb = rand_vals(g, static_cast<size_t>(rows * cols), 0.05f, DType::BF16);
  auto bf16_tensor = [&](const std::vector<float>& v) {
    Tensor t = Tensor::f32(Shape{rows, cols});
    std::memcpy(t.data(), v.data(), v.size() * 4);
    return t.to(DType::BF16);
  };
  const Tensor ta = bf16_tensor(wa), tb = bf16_tensor(wb);
  const std::string file = dir / "w.safetensors";
  write_safetensors(file, {{"a", ta}, {"b", tb}});
  const std::shared_ptr<SafetensorsFile> st = SafetensorsFile::open(file);

  HostTerm term;
  term.rank = static_cast<int>(rank);
  term.scale = 1.5f;
  term.up = rand_vals(g, static_cast<size_t>(rows * rank), 0.2f, DType::F32);
  term.down = rand_vals(g, static_cast<size_t>(rank * cols), 0.2f, DType::F32);
  DevStored up(term.up, DType::F32), down(term.down, DType::F32);
  const cuda::WeightMerge hook = [&](void* w, DType dt, cudaStream_t s) {
    cuda::LoraTermDev t{up.p, down.p, DType::F32, DType::F32, static_cast<int>(rank), term.scale};
    cuda::lora_merge(w, dt, rows, cols, &t, 1, nullptr, 0, s);
  };
  std::vector<float> want_a = wa;
  cpu_merge(want_a, rows, cols, {term}, {});
  std::vector<uint16_t> want_a_bf16(want_a.size());
  convert_from_f32(DType::BF16, want_a.data(), want_a_bf16.data(), want_a.size());

  for (int path = 0; path < 2; ++path) {  // 0: streamed in 64-byte chunks, 1: through the getter
    SCOPED_TRACE(path == 0 ? "streamed" : "fallback");
    DevBuf<uint16_t> da(static_cast<size_t>(rows * cols)), db(static_cast<size_t>(rows * cols));
    da.poison();
    db.poison();
    std::vector<cuda::LoadTarget> ts(2);
    const char* names[] = {"a", "b"};
    void* dsts[] = {da.p, db.p};
    for (int k = 0; k < 2; ++k) {
      ts[k].name = names[k];
      ts[k].shape = Shape{rows, cols};
      ts[k].dtype = DType::BF16;
      ts[k].dst = dsts[k];
      const TensorInfo& info = *st->find(names[k]);
      if (path == 0) ts[k].span = RawSpan{file, st->data_start() + info.begin, info.end - info.begin, DType::BF16,
                                         Shape{rows, cols}, false, 1.0f};
      else ts[k].fallback = [st, n = std::string(names[k])] { return st->get(n); };
    }
    ts[0].merge = [&](float* w, cudaStream_t s) { hook(w, DType::F32, s); };
    cuda::LoadOptions o;
    o.buffer_bytes = 64;
    o.buffers = 6;
    o.threads = 3;
    cuda::load_to_device(ts, o);
    const std::vector<uint16_t> got_a = da.download(), got_b = db.download();
    EXPECT_EQ(0, std::memcmp(got_a.data(), want_a_bf16.data(), got_a.size() * 2));
    EXPECT_EQ(0, std::memcmp(got_b.data(), tb.data(), got_b.size() * 2));  // untouched
  }

  // (c) on the device already (random draws): apply_weight_merges widens, merges, rounds back.
  WeightTable rows_table;
  WeightSpec spec;
  spec.name = "a";
  spec.shape = Shape{rows, cols};
  spec.device_dtype = DType::BF16;
  rows_table.push_back(spec);
  const cuda::dit_gpu_detail::DeviceTable table = cuda::dit_gpu_detail::place_weights(rows_table);
  DevBuf<uint8_t> dev(table.bytes);
  CUDA_CHECK(cudaMemcpy(dev.p + table.at("a").offset, ta.data(), static_cast<size_t>(rows * cols) * 2,
                        cudaMemcpyHostToDevice));
  const int merged = cuda::dit_gpu_detail::apply_weight_merges(
      table, dev.p, [&](const std::string& n) { return n == "a" ? hook : cuda::WeightMerge(); }, nullptr);
  EXPECT_EQ(merged, 1);
  std::vector<uint16_t> got(static_cast<size_t>(rows * cols));
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(got.data(), dev.p + table.at("a").offset, got.size() * 2, cudaMemcpyDeviceToHost));
  EXPECT_EQ(0, std::memcmp(got.data(), want_a_bf16.data(), got.size() * 2));
}
