// The GPU DiT's weight allocation: table of official tensors (dtype, shape, placement), host upload,
// random draw on the GPU, download. See weights_gpu.h for the layout rules.
#include "models/weights_gpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/affine.h"
#include "kernels/check.h"
#include "kernels/fp8_quant.h"
#include "kernels/rng.h"
#include "ops/fp8_ref.h"
#include "runtime/load_gpu.h"

namespace wan::cuda {
namespace dit_gpu_detail {

namespace {

constexpr size_t kStagingFloats = size_t{8} << 20;  // host bf16 conversion chunk (16 MB)

}  // namespace

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

DeviceTable place_weights(const WeightTable& rows) {
  DeviceTable t;
  auto put = [&](const WeightSpec& w, size_t at) {
    DeviceEntry e;
    e.name = w.name;
    e.dtype = w.device_dtype;
    e.shape = w.shape;
    e.offset = at;
    e.bytes = static_cast<size_t>(w.shape.numel()) * dtype_size(w.device_dtype);
    const NormalDraw d = normal_draw(w.init);
    e.scale = d.scale;
    e.offset_value = d.offset;
    WAN_ASSERT(!t.index.count(w.name), "duplicate weight ", w.name);
    WAN_ASSERT(!e.fp8() || w.shape.ndim == 2, "fp8 weight ", w.name, " is not a matrix");
    t.index[w.name] = t.entries.size();
    t.entries.push_back(e);
    t.bytes = at + e.bytes;
  };
  std::vector<bool> placed(rows.size(), false);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (placed[i]) continue;
    const size_t first = t.entries.size();
    put(rows[i], align_up(t.bytes, kGroupAlign));
    for (size_t j = i + 1; j < rows.size() && !rows[i].fused.empty(); ++j) {
      if (rows[j].fused != rows[i].fused) continue;
      WAN_ASSERT(t.bytes % 16 == 0, "weight ", rows[j].name, " would start unaligned at byte ", t.bytes);
      put(rows[j], t.bytes);
      placed[j] = true;
    }
    // e4m3 rows: the group's scales back to back after its data (one GEMM reads them as one vector)
    if (t.entries[first].fp8()) t.bytes = align_up(t.bytes, 16);
    for (size_t k = first; k < t.entries.size(); ++k) {
      DeviceEntry& e = t.entries[k];
      if (!e.fp8()) continue;
      WAN_ASSERT(t.bytes % 16 == 0, "scales of weight ", e.name, " would start unaligned at byte ", t.bytes);
      e.scale_offset = t.bytes;
      t.bytes += static_cast<size_t>(e.rows()) * 4;
    }
  }
  t.bytes = align_up(t.bytes, kGroupAlign);
  return t;
}

const DeviceEntry& DeviceTable::at(const std::string& name) const {
  auto it = index.find(name);
  WAN_CHECK(it != index.end(), "DiT GPU weights: no tensor named '", name, "'");
  return entries[it->second];
}

void upload_weights(const DeviceTable& table, void* dev, const WeightGetter& get, const char* what,
                    const WeightSpanFn& span, DeviceLoader* loader, int group, const WeightMergeFn& merge) {
  WAN_CHECK(static_cast<bool>(get), what, " GPU weights: no weight callback");
  if (span || loader || merge) {  // streaming (load_gpu.h)
    std::vector<LoadTarget> targets = weight_targets(table, dev, get, what, span, group, merge);
    if (loader) {
      for (LoadTarget& t : targets) loader->add(std::move(t));
      return;
    }
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    load_to_device(std::move(targets), LoadOptions::tuned(device));
    return;
  }
  std::vector<uint16_t> staging;
  for (const DeviceEntry& e : table.entries) {
    Tensor t;
    WAN_WITH_CONTEXT(cat(what, " weight ", e.name), t = get(e.name));
    WAN_CHECK(t.defined(), what, " weight ", e.name, ": missing");
    WAN_CHECK(t.shape() == e.shape, what, " weight ", e.name, ": shape ", t.shape().str(), ", expected ",
              e.shape.str());
    WAN_CHECK(dtype_is_float(t.dtype()), what, " weight ", e.name, ": dtype ", dtype_name(t.dtype()),
              " is not a float type");
    char* dst = static_cast<char*>(dev) + e.offset;
    if (e.fp8()) {  // rows quantised on the host, as the streamed path's GPU quantiser does bit for bit
      const Tensor f = t.to_f32();
      std::vector<uint8_t> q(e.bytes);
      std::vector<float> sc(static_cast<size_t>(e.rows()));
      ops::quantize_rows_fp8(f.f32(), e.rows(), e.cols(), q.data(), sc.data());
      CUDA_CHECK(cudaMemcpy(dst, q.data(), q.size(), cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(static_cast<char*>(dev) + e.scale_offset, sc.data(), sc.size() * 4,
                            cudaMemcpyHostToDevice));
      continue;
    }
    if (t.dtype() == e.dtype && t.view().is_contiguous()) {
      CUDA_CHECK(cudaMemcpy(dst, t.data(), e.bytes, cudaMemcpyHostToDevice));
      continue;
    }
    Tensor f = (t.dtype() == DType::F32 && t.view().is_contiguous()) ? t : t.to_f32();
    t = Tensor();
    if (e.dtype == DType::F32) {
      CUDA_CHECK(cudaMemcpy(dst, f.data(), e.bytes, cudaMemcpyHostToDevice));
      continue;
    }
    const size_t n = static_cast<size_t>(f.numel());
    staging.resize(std::min(n, kStagingFloats));
    for (size_t i0 = 0; i0 < n; i0 += kStagingFloats) {
      const size_t m = std::min(kStagingFloats, n - i0);
      convert_from_f32(DType::BF16, f.f32() + i0, staging.data(), m);
      CUDA_CHECK(cudaMemcpy(dst + i0 * 2, staging.data(), m * 2, cudaMemcpyHostToDevice));
    }
  }
}

std::vector<LoadTarget> weight_targets(const DeviceTable& table, void* dev, const WeightGetter& get, const char* what,
                                       const WeightSpanFn& span, int group, const WeightMergeFn& merge) {
  std::vector<LoadTarget> targets;
  targets.reserve(table.entries.size());
  for (const DeviceEntry& e : table.entries) {
    LoadTarget t;
    t.name = cat(what, " weight ", e.name);
    if (span) WAN_WITH_CONTEXT(t.name, t.span = span(e.name));
    if (!t.span) t.fallback = [get, name = e.name] { return get(name); };
    t.dst = static_cast<char*>(dev) + e.offset;
    t.dtype = e.dtype;
    if (e.fp8()) t.scale_dst = reinterpret_cast<float*>(static_cast<char*>(dev) + e.scale_offset);
    t.shape = e.shape;
    t.group = group;
    if (merge)
      if (WeightMerge m = merge(e.name)) t.merge = [m](float* work, cudaStream_t s) { m(work, DType::F32, s); };
    targets.push_back(std::move(t));
  }
  return targets;
}

size_t max_small_floats(const DeviceTable& table) {
  size_t m = 0;
  for (const DeviceEntry& e : table.entries)
    if (e.dtype == DType::BF16 && e.offset_value != 0.0f) m = std::max(m, static_cast<size_t>(e.shape.numel()));
    else if (e.fp8()) m = std::max(m, static_cast<size_t>(e.cols()));
  return m;
}

namespace {

// An e4m3 tensor: its fp32 draw n·scale + offset (draw_random_weight's values), merged when `m` is
// given (whole tensor), quantised by rows; without a merge in chunks of whole rows through the scratch.
void draw_fp8(const DeviceEntry& e, void* dev, uint64_t key, const WeightMerge& m, float* scratch,
              size_t scratch_floats, cudaStream_t stream) {
  auto* q = static_cast<uint8_t*>(dev) + e.offset;
  auto* sc = reinterpret_cast<float*>(static_cast<char*>(dev) + e.scale_offset);
  const int64_t R = e.rows(), K = e.cols();
  if (m) {
    float* work = nullptr;
    CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&work), static_cast<size_t>(R * K) * 4, stream));
    philox_normal_fill(work, static_cast<size_t>(R * K), key, 0, stream);
    affine_f32(work, R * K, e.scale, e.offset_value, stream);
    m(work, DType::F32, stream);
    quantize_rows_fp8(work, R, K, q, sc, stream);
    CUDA_CHECK(cudaFreeAsync(work, stream));
    return;
  }
  const int64_t chunk = static_cast<int64_t>(scratch_floats) / K;
  WAN_ASSERT(chunk >= 1, "random weight scratch too small for a row of ", e.name);
  for (int64_t r0 = 0; r0 < R; r0 += chunk) {
    const int64_t r = std::min(chunk, R - r0);
    philox_normal_fill(scratch, static_cast<size_t>(r * K), key, static_cast<uint64_t>(r0 * K), stream);
    affine_f32(scratch, r * K, e.scale, e.offset_value, stream);
    quantize_rows_fp8(scratch, r, K, q + r0 * K, sc + r0, stream);
  }
}

}  // namespace

