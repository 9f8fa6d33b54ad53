// The GPU DiT's memory plan: the geometry of a forward, the attention shapes it runs (which size cuDNN's
// workspace), the arena layout of one (config, shape, layout), its printout, and the fit check that
// names what would fit. Invariant: every size comes from the forward's own Geometry, so the plan and the
// forward never disagree.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/gemm.h"
#include "models/dit/dit_gpu_geometry.h"
#include "models/dit/weights.h"
#include "models/weights_gpu.h"

namespace wan::cuda {
namespace dit_gpu_detail {

void check_config(const DiTConfig& c) {
  WAN_CHECK(c.dim > 0 && c.num_heads > 0 && c.dim % c.num_heads == 0 && c.dim / c.num_heads == 128,
            "DiT GPU: dim ", c.dim, " / heads ", c.num_heads, " must give head_dim 128 (the attention kernel's)");
  WAN_CHECK(c.ffn_dim > 0 && c.ffn_dim % 8 == 0, "DiT GPU: ffn_dim ", c.ffn_dim, " must be a positive multiple of 8");
  WAN_CHECK(c.text_dim > 0 && c.text_dim % 8 == 0, "DiT GPU: text_dim ", c.text_dim, " must be a multiple of 8");
  WAN_CHECK(c.freq_dim > 0 && c.freq_dim % 8 == 0, "DiT GPU: freq_dim ", c.freq_dim, " must be a multiple of 8");
  WAN_CHECK(c.text_len >= 1 && c.num_layers >= 1 && c.in_dim >= 1 && c.out_dim >= 1,
            "DiT GPU: text_len, num_layers, in_dim and out_dim must be positive");
  WAN_CHECK(c.patch[0] >= 1 && c.patch[1] >= 1 && c.patch[2] >= 1, "DiT GPU: bad patch size");
  const int64_t P = static_cast<int64_t>(c.patch[0]) * c.patch[1] * c.patch[2];
  WAN_CHECK(c.in_dim * P % 8 == 0, "DiT GPU: in_dim·patch volume ", c.in_dim * P, " must be a multiple of 8");
  WAN_CHECK(c.eps > 0.0f, "DiT GPU: eps must be positive");
}

Geometry geometry(const DiTConfig& c, const DiTShape& s, const dist::Layout& par) {
  Geometry g{};
  g.B = s.batch, g.C = c.in_dim, g.Co = c.out_dim, g.T = s.frames, g.H = s.height, g.W = s.width;
  g.pt = c.patch[0], g.ph = c.patch[1], g.pw = c.patch[2];
  WAN_CHECK(g.B >= 1 && g.T >= 1 && g.H >= 1 && g.W >= 1, "DiT GPU: bad shape batch ", g.B, ", latent [", g.T, ", ",
            g.H, ", ", g.W, "]");
  WAN_CHECK(g.T % g.pt == 0 && g.H % g.ph == 0 && g.W % g.pw == 0, "DiT GPU: latent [", g.T, ", ", g.H, ", ", g.W,
            "] is not a multiple of the patch (", g.pt, ", ", g.ph, ", ", g.pw, ")");
  g.f = g.T / g.pt, g.gh = g.H / g.ph, g.gw = g.W / g.pw;
  WAN_CHECK(g.f <= kRopeMaxPos && g.gh <= kRopeMaxPos && g.gw <= kRopeMaxPos, "DiT GPU: grid (", g.f, ", ", g.gh,
            ", ", g.gw, ") exceeds the ", kRopeMaxPos, " RoPE positions per axis");
  g.L = g.f * g.gh * g.gw;
  g.rows = g.B * g.L;
  const int64_t P = static_cast<int64_t>(g.pt) * g.ph * g.pw;
  g.K = g.C * P, g.OP = g.Co * P;
  g.D = c.dim, g.F = c.ffn_dim, g.NH = c.num_heads, g.TL = c.text_len, g.TD = c.text_dim, g.FQ = c.freq_dim;
  // Parallel split (spec §8): cfg halves the batch, the sequence is padded to a multiple of U·R tokens.
  g.par = par, g.Bg = g.B, g.S = g.L, g.Lpad = g.L;
  WAN_CHECK(par.cfg == 1 || par.cfg == 2, "DiT GPU: CFG-parallel degree ", par.cfg, " (expected 1 or 2)");
  WAN_CHECK(par.ulysses >= 1 && par.ring >= 1, "DiT GPU: parallel degrees must be >= 1");
  WAN_CHECK(g.Bg % par.cfg == 0, "DiT GPU: CFG-parallel needs an even batch (cond, uncond), got ", g.Bg);
  WAN_CHECK(g.NH % par.ulysses == 0, "DiT GPU: Ulysses degree ", par.ulysses, " does not divide the ", g.NH,
            " heads");
  g.B = g.Bg / par.cfg;
  const SeqSplit sp = seq_split(g.L, par.seq());
  g.Lpad = sp.padded, g.S = sp.per_rank;
  g.rows = g.B * g.S;
  g.one_latent = s.one_latent;
  g.first_frame = s.first_frame_t;
  g.first_tokens = g.gh * g.gw;
  return g;
}

SeqParallelAttention::Geometry spa_geometry(const Geometry& g) {
  SeqParallelAttention::Geometry a;
  a.B = g.B, a.S = g.S, a.L = g.L, a.heads = g.NH, a.U = g.par.ulysses, a.R = g.par.ring;
  return a;
}

// The attentions of one chunk of n rows of one sample (WeightResidency::chunks): q dense [n, D], k and v
// the halves of that sample's [S, 2D] key|value rows; the cross-attention's k and v as cross_attn_shape's.
AttentionShape chunk_self_attn_shape(const Geometry& g, int64_t n) {
  AttentionShape s;
  s.B = 1, s.Lq = n, s.Lk = g.L, s.H = g.NH, s.D = 128;
  s.q_ld = g.D, s.k_ld = s.v_ld = 2 * g.D;
  return s;
}
AttentionShape chunk_cross_attn_shape(const Geometry& g, int64_t n) {
  AttentionShape s;
  s.B = 1, s.Lq = n, s.Lk = g.TL, s.H = g.NH, s.D = 128;
  s.v_ld = 2 * g.D;
  return s;
}
int64_t chunk_rows_of(int64_t S, int chunks) {
  if (chunks <= 1) return 0;
  const int64_t align = S >= 128 * chunks ? 128 : 16;  // whole FP8 Q blocks at real sizes
  const int64_t per = (S + chunks - 1) / chunks;
  return std::min(S, (per + align - 1) / align * align);
}

AttentionShape self_attn_shape(const Geometry& g, bool one_sample) {
  if (g.seq_parallel()) return SeqParallelAttention::attention_shape(spa_geometry(g));
  AttentionShape s;
  s.B = one_sample ? 1 : g.B, s.Lq = g.L, s.Lk = g.L, s.H = g.NH, s.D = 128;
  s.v_ld = 3 * g.D;  // v is the last third of the fused qkv rows, q and k (normed in place) the others
  s.q_ld = s.k_ld = s.v_ld;
  return s;
}
AttentionShape cross_attn_shape(const Geometry& g) {
  AttentionShape s;
  s.B = g.B, s.Lq = g.S, s.Lk = g.TL, s.H = g.NH, s.D = 128;
  s.v_ld = 2 * g.D;  // v is the second half of the fused context kv rows
  return s;
}
std::vector<AttentionShape> attention_shapes(const Geometry& g, bool any_sharing, int64_t chunk_rows) {
  if (chunk_rows > 0) {
    const int64_t C = std::min(chunk_rows, g.S), rem = g.S % C;
    std::vector<AttentionShape> v{chunk_self_attn_shape(g, C), chunk_cross_attn_shape(g, C)};
    if (rem) v.push_back(chunk_self_attn_shape(g, rem)), v.push_back(chunk_cross_attn_shape(g, rem));
    return v;
  }
  std::vector<AttentionShape> v{self_attn_shape(g), cross_attn_shape(g)};
  if (any_sharing ? g.can_share_first() : g.share_first()) v.push_back(self_attn_shape(g, true));
  return v;
}

// Appends buffers to a plan, each at the next kAlign boundary; views alias part of an earlier one.
class PlanBuilder {
 public:
  explicit PlanBuilder(MemoryPlan& p) : p_(p) {}
  size_t add(const std::string& name, size_t bytes) {
    const size_t at = p_.arena_bytes;
    p_.buffers.push_back({name, at, bytes, false});
    p_.arena_bytes = align_up(at + bytes);
    return at;
  }
  void view(const std::string& name, size_t base, size_t rel, size_t bytes) {
    WAN_ASSERT(rel % 16 == 0, "arena view ", name, " unaligned");
    p_.buffers.push_back({name, base + rel, bytes, true});
  }

