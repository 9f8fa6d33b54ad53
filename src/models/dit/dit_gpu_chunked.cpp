// The GPU DiT's forward with chunked rows (WeightResidency::chunks, MemoryPlan::chunk_rows): the
// low-memory mode's activation strategy. Each sample's rows are cut into chunks of chunk_rows; a block
// first computes the keys and values of every chunk (they are all the self-attention needs of other
// rows), then runs each chunk's norm1 + q, self-attention against its sample's keys, o, cross-attention
// and FFN in chunk-sized buffers, adding into that chunk's residual rows. Only the fp32 residual (4·D
// bytes per row) and the key|value rows (4·D) span the sequence.
// The maths is block()'s, row for row; what differs: norm1 runs twice per chunk (for k|v, then for q),
// the q and k|v GEMMs use their halves of the fused q|k|v weight, the next block's norm1 is not fused
// into the last residual add, the first block's self-attention is not shared between samples, and the
// GEMMs' row counts (so cuBLASLt may pick other kernels: results agree to bf16 rounding, not bit for bit).
// One GPU only (MemoryPlan::plan refuses a layout).
#include "models/dit/dit_gpu_impl.h"

namespace wan::cuda {
namespace {

// A modulation vector of the rows of sample b from token c0 on (a chunk): its e vectors are sample b's,
// its first-frame test counts tokens from c0.
ModVec chunk_mod(ModVec m, int64_t b, int64_t c0) {
  if (m.e) m.e += b * m.e_stride;
  if (m.e_first) m.e_first += b * m.e_stride;
  m.token0 += c0;
  return m;
}

// A chunk: rows [c0, c0 + n) of sample b, i.e. rows r0 = b·S + c0 .. of the arena's [B·S] rows.
struct Chunk {
  int64_t b, c0, n, r0;
};
template <typename F>
void for_each_chunk(const Geometry& g, int64_t chunk_rows, F&& f) {
  const int64_t C = std::min(chunk_rows, g.S);
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t c0 = 0; c0 < g.S; c0 += C) f(Chunk{b, c0, std::min(C, g.S - c0), b * g.S + c0});
}

// The RoPE of a chunk's rows: tokens c0 .. c0 + n - 1 of a sequence of S.
RopeArgs chunk_rope(RopeArgs ra, const Geometry& g, const Chunk& c) {
  ra.seq = c.n, ra.offset = c.c0, ra.total = g.S;
  return ra;
}

}  // namespace

void DiTGpu::Impl::run_body_chunked(const ExpertPtrs& w, const Geometry& g, const RopeArgs& rope_args,
                                    cudaStream_t s) {
  WAN_ASSERT(!par.active(), "chunked rows on one GPU");
  const int64_t D = g.D;
  // patch embedding (run_body wrote every row's patch features): bf16 rows, then the fp32 residual
  for_each_chunk(g, plan.chunk_rows, [&](const Chunk& c) {
    linear_op(patch_rows + c.r0 * g.K, w.pe_w, w.pe_b, h, c.n, g.K, D, Act::None, s);
    convert_bf16_to_f32(h, resid + c.r0 * D, c.n * D, s);
  });
  stream_begin(w.expert, s);
  for (size_t i = 0; i < w.blocks.size(); ++i) {
    const int b = static_cast<int>(i);
    stream_wait(b, s);
    block_chunked(w.blocks[i], g, rope_args, s);
    stream_next(w.expert, b, s);
  }
  // head (fp32): LN(x)·(1 + scale) + shift, fp32 Linear, per chunk into the head rows
  float* head_in = reinterpret_cast<float*>(big);  // [chunk, D]
  const TimeRows tr = time_rows(g);
  for_each_chunk(g, plan.chunk_rows, [&](const Chunk& c) {
    layernorm_modulate(resid + c.r0 * D, head_in, c.n, D, chunk_mod(head_mod(w.hmod, 0, g, tr), c.b, c.c0),
                       chunk_mod(head_mod(w.hmod, 1, g, tr), c.b, c.c0), cfg.eps, s);
    linear_op(head_in, w.head_w, w.head_b, head_out + c.r0 * g.OP, c.n, D, g.OP, Act::None, s);
  });
  unpatchify(head_out, out, g.B, g.Lpad, g.Co, g.f, g.gh, g.gw, g.pt, g.ph, g.pw, s);
}