void draw_random_weights(const DeviceTable& table, void* dev, uint64_t seed, float* scratch, size_t scratch_floats,
                         cudaStream_t stream, const WeightMergeFn& merge) {
  for (const DeviceEntry& e : table.entries) {
    const uint64_t s = random_weight_key(seed, e.name);
    const int64_t n = e.shape.numel();
    void* p = static_cast<char*>(dev) + e.offset;
    if (e.fp8()) {
      draw_fp8(e, dev, s, merge ? merge(e.name) : WeightMerge(), scratch, scratch_floats, stream);
    } else if (e.dtype == DType::F32) {
      philox_normal_fill(static_cast<float*>(p), static_cast<size_t>(n), s, 0, stream);
      affine_f32(static_cast<float*>(p), n, e.scale, e.offset_value, stream);
    } else if (e.offset_value == 0.0f) {
      philox_normal_fill_bf16(static_cast<uint16_t*>(p), static_cast<size_t>(n), s, 0, e.scale, stream);
    } else {
      WAN_ASSERT(static_cast<size_t>(n) <= scratch_floats, "random weight scratch too small for ", e.name);
      philox_normal_fill(scratch, static_cast<size_t>(n), s, 0, stream);
      affine_f32_to_bf16(scratch, static_cast<__nv_bfloat16*>(p), n, e.scale, e.offset_value, stream);
    }
  }
}