 private:
  MemoryPlan& p_;
};



std::string gib(size_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f", static_cast<double>(b) / (kMiB * 1024.0));
  return s;
}

void check_fit(const DiTConfig& cfg, const DiTShape& shape, int experts, size_t attn_ws, size_t free_bytes,
               int device, const dist::Layout& par, DiTGemm gemm, WeightResidency res) {
  const MemoryPlan p = DiTGpu::plan(cfg, shape, experts, attn_ws, par, gemm, res);
  if (p.total_bytes() <= free_bytes) return;
  const int64_t pt = cfg.patch[0];
  auto fits = [&](int64_t frames) {
    DiTShape s = shape;
    s.frames = frames;
    return DiTGpu::plan(cfg, s, experts, attn_ws, par, gemm, res).total_bytes() <= free_bytes;
  };
  // Largest multiple of pt below the request that fits (the plan grows with the frames).
  int64_t lo = 0, hi = shape.frames / pt;  // fits(lo·pt) unknown for lo = 0 (means none), !fits(hi·pt)
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (fits(mid * pt) ? lo : hi) = mid;
  }
  const int64_t T = lo * pt;
  std::string what_fits;
  if (T >= 1)
    what_fits = cat("; at this size (latent ", shape.height, "x", shape.width, ", batch ", shape.batch, ") at most ",
                    T, " latent frames fit (", 4 * (T - 1) + 1, " video frames at the Wan VAE's temporal stride 4)");
  else
    what_fits = cat("; not even one latent frame fits at latent ", shape.height, "x", shape.width, ", batch ",
                    shape.batch, " (the weights alone take ",
                    gib(p.device_weight_bytes()), " GiB)");
  WAN_THROW("DiT GPU memory plan does not fit device ", device, ": ", gib(p.device_weight_bytes()),
            " GiB weights (", experts, " expert(s), ", res.str(), ") + ", gib(p.arena_bytes), " GiB activations (batch ", shape.batch, ", latent ", shape.frames,
            "x", shape.height, "x", shape.width, ") + ", gib(p.reserve_bytes), " GiB reserve = ", gib(p.total_bytes()),
            " GiB, but only ", gib(free_bytes), " GiB is free", what_fits);
}

MemoryPlan with_attention_workspace(MemoryPlan p, size_t attn_ws) {
  MemoryPlan::Buffer& ws = p.buffers.back();
  WAN_ASSERT(ws.name == "cudnn_workspace" && ws.bytes == 0, "DiT GPU plan: the attention workspace is not last");
  ws.bytes = attn_ws;
  p.arena_bytes = align_up(ws.offset + attn_ws);
  return p;
}

}  // namespace dit_gpu_detail