void DiTGpu::Impl::block_chunked(const BlockPtrs& w, const Geometry& g, const RopeArgs& rope_args, cudaStream_t s) {
  const int64_t D = g.D, S = g.S, crow = g.B * g.TL;
  const float eps = cfg.eps;
  auto mod = [&](int k, const Chunk& c) { return chunk_mod(block_mod(w, k, g), c.b, c.c0); };
  // big (dit_gpu_plan.cpp): q, then y (o, cross q, cross o) [chunk, D] with the FP8 input of the o and cross
  // o GEMMs past it; the FFN hidden [chunk, F] with the FFN-down input past it.
  bf16* q = big;
  bf16* y = big;
  bf16* ffn = big;
  const int64_t C = std::min(plan.chunk_rows, S);
  void* xq = reinterpret_cast<char*>(big) + C * D * 2;
  void* xq_ffn2 = reinterpret_cast<char*>(big) + C * g.F * 2;
  // The q and k|v halves of the fused q|k|v weight (rows [0, D) and [D, 3D)): e4m3 bytes with FP8.
  const bf16* wkv = fp8() ? reinterpret_cast<const bf16*>(reinterpret_cast<const uint8_t*>(w.qkv_w) + D * D)
                          : w.qkv_w + D * D;
  const float* skv = w.qkv_s ? w.qkv_s + D : nullptr;
  const bf16* bkv = w.qkv_b ? w.qkv_b + D : nullptr;

  // Every chunk's keys and values, from norm1 of the residual before this block: [rows, 2D]
  for_each_chunk(g, plan.chunk_rows, [&](const Chunk& c) {
    norm_into_h([&](auto out) { layernorm_modulate(resid + c.r0 * D, out, c.n, D, mod(0, c), mod(1, c), eps, s); });
    bf16* kvc = kv + c.r0 * 2 * D;
    linear_from_h(wkv, skv, bkv, kvc, c.n, D, 2 * D, Act::None, s);
    const RopeArgs ra = chunk_rope(rope_args, g, c);
    qk_rmsnorm_rope(RmsNormJob{kvc, 2 * D, w.nk, kvc, c.n, 2 * D}, nullptr, D, eps, &ra, s);
  });
  // The text's keys and values for every sample, once
  block_linear(ctx, w.ckv_w, w.ckv_s, w.ckv_b, ckv, crow, D, 2 * D, Act::None, ck, s);
  qk_rmsnorm_rope(RmsNormJob{ckv, 2 * D, w.cnk, ck, crow}, nullptr, D, eps, nullptr, s);

  for_each_chunk(g, plan.chunk_rows, [&](const Chunk& c) {
    float* res = resid + c.r0 * D;
    // self-attention: q of the chunk's rows against every key of its sample
    norm_into_h([&](auto out) { layernorm_modulate(res, out, c.n, D, mod(0, c), mod(1, c), eps, s); });
    linear_from_h(w.qkv_w, w.qkv_s, w.qkv_b, q, c.n, D, D, Act::None, s);
    const RopeArgs ra = chunk_rope(rope_args, g, c);
    qk_rmsnorm_rope(RmsNormJob{q, D, w.nq, q, c.n, D}, nullptr, D, eps, &ra, s);
    AttentionArgs sa;
    sa.q = q, sa.k = kv + c.b * S * 2 * D, sa.v = kv + c.b * S * 2 * D + D, sa.o = att;
    // The FP8 kernel quantises a sample's keys and values at its first chunk only: the later chunks' calls
    // follow with the same K/V, and the cross-attention between them does not touch the workspace.
    attention_op(OpCat::SelfAttention, chunk_self_attn_shape(g, c.n), sa, s,
                 c.c0 > 0 ? Fp8KV::Reuse : Fp8KV::Quantize);
    block_linear(att, w.o_w, w.o_s, w.o_b, y, c.n, D, D, Act::None, xq, s);
    const ModVec gate_sa = mod(2, c);
    norm_into_h([&](auto out) {
      residual_add_layernorm_affine(res, y, &gate_sa, w.n3w, w.n3b, out, c.n, D, eps, s);
    });
    // cross-attention: no modulation or gate, all text_len keys of the sample
    linear_from_h(w.cq_w, w.cq_s, w.cq_b, y, c.n, D, D, Act::None, s);
    qk_rmsnorm_rope(RmsNormJob{y, D, w.cnq, y, c.n}, nullptr, D, eps, nullptr, s);
    AttentionArgs ca;
    ca.q = y, ca.k = ck + c.b * g.TL * D, ca.v = ckv + c.b * g.TL * 2 * D + D, ca.o = att;
    attention_op(OpCat::CrossAttention, chunk_cross_attn_shape(g, c.n), ca, s);
    block_linear(att, w.co_w, w.co_s, w.co_b, y, c.n, D, D, Act::None, xq, s);
    norm_into_h([&](auto out) {
      residual_add_layernorm_modulate(res, y, nullptr, out, c.n, D, mod(3, c), mod(4, c), eps, s);
    });
    // feed-forward; resid += y·gate_ff
    linear_from_h(w.f0_w, w.f0_s, w.f0_b, ffn, c.n, D, g.F, Act::GeluTanh, s);
    block_linear(ffn, w.f2_w, w.f2_s, w.f2_b, att, c.n, g.F, D, Act::None, xq_ffn2, s);
    gated_residual_add(res, att, c.n, D, mod(5, c), s);
  });
}

}  // namespace wan::cuda
