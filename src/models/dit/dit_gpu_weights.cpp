// The GPU DiT's view of an expert's weight allocation: the device pointers of every tensor the forward
// reads (resolve), the DiT weight table with the FP8 storage choice, and the sharded-load ranges.
// Invariant: fused GEMMs (q|k|v, cross k|v) read consecutive weights, biases and (e4m3) row scales; resolve
// checks it on the table rather than trusting the placement.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "models/dit/dit_gpu.h"
#include "models/dit/dit_gpu_geometry.h"
#include "models/dit/weights.h"
#include "models/weights_gpu.h"

namespace wan::cuda {
namespace dit_gpu_detail {

DeviceTable build_weight_table(const DiTConfig& c, DiTGemm gemm) {
  check_config(c);
  WeightTable rows = dit_weight_table(c);
  // FP8: the blocks' GEMM weights (q, k, v, o of both attentions, ffn.0, ffn.2) as e4m3 rows.
  if (gemm == DiTGemm::Fp8)
    for (WeightSpec& w : rows)
      if (w.cls == WeightClass::GemmWeight && w.name.rfind("blocks.", 0) == 0) w.device_dtype = DType::F8E4M3;
  return place_weights(rows);
}

ExpertPtrs resolve(const DeviceTable& t, const void* base, int layers) {
  auto at = [&](const std::string& n) { return static_cast<const char*>(base) + t.at(n).offset; };
  auto b = [&](const std::string& n) { return reinterpret_cast<const bf16*>(at(n)); };
  auto f = [&](const std::string& n) { return reinterpret_cast<const float*>(at(n)); };
  auto sc = [&](const std::string& n) -> const float* {
    const DeviceEntry& e = t.at(n);
    return e.fp8() ? reinterpret_cast<const float*>(static_cast<const char*>(base) + e.scale_offset) : nullptr;
  };
  // b of `next` follows a, `times` entries of a's size later (weights and, for e4m3, their scales).
  auto follows = [&](const std::string& a, const std::string& next, int times) {
    const DeviceEntry &ea = t.at(a), &en = t.at(next);
    const bool data = en.offset == ea.offset + static_cast<size_t>(times) * ea.bytes;
    const bool scales = ea.fp8() == en.fp8() &&
                        (!ea.fp8() || en.scale_offset == ea.scale_offset + static_cast<size_t>(times * ea.rows()) * 4);
    return data && scales;
  };
  ExpertPtrs e;
  e.pe_w = b("patch_embedding.weight"), e.pe_b = b("patch_embedding.bias");
  e.te0_w = b("text_embedding.0.weight"), e.te0_b = b("text_embedding.0.bias");
  e.te2_w = b("text_embedding.2.weight"), e.te2_b = b("text_embedding.2.bias");
  e.time = {f("time_embedding.0.weight"), f("time_embedding.0.bias"), f("time_embedding.2.weight"),
            f("time_embedding.2.bias"),      f("time_projection.1.weight"), f("time_projection.1.bias")};
  for (int i = 0; i < layers; ++i) {
    const std::string p = cat("blocks.", i, ".");
    BlockPtrs k;
    k.mod = f(p + "modulation");
    k.qkv_w = b(p + "self_attn.q.weight"), k.qkv_b = b(p + "self_attn.q.bias");
    k.o_w = b(p + "self_attn.o.weight"), k.o_b = b(p + "self_attn.o.bias");
    k.nq = b(p + "self_attn.norm_q.weight"), k.nk = b(p + "self_attn.norm_k.weight");
    k.n3w = f(p + "norm3.weight"), k.n3b = f(p + "norm3.bias");
    k.cq_w = b(p + "cross_attn.q.weight"), k.cq_b = b(p + "cross_attn.q.bias");
    k.ckv_w = b(p + "cross_attn.k.weight"), k.ckv_b = b(p + "cross_attn.k.bias");
    k.co_w = b(p + "cross_attn.o.weight"), k.co_b = b(p + "cross_attn.o.bias");
    k.cnq = b(p + "cross_attn.norm_q.weight"), k.cnk = b(p + "cross_attn.norm_k.weight");
    k.f0_w = b(p + "ffn.0.weight"), k.f0_b = b(p + "ffn.0.bias");
    k.f2_w = b(p + "ffn.2.weight"), k.f2_b = b(p + "ffn.2.bias");
    k.qkv_s = sc(p + "self_attn.q.weight"), k.o_s = sc(p + "self_attn.o.weight");
    k.cq_s = sc(p + "cross_attn.q.weight"), k.ckv_s = sc(p + "cross_attn.k.weight");
    k.co_s = sc(p + "cross_attn.o.weight"), k.f0_s = sc(p + "ffn.0.weight"), k.f2_s = sc(p + "ffn.2.weight");
    // The fused GEMMs rely on the table's placement (weights_gpu.h).
    const std::string sa = p + "self_attn.", ca = p + "cross_attn.";
    WAN_ASSERT(follows(sa + "q.weight", sa + "k.weight", 1) && follows(sa + "q.weight", sa + "v.weight", 2) &&
                   follows(sa + "q.bias", sa + "v.bias", 2) && follows(ca + "k.weight", ca + "v.weight", 1) &&
                   follows(ca + "k.bias", ca + "v.bias", 1),
               "fused q|k|v / k|v weights are not contiguous");
    e.blocks.push_back(k);
  }
  e.hmod = f("head.modulation"), e.head_w = f("head.head.weight"), e.head_b = f("head.head.bias");
  return e;
}

}  // namespace dit_gpu_detail

std::vector<std::pair<size_t, size_t>> DiTGpu::weight_ranges(const DiTConfig& cfg, size_t* total_bytes, Gemm gemm) {
  const dit_gpu_detail::DeviceTable table = dit_gpu_detail::build_weight_table(cfg, gemm);
  // Each tensor's extent (its scales included), then overlapping extents merged: an e4m3 fusion group's
  // first extent runs over its other weights to the scales behind them.
  std::vector<std::pair<size_t, size_t>> spans;  // [begin, end)
  spans.reserve(table.entries.size());
  for (const dit_gpu_detail::DeviceEntry& e : table.entries) {
    size_t end = e.offset + e.bytes;
    if (e.fp8()) end = std::max(end, e.scale_offset + static_cast<size_t>(e.rows()) * 4);
    spans.emplace_back(e.offset, end);
  }
  std::sort(spans.begin(), spans.end());
  std::vector<std::pair<size_t, size_t>> ranges;
  for (const auto& [b, e] : spans) {
    if (!ranges.empty() && b < ranges.back().first + ranges.back().second) {
      ranges.back().second = std::max(ranges.back().first + ranges.back().second, e) - ranges.back().first;
      continue;
    }
    ranges.emplace_back(b, e - b);
  }
  if (total_bytes) *total_bytes = table.bytes;
  return ranges;
}

DiTGpu::Gemm DiTGpu::parse_gemm(const std::string& s) {
  if (s == "bf16") return Gemm::Bf16;
  if (s == "fp8") return Gemm::Fp8;
  WAN_THROW("--gemm: expected bf16 or fp8, got '", s, "'");
}

}  // namespace wan::cuda