using dit_gpu_detail::DeviceTable;
using dit_gpu_detail::Geometry;
using dit_gpu_detail::kMiB;
using dit_gpu_detail::kReserveBytes;
using dit_gpu_detail::kRopeMaxPos;
using dit_gpu_detail::geometry;
using dit_gpu_detail::PlanBuilder;
using dit_gpu_detail::spa_geometry;
using dit_gpu_detail::chunk_rows_of;

// ---- MemoryPlan ----

const MemoryPlan::Buffer& MemoryPlan::get(const std::string& name) const {
  for (const Buffer& b : buffers)
    if (b.name == name) return b;
  WAN_THROW("memory plan: no buffer named '", name, "'");
}

std::string MemoryPlan::str() const {
  std::string s = cat("DiT GPU memory plan (batch ", shape.batch, ", latent ", shape.frames, "x", shape.height, "x",
                      shape.width, ", ", experts, " expert(s)", gemm == DiTGemm::Fp8 ? ", FP8 block GEMMs" : "",
                      parallel.active() ? cat(", this rank of cfg ", parallel.cfg, " x Ulysses ", parallel.ulysses,
                                              " x Ring ", parallel.ring)
                                        : std::string(),
                      "):\n");
  char line[160];
  for (const Buffer& b : buffers) {
    std::snprintf(line, sizeof line, "  %-22s %s offset %10.2f MiB  size %10.2f MiB\n", b.name.c_str(),
                  b.view ? "view " : "     ", b.offset / kMiB, b.bytes / kMiB);
    s += line;
  }
  std::snprintf(line, sizeof line,
                "  arena %.2f MiB + weights %.2f MiB (%d expert(s) x %.2f MiB, %s) + reserve %.2f MiB = %.2f MiB "
                "(%.2f GiB)\n",
                arena_bytes / kMiB, device_weight_bytes() / kMiB, experts, weight_bytes / kMiB, residency.str().c_str(),
                reserve_bytes / kMiB, total_bytes() / kMiB, total_bytes() / kMiB / 1024.0);
  s += line;
  if (host_weight_bytes() > 0) {
    std::snprintf(line, sizeof line, "  pinned host memory: %.2f GiB (every expert's weights)\n",
                  host_weight_bytes() / kMiB / 1024.0);
    s += line;
  }
  return s;
}

