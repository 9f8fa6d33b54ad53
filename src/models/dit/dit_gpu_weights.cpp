// The GPU DiT's view of an expert's weight allocation: the device pointers of every tensor the forward
// reads (resolve), the DiT weight table with the FP8 storage choice, and the sharded-load ranges.
// Invariant: fused GEMMs (q|k|v, cross k|v) read consecutive weights, biases and (e4m3) row scales; resolve
// checks it on the table rather than trusting the placement.
#include <algorithm>
#include <cstdint>
#include <functional>
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
  const char* b = static_cast<const char*>(base);
  return resolve(t, [b](size_t offset) { return b + offset; }, layers);
}

ExpertPtrs resolve(const DeviceTable& t, const std::function<const char*(size_t offset)>& addr, int layers) {
  auto at = [&](const std::string& n) { return addr(t.at(n).offset); };
  auto b = [&](const std::string& n) { return reinterpret_cast<const bf16*>(at(n)); };
  auto f = [&](const std::string& n) { return reinterpret_cast<const float*>(at(n)); };
  auto sc = [&](const std::string& n) -> const float* {
    const DeviceEntry& e = t.at(n);
    return e.fp8() ? reinterpret_cast<const float*>(addr(e.scale_offset)) : nullptr;
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

BlockLayout block_layout(const DeviceTable& t, int layers) {
  BlockLayout l;
  l.blocks.assign(static_cast<size_t>(layers), {SIZE_MAX, 0});
  for (const DeviceEntry& e : t.entries) {
    if (e.name.rfind("blocks.", 0) != 0) continue;
    const int i = std::stoi(e.name.substr(7));
    WAN_ASSERT(i >= 0 && i < layers, "block layout: ", e.name, " outside ", layers, " blocks");
    auto& [b, end] = l.blocks[static_cast<size_t>(i)];
    b = std::min(b, e.offset);
    end = std::max(end, e.end());
  }
  for (size_t i = 0; i < l.blocks.size(); ++i) {
    const auto& [b, e] = l.blocks[i];
    WAN_ASSERT(e > b && b % kGroupAlign == 0 && (i == 0 || b >= l.blocks[i - 1].second),
               "block layout: block ", i, " is not one aligned range after the previous one");
    l.max_block = std::max(l.max_block, e - b);
  }
  l.begin = l.blocks.empty() ? 0 : l.blocks.front().first;
  l.end = l.blocks.empty() ? 0 : l.blocks.back().second;
  for (const DeviceEntry& e : t.entries)
    WAN_ASSERT(e.name.rfind("blocks.", 0) == 0 || e.end() <= l.begin || e.offset >= l.end,
               "block layout: ", e.name, " lies among the blocks");
  return l;
}

DeviceTable sub_table(const DeviceTable& t, const std::vector<std::tuple<size_t, size_t, size_t>>& ranges) {
  DeviceTable s;
  for (const auto& [b, e, to] : ranges) {
    for (const DeviceEntry& d : t.entries) {
      if (d.offset < b || d.offset >= e) continue;
      WAN_ASSERT(d.end() <= e, "sub-table: ", d.name, " runs past its range");
      DeviceEntry m = d;
      m.offset = d.offset - b + to;
      if (d.fp8()) m.scale_offset = d.scale_offset - b + to;
      s.index[m.name] = s.entries.size();
      s.entries.push_back(std::move(m));
    }
    s.bytes = std::max(s.bytes, e - b + to);
  }
  return s;
}

}  // namespace dit_gpu_detail

std::vector<std::pair<size_t, size_t>> DiTGpu::weight_ranges(const DiTConfig& cfg, size_t* total_bytes, Gemm gemm) {
  const dit_gpu_detail::DeviceTable table = dit_gpu_detail::build_weight_table(cfg, gemm);
  // Each tensor's extent (its scales included), then overlapping extents merged: an e4m3 fusion group's
  // first extent runs over its other weights to the scales behind them.
  std::vector<std::pair<size_t, size_t>> spans;  // [begin, end)
  spans.reserve(table.entries.size());
  for (const dit_gpu_detail::DeviceEntry& e : table.entries) spans.emplace_back(e.offset, e.end());
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