Tensor download_weight(const DeviceTable& table, const void* dev, const std::string& name) {
  const DeviceEntry& e = table.at(name);
  Tensor out = Tensor::empty(DType::F32, e.shape);
  if (e.fp8()) {
    std::vector<uint8_t> q(e.bytes);
    std::vector<float> sc(static_cast<size_t>(e.rows()));
    CUDA_CHECK(cudaMemcpy(q.data(), static_cast<const char*>(dev) + e.offset, e.bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(sc.data(), static_cast<const char*>(dev) + e.scale_offset, sc.size() * 4,
                          cudaMemcpyDeviceToHost));
    ops::dequantize_rows_fp8(q.data(), sc.data(), e.rows(), e.cols(), out.f32());
  } else if (e.dtype == DType::F32) {
    CUDA_CHECK(cudaMemcpy(out.data(), static_cast<const char*>(dev) + e.offset, e.bytes, cudaMemcpyDeviceToHost));
  } else {
    std::vector<uint16_t> h(static_cast<size_t>(e.shape.numel()));
    CUDA_CHECK(cudaMemcpy(h.data(), static_cast<const char*>(dev) + e.offset, e.bytes, cudaMemcpyDeviceToHost));
    convert_to_f32(DType::BF16, h.data(), out.f32(), h.size());
  }
  return out;
}

int apply_weight_merges(const DeviceTable& table, void* dev, const WeightMergeFn& merge, cudaStream_t stream) {
  if (!merge) return 0;
  int merged = 0;
  for (const DeviceEntry& e : table.entries) {
    if (e.fp8()) continue;  // merged inside draw_random_weights, before the quantisation
    const WeightMerge m = merge(e.name);
    if (!m) continue;
    const int64_t n = e.shape.numel();
    char* dst = static_cast<char*>(dev) + e.offset;
    ++merged;
    if (e.dtype == DType::F32 || e.dtype == DType::BF16) {
      m(dst, e.dtype, stream);
      continue;
    }
    void* work = nullptr;
    CUDA_CHECK(cudaMallocAsync(&work, static_cast<size_t>(n) * 4, stream));
    convert_weights(dst, e.dtype, false, 1.0f, work, DType::F32, n, stream);
    m(work, DType::F32, stream);
    convert_weights(work, DType::F32, false, 1.0f, dst, e.dtype, n, stream);
    CUDA_CHECK(cudaFreeAsync(work, stream));
  }
  return merged;
}

}  // namespace dit_gpu_detail
}  // namespace wan::cuda