SeqSplit seq_split(int64_t tokens, int seq_ranks) {
  WAN_CHECK(tokens >= 1 && seq_ranks >= 1, "sequence split: ", tokens, " tokens over ", seq_ranks, " ranks");
  SeqSplit s;
  s.per_rank = (tokens + seq_ranks - 1) / seq_ranks;
  s.padded = s.per_rank * seq_ranks;
  return s;
}

dist::Layout DiTGpu::Options::Parallel::degrees() const {
  dist::Layout d;
  d.cfg = cfg ? cfg->size() : 1;
  d.ulysses = ulysses ? ulysses->size() : 1;
  d.ring = ring ? ring->size() : 1;
  return d;
}

std::string WeightResidency::str() const {
  switch (mode) {
    case Mode::Resident: return chunks > 1 ? cat("resident, rows in ", chunks, " chunks") : "resident";
    case Mode::SwapExperts: return chunks > 1 ? cat("expert swap, rows in ", chunks, " chunks") : "expert swap";
    case Mode::StreamBlocks:
      return cat("block streaming (", slots, " slots", disk ? ", from disk" : "", ")",
                 chunks > 1 ? cat(", rows in ", chunks, " chunks") : "");
  }
  return "?";
}

size_t MemoryPlan::device_weight_bytes() const {
  const size_t n = static_cast<size_t>(experts);
  switch (residency.mode) {
    case WeightResidency::Mode::Resident: return weight_bytes * n;
    case WeightResidency::Mode::SwapExperts: return weight_bytes;
    case WeightResidency::Mode::StreamBlocks:
      return nonblock_bytes * n + block_bytes * static_cast<size_t>(std::min(residency.slots, layers));
  }
  return 0;
}

size_t MemoryPlan::host_weight_bytes() const {
  if (residency.disk) return 2 * block_bytes;
  return residency.mode == WeightResidency::Mode::Resident ? 0 : weight_bytes * static_cast<size_t>(experts);
}

size_t MemoryPlan::disk_bytes() const {
  return residency.disk ? (weight_bytes - nonblock_bytes) * static_cast<size_t>(experts) : 0;
}

std::vector<WeightResidency> DiTGpu::residencies(int experts) {
  std::vector<WeightResidency> v{WeightResidency::resident()};
  if (experts > 1) v.push_back(WeightResidency::swap());
  v.push_back(WeightResidency::stream(3));
  v.push_back(WeightResidency::stream(2));
  v.push_back(WeightResidency::stream_disk(3));  // chosen only when the host cannot pin the others
  // Chunked rows (about 8·D bytes of activations per row instead of 14·D), when nothing above fits.
  for (int chunks : {4, 16}) {
    v.push_back(WeightResidency::stream(2).chunked(chunks));
    v.push_back(WeightResidency::stream_disk(3).chunked(chunks));
  }
  return v;
}

namespace {
// The block's whole-row activations (DiTGpu::Impl::block): h, att, and big with its views.
void add_whole_row_buffers(PlanBuilder& a, const Geometry& g, size_t ck, bool fp8) {
  const size_t f4 = 4, b2 = 2;
  const size_t rows = static_cast<size_t>(g.rows), D = static_cast<size_t>(g.D), F = static_cast<size_t>(g.F);
  const size_t ctx_rows = static_cast<size_t>(g.B * g.TL);
  a.add("h", rows * D * b2);
  const size_t att = a.add("att", rows * D * b2);
  // FP8: the FFN-down input's e4m3 rows [rows, F] after the FFN hidden (nothing else in big is live
  // then); at least one fp32 row of F for the random draw's scratch (create())
  // q|k|v rows, with q and k normed in place (DiTGpu::Impl::block); a split sequence adds dense q and k.
  const bool qk_rows = g.seq_parallel();
  const size_t big_bytes = std::max({rows * (qk_rows ? 5 : 3) * D * b2, rows * F * b2, rows * D * f4,
                                     rows * static_cast<size_t>(g.K) * b2, fp8 ? rows * F * (b2 + 1) : 0,
                                     fp8 ? F * f4 : 0});
  const size_t big = a.add("big", big_bytes);
  a.view("big.qkv", big, 0, rows * 3 * D * b2);
  if (qk_rows) {
    a.view("big.q", big, rows * 3 * D * b2, rows * D * b2);
    a.view("big.k", big, rows * 4 * D * b2, rows * D * b2);
  }
  a.view("big.ffn", big, 0, rows * static_cast<size_t>(g.F) * b2);
  a.view("big.patch_rows", big, 0, rows * static_cast<size_t>(g.K) * b2);
  a.view("big.head_in", big, 0, rows * D * f4);
  if (fp8) {
    // Each block GEMM's quantised input (e4m3 [M, K]) in a region dead while it lives (DiTGpu::Impl::block):
    // past the o / cross q / cross o rows in big (split sequence: k's), ck's (cross k|v, before its
    // norm), att's (FFN up, before the FFN-down output), and past the FFN hidden (FFN down). Only the
    // row scales need a buffer.
    a.view("fp8.xq", big, rows * (qk_rows ? 4 : 1) * D * b2, rows * D);
    a.view("fp8.xq_ctx", ck, 0, ctx_rows * D);
    a.view("fp8.xq_ffn_up", att, 0, rows * D);
    a.view("fp8.xq_ffn_down", big, rows * F * b2, rows * F);
    a.add("fp8.x_scale", std::max(rows, ctx_rows) * f4);
  }
}

}  // namespace

MemoryPlan DiTGpu::plan(const DiTConfig& cfg, const DiTShape& shape, int experts, size_t attn_workspace,
                        const dist::Layout& par, Gemm gemm, WeightResidency residency) {
  WAN_CHECK(experts >= 1, "DiT GPU: at least one expert");
  WAN_CHECK(residency.mode != WeightResidency::Mode::StreamBlocks || residency.slots >= 2,
            "DiT GPU: block streaming needs at least 2 slots, got ", residency.slots);
  WAN_CHECK(residency.chunks <= 1 || !par.active(), "DiT GPU: chunked rows run on one GPU");
  const DeviceTable wt = dit_gpu_detail::build_weight_table(cfg, gemm);  // also checks the config
  const Geometry g = geometry(cfg, shape, par);
  const bool fp8 = gemm == Gemm::Fp8;
  MemoryPlan p;
  p.shape = shape;
  p.gemm = gemm;
  p.parallel = par;
  p.experts = experts;
  p.weight_bytes = wt.bytes;
  p.reserve_bytes = kReserveBytes;
  p.residency = residency;
  p.layers = cfg.num_layers;
  const dit_gpu_detail::BlockLayout bl = dit_gpu_detail::block_layout(wt, cfg.num_layers);
  p.block_bytes = dit_gpu_detail::align_up(bl.max_block);
  p.nonblock_bytes = bl.nonblock(wt.bytes);
  PlanBuilder a(p);
  const size_t f4 = 4, b2 = 2;
  const size_t rows = static_cast<size_t>(g.rows), D = static_cast<size_t>(g.D);
  const size_t ctx_rows = static_cast<size_t>(g.B * g.TL);
  a.add("x_in", static_cast<size_t>(g.B * g.C * g.T * g.H * g.W) * f4);
  a.add("t", static_cast<size_t>(g.B) * f4);
  a.add("ctx_f32", ctx_rows * g.TD * f4);
  a.add("ctx_in", ctx_rows * g.TD * b2);
  a.add("ctx_hidden", ctx_rows * D * b2);
  a.add("ctx", ctx_rows * D * b2);
  a.add("ckv", ctx_rows * 2 * D * b2);
  const size_t ck = a.add("ck", ctx_rows * D * b2);
  a.add("sinus", static_cast<size_t>(g.B * g.FQ) * f4);
  a.add("temb", static_cast<size_t>(g.B) * D * f4);
  a.add("e", static_cast<size_t>(g.B) * D * f4);
  a.add("e_silu", static_cast<size_t>(g.B) * D * f4);
  a.add("e0", static_cast<size_t>(g.B) * 6 * D * f4);
  // DiTShape::first_frame_t: the second timestep of each sample and its e, e0 (sinus, temb and e_silu are
  // reused). Own buffers at the arena's alignment, so its GEMMs take the same plans as e's and e0's.
  a.add("t_first", static_cast<size_t>(g.B) * f4);
  a.add("e_first", static_cast<size_t>(g.B) * D * f4);
  a.add("e0_first", static_cast<size_t>(g.B) * 6 * D * f4);
  a.add("rope", static_cast<size_t>(kRopeMaxPos) * 128 * f4);  // [max_pos][64 pairs][cos, sin]
  a.add("resid", rows * D * f4);
  const size_t F = static_cast<size_t>(g.F);
  p.chunk_rows = chunk_rows_of(g.S, residency.chunks);
  if (p.chunk_rows > 0) {
    // Chunked rows (dit_gpu_chunked.cpp): every row's keys|values and patch features; a chunk's norm
    // output h, attention output att, and big: its q, then y (o, cross q, cross o) with the FP8 input of
    // the o / cross o GEMMs past it, then its FFN hidden with the FFN-down input past that, and the head's
    // fp32 rows.
    const size_t C = static_cast<size_t>(p.chunk_rows);
    a.add("kv", rows * 2 * D * b2);
    a.add("patch_rows", rows * static_cast<size_t>(g.K) * b2);
    a.add("h", C * D * b2);
    a.add("att", C * D * b2);
    a.add("big", std::max({C * F * (fp8 ? b2 + 1 : b2), C * D * (fp8 ? 3 : 2), C * D * f4, F * f4}));
    if (fp8) {
      a.view("fp8.xq_ctx", ck, 0, ctx_rows * D);
      a.add("fp8.x_scale", std::max(C, ctx_rows) * f4);
    }
  } else {
    add_whole_row_buffers(a, g, ck, fp8);
  }
  // head rows: with a split sequence, all ranks' rows [P][B·S] (this rank's written in place, then
  // all-gathered) and, for B > 1, the same rows in sample order [B][P·S]
  const size_t P = static_cast<size_t>(par.seq());
  a.add("head_out", P * rows * static_cast<size_t>(g.OP) * f4);
  if (P > 1 && g.B > 1) a.add("head_seq", P * rows * static_cast<size_t>(g.OP) * f4);
  a.add("out", static_cast<size_t>(g.Bg * g.Co * g.T * g.H * g.W) * f4);  // all samples (CFG-parallel: gathered)
  for (const auto& [name, bytes] : SeqParallelAttention::plan_buffers(spa_geometry(g))) a.add(name, bytes);
  a.add("cublaslt_workspace", GemmRunner::kWorkspaceBytes);
  a.add("cudnn_workspace", attn_workspace);
  return p;
}

}  // namespace wan::cuda
