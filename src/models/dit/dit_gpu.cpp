// The GPU DiT: creation (fit check, allocation, weights), the forward as a sequence of cuBLASLt GEMMs,
// cuDNN / own attentions and the fused kernels of dit_kernels.h, its CUDA graphs and the op profile.
// The memory plan and geometry live in dit_gpu_plan.cpp, the time embedding and the per-token choice of
// a timestep's modulation rows in dit_gpu_time.cpp.
#include "models/dit/dit_gpu.h"

#include <algorithm>
#include <cstdio>

#include "core/dtype.h"
#include "core/error.h"
#include "models/dit/dit_gpu_impl.h"
#include "kernels/seq_parallel_kernels.h"

namespace wan::cuda {

// Arena (one allocation, offsets from plan(); rows = B·L tokens, D = dim, F = ffn_dim):
//   resid  f32  [rows, D]   the residual stream (fp32 from the patch embedding on, spec §9.4)
//   h      bf16 [rows, D]   norm outputs feeding GEMMs (all but block 0's norm1 come out of the residual
//                           add before them, fused with the norm: dit_kernels.h residual_add_layernorm_*)
//   att    bf16 [rows, D]   attention outputs; the FFN-down output
//   big    bf16             [rows, 3D] qkv | [rows, D] q | [rows, D] k during attention, q then holding
//                           the o GEMM's output until its fused add + norm; the FFN hidden
//                           [rows, F] afterwards; the patch rows before block 0 and the fp32 head input
//                           after the last block (live ranges never overlap, so these are views)
// plus the text context ([B, text_len, ·] bf16), time embedding vectors (fp32), RoPE table, inputs,
// output, head rows and the cuBLASLt / cuDNN workspaces.
// Numerics per step follow spec §2.7/§2.10; where the reference rounds, the kernels round (see
// dit_kernels.h); the one documented deviation is the fused GELU epilogue of the FFN and text MLP,
// which skips the reference's bf16 rounding of the pre-activation. DiTGemm::Fp8 (opt-in) replaces the
// blocks' 7 GEMMs by e4m3 GEMMs whose inputs are quantised per token: by the LayerNorm that produces
// them (norm1, norm3, norm2), else into arena views before the GEMM (block_linear).

namespace {

// DiTGemm::Fp8's preconditions, checked before anything is planned or allocated.
void check_fp8(const DiTGpu::Options& opt) {
  WAN_CHECK(fp8_supported(opt.device), "DiT GPU: --gemm fp8 needs FP8 GEMMs through cuBLASLt (an sm_90 GPU); "
            "device ", opt.device, " has none (use --gemm bf16)");
}

// Samples 1 .. B-1 of a [B, per_sample] buffer become copies of sample 0 (the one-latent CFG batch).
void copy_first_sample(void* p, size_t per_sample_bytes, int64_t B, cudaStream_t s) {
  auto* base = static_cast<char*>(p);
  for (int64_t b = 1; b < B; ++b)
    CUDA_CHECK(cudaMemcpyAsync(base + b * per_sample_bytes, base, per_sample_bytes, cudaMemcpyDeviceToDevice, s));
}

}  // namespace

// ---- DiTGpu ----

void DiTGpu::Impl::stage_inputs(const Geometry& g, const DiTInputs& in, cudaStream_t s) {
  // This rank's samples [b0, b0 + B) of the global batch (all of it without CFG-parallel).
  const int64_t b0 = cfg_rank * g.B, x_sample = g.C * g.T * g.H * g.W;
  if (g.one_latent) {  // x's first latent is every sample's: read once, copied on the device
    const size_t bytes = static_cast<size_t>(x_sample) * 4;
    CUDA_CHECK(cudaMemcpyAsync(x_in, in.x, bytes, cudaMemcpyDefault, s));
    copy_first_sample(x_in, bytes, g.B, s);
  } else {
    CUDA_CHECK(cudaMemcpyAsync(x_in, in.x + b0 * x_sample, static_cast<size_t>(g.B * x_sample) * 4, cudaMemcpyDefault,
                               s));
  }
  CUDA_CHECK(cudaMemcpyAsync(t, in.t + b0, static_cast<size_t>(g.B) * 4, cudaMemcpyDefault, s));
  if (g.first_frame)
    CUDA_CHECK(cudaMemcpyAsync(t_first, in.t_first + b0, static_cast<size_t>(g.B) * 4, cudaMemcpyDefault, s));
  // Each prompt zero-padded to text_len before the text MLP (spec §2.5).
  const bool f32 = in.context_dtype == DType::F32;
  const size_t es = f32 ? 4 : 2, row = static_cast<size_t>(g.TD) * es;
  char* dst = f32 ? reinterpret_cast<char*>(ctx_f32) : reinterpret_cast<char*>(ctx_in);
  const char* src = static_cast<const char*>(in.context);
  for (int64_t b = 0; b < g.B; ++b) {
    const size_t n = static_cast<size_t>(in.ctx_lens[b0 + b]);
    char* d = dst + static_cast<size_t>(b * g.TL) * row;
    if (n > 0)
      CUDA_CHECK(cudaMemcpyAsync(d, src + static_cast<size_t>((b0 + b) * in.ctx_rows) * row, n * row,
                                 cudaMemcpyDefault, s));
    if (n < static_cast<size_t>(g.TL)) CUDA_CHECK(cudaMemsetAsync(d + n * row, 0, (g.TL - n) * row, s));
  }
  if (f32) convert_f32_to_bf16(ctx_f32, ctx_in, g.B * g.TL * g.TD, s);
  if (spa) spa->set_key_lengths(spa_geometry(g), s);
}

void DiTGpu::Impl::block(const BlockPtrs& w, const BlockPtrs* next, int index, const Geometry& g,
                         const RopeArgs& rope_args, bool shared, cudaStream_t s) {
  const int64_t D = g.D, rows = g.rows, crow = g.B * g.TL;
  const float eps = cfg.eps;
  auto chunk = [&](int k) { return block_mod(w, k, g); };
  // One GPU or CFG-parallel: the normed, rotated q and k overwrite their thirds of the qkv rows, which
  // the attention reads with a token stride of 3D (dit_gpu_plan.cpp: big holds 3D per row). A split
  // sequence keeps them in rows of their own, as its exchanges expect dense q and k (5D per row).
  const bool qk_in_place = !spa;
  bf16* qkv = big;                                        // [rows, 3D]
  bf16* q = qk_in_place ? qkv : big + rows * 3 * D;       // [rows, D] (in place: stride 3D)
  bf16* k = qk_in_place ? qkv + D : big + rows * 4 * D;   // [rows, D] (in place: stride 3D)
  const int64_t qk_ld = qk_in_place ? 3 * D : D;
  // [rows, D] once the self-attention has run: the o GEMM's output, then the cross q and the cross o
  bf16* y = qk_in_place ? big : q;
  bf16* ffn = big;                 // [rows, F]
  // DiTGemm::Fp8: the inputs of the qkv, cross q and FFN-up GEMMs come quantised out of the LayerNorm
  // before them (into h, norm_out()); the others' quantised input goes where nothing live is
  // (dit_gpu_plan.cpp's fp8.* views): past y in the dead qkv rows (split sequence: k's region, dead
  // outside the self-attention), ck before its norm writes it, and the bytes of big past the FFN hidden.
  void* xq = qk_in_place ? static_cast<void*>(big + rows * D) : static_cast<void*>(k);
  void* xq_ffn2 = reinterpret_cast<char*>(big) + rows * g.F * 2;

  // self-attention on h = norm1(resid), computed before this block (run_body or the previous block);
  // shared: for sample 0's rows only
  const int64_t sa_rows = shared ? g.S : rows;
  linear_from_h(w.qkv_w, w.qkv_s, w.qkv_b, qkv, sa_rows, D, 3 * D, Act::None, s);
  const RmsNormJob jq{qkv, 3 * D, w.nq, q, sa_rows, qk_ld}, jk{qkv + D, 3 * D, w.nk, k, sa_rows, qk_ld};
  qk_rmsnorm_rope(jq, &jk, D, eps, &rope_args, s);
  if (spa) {  // the sequence is split over ranks: Ulysses / Ring / 2D (models/dit/seq_attention_gpu.h)
    spa->run(spa_geometry(g), q, k, qkv + 2 * D, 3 * D, att,
             [this](const AttentionShape& sh, const AttentionArgs& a, cudaStream_t st) {
               run_attention(OpCat::SelfAttention, sh, a, st);
             },
             s);
  } else {
    const AttentionShape ss = self_attn_shape(g, shared);
    AttentionArgs sa;
    sa.q = q, sa.k = k, sa.v = qkv + 2 * D, sa.o = att;
    attention_op(OpCat::SelfAttention, ss, sa, s);
  }
  block_linear(att, w.o_w, w.o_s, w.o_b, y, sa_rows, D, D, Act::None, xq, s);
  if (shared) copy_first_sample(y, static_cast<size_t>(g.S * D) * sizeof(bf16), g.B, s);  // the others' o rows
  // resid += o·gate_sa, and the cross-attention's affine pre-norm (norm3) of it, in one pass
  const ModVec gate_sa = chunk(2);
  norm_into_h([&](auto out) {
    residual_add_layernorm_affine(resid, y, &gate_sa, w.n3w, w.n3b, out, rows, D, eps, s);
  });

  // cross-attention: no modulation or gate, all text_len keys
  linear_from_h(w.cq_w, w.cq_s, w.cq_b, y, rows, D, D, Act::None, s);
  block_linear(ctx, w.ckv_w, w.ckv_s, w.ckv_b, ckv, crow, D, 2 * D, Act::None, ck, s);
  const RmsNormJob cq{y, D, w.cnq, y, rows}, cjk{ckv, 2 * D, w.cnk, ck, crow};
  qk_rmsnorm_rope(cq, &cjk, D, eps, nullptr, s);
  const AttentionShape cs = cross_attn_shape(g);
  AttentionArgs ca;
  ca.q = y, ca.k = ck, ca.v = ckv + D, ca.o = att;
  attention_op(OpCat::CrossAttention, cs, ca, s);
  block_linear(att, w.co_w, w.co_s, w.co_b, y, rows, D, D, Act::None, xq, s);
  // resid += o, and the FFN's pre-norm (norm2) of it, in one pass
  norm_into_h([&](auto out) {
    residual_add_layernorm_modulate(resid, y, nullptr, out, rows, D, chunk(3), chunk(4), eps, s);
  });

  // feed-forward; resid += y·gate_ff, fused with the next block's norm1 (the last block's add is
  // plain: the head norm reads the residual in head_and_output)
  linear_from_h(w.f0_w, w.f0_s, w.f0_b, ffn, rows, D, g.F, Act::GeluTanh, s);
  block_linear(ffn, w.f2_w, w.f2_s, w.f2_b, att, rows, g.F, D, Act::None, xq_ffn2, s);
  const ModVec gate_ff = chunk(5);
  stream_wait(index + 1, s);  // the next block's modulation, read by the fused add + norm below
  if (next)
    norm_into_h([&](auto out) {
      residual_add_layernorm_modulate(resid, att, &gate_ff, out, rows, D, block_mod(*next, 0, g),
                                      block_mod(*next, 1, g), eps, s);
    });
  else
    gated_residual_add(resid, att, rows, D, gate_ff, s);
}

void DiTGpu::Impl::run_body(const ExpertPtrs& w, const Geometry& g, cudaStream_t s) {
  const int64_t D = g.D, rows = g.rows;
  const bool chunked = plan.chunk_rows > 0;  // run_body_chunked embeds the patches one chunk at a time
  // patch embedding: bf16 GEMM output (the reference's autocast Conv3d), then the fp32 residual
  bf16* patch = chunked ? patch_rows : big;  // [rows, K]
  if (g.seq_parallel())  // this rank's slice of every sample
    patchify_slice_bf16(x_in, patch, g.B, g.C, g.T, g.H, g.W, g.pt, g.ph, g.pw, seq_rank * g.S, g.S, s);
  else
    patchify_bf16(x_in, patch, g.B, g.C, g.T, g.H, g.W, g.pt, g.ph, g.pw, g.L, s);
  if (!chunked) {
    linear_op(patch, w.pe_w, w.pe_b, h, rows, g.K, D, Act::None, s);
    convert_bf16_to_f32(h, resid, rows * D, s);
  }

  // time embedding and projection, fp32: e [B, D], e0 [B, 6D]; of t_first too (latent frame 0's tokens)
  const LinearF32 lin = [this](const float* x, const float* wt, const float* b, float* y, int64_t M, int64_t K,
                               int64_t N, cudaStream_t st) { linear_op(x, wt, b, y, M, K, N, Act::None, st); };
  time_embedding(w.time, g, t, sinus, temb, e_silu, e, e0, lin, s);
  if (g.first_frame) time_embedding(w.time, g, t_first, sinus, temb, e_silu, e_first, e0_first, lin, s);

  // text embedding, bf16: ctx [B, text_len, D], once per forward for every block's cross k/v
  linear_op(ctx_in, w.te0_w, w.te0_b, ctx_hidden, g.B * g.TL, g.TD, D, Act::GeluTanh, s);
  linear_op(ctx_hidden, w.te2_w, w.te2_b, ctx, g.B * g.TL, D, D, Act::None, s);

  RopeArgs ra;
  ra.table = rope, ra.max_pos = kRopeMaxPos, ra.head_dim = 128, ra.seq = g.S, ra.f = g.f, ra.h = g.gh, ra.w = g.gw;
  if (g.seq_parallel()) ra.offset = seq_rank * g.S, ra.total = g.Lpad;  // global positions of the slice (§8)
  if (chunked) return run_body_chunked(w, g, ra, s);
  // norm1 of the first block; every later one comes out of the previous block's last residual add
  // (shared first block: sample 0's rows only, see block())
  stream_begin(w.expert, s);
  stream_wait(0, s);
  if (!w.blocks.empty())
    norm_into_h([&](auto out) {
      layernorm_modulate(resid, out, g.share_first() ? g.S : rows, D, block_mod(w.blocks[0], 0, g),
                         block_mod(w.blocks[0], 1, g), cfg.eps, s);
    });
  for (size_t i = 0; i < w.blocks.size(); ++i) {
    const int b = static_cast<int>(i);
    block(w.blocks[i], i + 1 < w.blocks.size() ? &w.blocks[i + 1] : nullptr, b, g, ra, g.share_first() && i == 0, s);
    stream_next(w.expert, b, s);
  }
  head_and_output(w, g, s);
}

void DiTGpu::Impl::head_and_output(const ExpertPtrs& w, const Geometry& g, cudaStream_t s) {
  const int64_t D = g.D, rows = g.rows, P = g.par.seq();
  // head (fp32 region): LN(x)·(1 + scale) + shift with (shift, scale) = head.modulation + e, fp32 Linear
  float* head_in = reinterpret_cast<float*>(big);  // [rows, D]
  const TimeRows tr = time_rows(g);
  layernorm_modulate(resid, head_in, rows, D, head_mod(w.hmod, 0, g, tr), head_mod(w.hmod, 1, g, tr), cfg.eps, s);
  float* head_rows = head_out + seq_rank * rows * g.OP;  // [B, S, OP] this rank's rows
  linear_op(head_in, w.head_w, w.head_b, head_rows, rows, D, g.OP, Act::None, s);
  const float* seq_rows = head_out;  // [B, Lpad, OP] every token of this rank's samples
  if (P > 1) {
    // [P][B, S, OP] from every sequence rank (in place), then sample-major for unpatchify
    const size_t bytes = static_cast<size_t>(rows * g.OP) * 4;
    opt.parallel.seq->all_gather(head_rows, head_out, bytes, s);
    if (g.B > 1) {
      SeqMajor sm;
      sm.s[0] = reinterpret_cast<char*>(head_seq);
      seq_major_chunks(sm, reinterpret_cast<char*>(head_out), 1, P, g.B, g.S, g.OP * 4, false, s);
      seq_rows = head_seq;
    }
  }
  // CFG-parallel: this rank's samples land at their place in the batch, then the other half's arrive.
  const int64_t n_out = g.B * g.Co * g.T * g.H * g.W;
  float* my_out = out + cfg_rank * n_out;
  unpatchify(seq_rows, my_out, g.B, g.Lpad, g.Co, g.f, g.gh, g.gw, g.pt, g.ph, g.pw, s);
  if (g.par.cfg > 1) opt.parallel.cfg->all_gather(my_out, out, static_cast<size_t>(n_out) * 4, s);
}

void DiTGpu::Impl::setup_parallel() {
  const Options::Parallel& pc = opt.parallel;
  par = pc.degrees();
  if (!par.active()) return;
  WAN_CHECK(par.seq() == 1 || pc.seq, "DiT GPU: a split sequence (Ulysses ", par.ulysses, " x Ring ", par.ring,
            ") needs the sequence group");
  WAN_CHECK(!pc.seq || pc.seq->size() == par.seq(), "DiT GPU: the sequence group has ", pc.seq ? pc.seq->size() : 0,
            " ranks, expected Ulysses x Ring = ", par.seq());
  const int uly_rank = pc.ulysses ? pc.ulysses->rank() : 0, ring_rank = pc.ring ? pc.ring->rank() : 0;
  seq_rank = pc.seq ? pc.seq->rank() : 0;
  cfg_rank = pc.cfg ? pc.cfg->rank() : 0;
  WAN_CHECK(seq_rank == ring_rank * par.ulysses + uly_rank, "DiT GPU: sequence rank ", seq_rank,
            " is not ring rank x Ulysses + Ulysses rank (", ring_rank, " x ", par.ulysses, " + ", uly_rank, ")");
  WAN_CHECK(cfg_rank >= 0 && cfg_rank < par.cfg && seq_rank >= 0 && seq_rank < par.seq(),
            "DiT GPU: rank outside its group");
  if (par.seq() > 1) {
    spa = std::make_unique<SeqParallelAttention>(pc.ulysses, pc.ring);
    SeqParallelAttention::Buffers b;
    auto has = [&](const char* n) {
      for (const MemoryPlan::Buffer& x : plan.buffers)
        if (x.name == n) return true;
      return false;
    };
    auto bb = [&](const char* n) { return has(n) ? buf<bf16>(n) : nullptr; };
    auto bf = [&](const char* n) { return has(n) ? buf<float>(n) : nullptr; };
    b.send = bb("sp.send"), b.recv = bb("sp.recv"), b.q = bb("sp.q");
    b.kv[0] = bb("sp.kv0"), b.kv[1] = bb("sp.kv1"), b.o = bb("sp.o"), b.o_part = bb("sp.o_part");
    b.lse_part = bf("sp.lse_part"), b.acc = bf("sp.acc"), b.acc_lse = bf("sp.acc_lse");
    b.k_lens = buf<int32_t>("sp.k_lens");
    spa->bind(b);
    if (has("head_seq")) head_seq = buf<float>("head_seq");
  }
}

DiTGpu::DiTGpu(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DiTGpu::DiTGpu(DiTGpu&&) noexcept = default;
DiTGpu& DiTGpu::operator=(DiTGpu&&) noexcept = default;
DiTGpu::~DiTGpu() = default;

void DiTGpu::Impl::allocate_arena() {
  if (arena) return;
  CUDA_CHECK(cudaSetDevice(opt.device));
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  WAN_CHECK(plan.arena_bytes <= free_bytes, "DiT GPU: the activation arena (batch ", max_shape.batch, ", latent ",
            max_shape.frames, "x", max_shape.height, "x", max_shape.width, ") needs ", gib(plan.arena_bytes),
            " GiB, but only ", gib(free_bytes), " GiB is free on device ", opt.device);
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&arena), plan.arena_bytes));
  bind_buffers();
  setup_parallel();
  gemm = std::make_unique<GemmRunner>(gemm_ws, GemmRunner::kWorkspaceBytes);
  write_rope();
}

void DiTGpu::Impl::write_rope() {
  const std::vector<float> rope_host = rope_table_f32(128, kRopeMaxPos);
  WAN_ASSERT(rope_host.size() * 4 == plan.get("rope").bytes, "rope table size");
  CUDA_CHECK(cudaMemcpy(rope, rope_host.data(), rope_host.size() * 4, cudaMemcpyHostToDevice));
}

void DiTGpu::Impl::capture(const Key& key, const ExpertPtrs& w, const Geometry& g, cudaStream_t s) {
  if (graphs.count(key)) return;
  WAN_ASSERT(!prof, "DiT GPU: a graph capture while the op profiler is on");
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    run_body(w, g, s);  // records; builds each GEMM / attention plan on first use (host work only)
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(s, &broken);
    if (broken) cudaGraphDestroy(broken);
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t st = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_CHECK(st);
  graphs.emplace(key, exec);
  warmed.insert(key);
}

void DiTGpu::warm_up(const std::vector<std::pair<int, DiTShape>>& uses) {
  Impl& m = *impl_;
  CUDA_CHECK(cudaSetDevice(m.opt.device));
  m.allocate_arena();
  for (const auto& [expert, shape] : uses) {
    WAN_CHECK(expert >= 0 && expert < static_cast<int>(m.ptrs.size()), "DiT GPU warm-up: expert ", expert, " of ",
              m.ptrs.size());
    const Geometry g = geometry(m.cfg, shape, m.par);
    WAN_CHECK(g.B <= m.max_geo.B && g.rows <= m.max_geo.rows, "DiT GPU warm-up: batch ", g.B, " x ", g.L,
              " tokens exceeds the planned batch ", m.max_geo.B, " x ", m.max_geo.L, " tokens");
    if (!m.graphs_allowed()) continue;  // the arena and the checks above are all a warm-up does then
    const Impl::Key key = Impl::key_of(expert, shape, g);
    m.capture(key, m.ptrs[static_cast<size_t>(expert)], g, m.stream);
  }
}

DiTGpu DiTGpu::create(const DiTConfig& cfg, const std::vector<DiTWeightSource>& experts, const DiTShape& max_shape,
                      const Options& opt) {
  WAN_CHECK(!experts.empty(), "DiT GPU: no expert weights given");
  const int n = static_cast<int>(experts.size());
  if (opt.gemm == Gemm::Fp8) check_fp8(opt);
  // Everything checkable on the host first: config, shape, the plan without cuDNN's workspace.
  const dist::Layout par = opt.parallel.degrees();
  if (opt.planned)
    WAN_ASSERT(opt.planned->shape == max_shape && opt.planned->experts == n && opt.planned->parallel == par &&
                   opt.planned->gemm == opt.gemm && opt.planned->residency == opt.residency,
               "DiT GPU: the given plan is for another shape, expert count, layout, GEMM kind or residency");
  MemoryPlan p = opt.planned ? *opt.planned : plan(cfg, max_shape, n, 0, par, opt.gemm, opt.residency);
  if (opt.residency.mode != WeightResidency::Mode::Resident) {
    WAN_CHECK(!par.active(), "DiT GPU: ", opt.residency.str(), " runs on one GPU (each rank of a parallel layout "
              "holds its weights resident)");
    WAN_CHECK(!opt.defer_arena, "DiT GPU: ", opt.residency.str(), " fills the weights through the arena: no deferred "
              "arena");
    for (const DiTWeightSource& e : experts)
      WAN_CHECK(!e.external && !e.loader, "DiT GPU: ", opt.residency.str(), " loads its weights itself (no caller's "
                "loader or external fill)");
  }
  if (opt.defer_arena)
    for (const DiTWeightSource& e : experts)
      WAN_CHECK(!e.random, "DiT GPU: defer_arena needs loaded weights (random weights draw into the arena)");
  CUDA_CHECK(cudaSetDevice(opt.device));
  size_t free_bytes = 0, total_bytes = 0;
  if (!opt.planned) {
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (opt.defer_arena) {
      // The arena comes later (warm_up / first forward, e.g. after a text encoder is freed): only the
      // weights must fit now; the caller has checked the later phase (allocate_arena checks it again).
      const size_t need = p.weight_bytes * static_cast<size_t>(n) + p.reserve_bytes;
      WAN_CHECK(need <= free_bytes, "DiT GPU: ", n, " expert(s) x ", gib(p.weight_bytes), " GiB of weights + ",
                gib(p.reserve_bytes), " GiB reserve need ", gib(need), " GiB, but only ", gib(free_bytes),
                " GiB is free on device ", opt.device);
    } else {
      check_fit(cfg, max_shape, n, 0, free_bytes, opt.device, par, opt.gemm, opt.residency);
    }
  }

  auto im = std::make_unique<Impl>();
  im->cfg = cfg;
  im->max_shape = max_shape;
  im->max_geo = geometry(cfg, max_shape, par);
  im->opt = opt;
  im->table = dit_gpu_detail::build_weight_table(cfg, opt.gemm);
  // cuDNN's workspace for the largest attentions (builds their plans), then the exact plan. The own
  // kernel needs no workspace and no plans.
  im->opt.attention = resolve_attention(opt.attention);
  if (im->opt.attention == Attention::Cudnn) {
    im->attn = std::make_unique<CudnnAttention>();
    for (const AttentionShape& a : attention_shapes(im->max_geo, true, p.chunk_rows))
      im->attn_ws_bytes = std::max(im->attn_ws_bytes, im->attn->workspace_size(a));
  } else if (im->opt.attention == Attention::OwnFp8) {
    for (const AttentionShape& a : attention_shapes(im->max_geo, true, p.chunk_rows)) {
      OwnAttentionFp8::validate(a);
      im->attn_ws_bytes = std::max(im->attn_ws_bytes, OwnAttentionFp8::workspace_size(a));
    }
  } else {
    for (const AttentionShape& a : attention_shapes(im->max_geo, true, p.chunk_rows)) OwnAttention::validate(a);
  }
  if (!opt.planned) {
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (!opt.defer_arena)
      check_fit(cfg, max_shape, n, im->attn_ws_bytes, free_bytes, opt.device, par, opt.gemm, opt.residency);
    p = plan(cfg, max_shape, n, im->attn_ws_bytes, par, opt.gemm, opt.residency);
  } else if (im->attn_ws_bytes > 0) {
    // The caller checked its plan without cuDNN's workspace: one comparison that it still fits with it
    // (a deferred arena is checked when it is allocated).
    p = with_attention_workspace(std::move(p), im->attn_ws_bytes);
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    WAN_CHECK(opt.defer_arena || p.total_bytes() <= free_bytes, "DiT GPU: with cuDNN's attention workspace of ",
              gib(im->attn_ws_bytes), " GiB the DiT needs ", gib(p.total_bytes()), " GiB, but only ",
              gib(free_bytes), " GiB is free on device ", opt.device);
  }
  im->plan = p;
  if (opt.verbose) std::fprintf(stderr, "%s", p.str().c_str());

  CUDA_CHECK(cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&im->ev_in, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&im->ev_out, cudaEventDisableTiming));
  if (!opt.defer_arena) im->allocate_arena();

  im->place_weights(experts);
  CUDA_CHECK(cudaStreamSynchronize(im->stream));
  return DiTGpu(std::move(im));
}

void DiTGpu::forward(int expert, const DiTShape& shape, const DiTInputs& in, float* out, cudaStream_t stream) {
  impl_->forward(expert, shape, in, out, stream, false);
}

void DiTGpu::Impl::forward(int expert, const DiTShape& shape, const DiTInputs& in, float* out, cudaStream_t stream,
                           bool eager) {
  Impl& m = *this;
  WAN_CHECK(expert >= 0 && expert < static_cast<int>(m.ptrs.size()), "DiT GPU forward: expert ", expert, " of ",
            m.ptrs.size());
  const Geometry g = geometry(m.cfg, shape, m.par);
  WAN_CHECK(g.B <= m.max_geo.B && g.rows <= m.max_geo.rows, "DiT GPU forward: batch ", g.B, " x ", g.L,
            " tokens exceeds the planned batch ", m.max_geo.B, " x ", m.max_geo.L, " tokens");
  WAN_CHECK(in.x && in.t && in.context && in.ctx_lens && out, "DiT GPU forward: null input or output");
  WAN_CHECK(in.context_dtype == DType::F32 || in.context_dtype == DType::BF16,
            "DiT GPU forward: context must be f32 or bf16, got ", dtype_name(in.context_dtype));
  WAN_CHECK(in.ctx_rows >= 1 && in.ctx_rows <= g.TL, "DiT GPU forward: context has ", in.ctx_rows,
            " rows per sample, expected 1..", g.TL);
  check_timesteps(g, in);
  for (int64_t b = 0; b < g.Bg; ++b)
    WAN_CHECK(in.ctx_lens[b] >= 0 && in.ctx_lens[b] <= in.ctx_rows, "DiT GPU forward: context length ",
              in.ctx_lens[b], " of sample ", b, " outside [0, ", in.ctx_rows, "]");
  // A shape smaller than the planned one may pick other cuDNN engines: their workspace must fit too.
  if (m.attn)
    for (const AttentionShape& a : attention_shapes(g, false, m.plan.chunk_rows))
      WAN_CHECK(m.attn->workspace_size(a) <= m.attn_ws_bytes, "DiT GPU forward: cuDNN wants ",
                m.attn->workspace_size(a), " B of workspace for this shape, the plan has ", m.attn_ws_bytes);

  CUDA_CHECK(cudaSetDevice(m.opt.device));
  m.allocate_arena();  // Options::defer_arena without warm_up(): now
  cudaStream_t s = m.stream;
  CUDA_CHECK(cudaEventRecord(m.ev_in, stream));
  CUDA_CHECK(cudaStreamWaitEvent(s, m.ev_in, 0));
  if (m.prof) m.prof->mark(s);  // the profiled forward's first event
  m.stage_inputs(g, in, s);
  const Impl::Key key = Impl::key_of(expert, shape, g);
  const ExpertPtrs& w = m.ptrs[static_cast<size_t>(expert)];
  m.swap_in(expert, s);
  if (!eager && m.graphs_allowed() && m.warmed.count(key)) {
    auto it = m.graphs.find(key);
    if (it == m.graphs.end()) {
      m.capture(key, w, g, s);
      it = m.graphs.find(key);
    }
    CUDA_CHECK(cudaGraphLaunch(it->second, s));
  } else {
    m.run_body(w, g, s);  // the warm-up: builds every GEMM and attention plan before any capture
    m.warmed.insert(key);
  }
  CUDA_CHECK(cudaMemcpyAsync(out, m.out, static_cast<size_t>(g.Bg * g.Co * g.T * g.H * g.W) * 4, cudaMemcpyDefault, s));
  if (m.prof) m.prof->mark(s);  // its last event
  CUDA_CHECK(cudaEventRecord(m.ev_out, s));
  CUDA_CHECK(cudaStreamWaitEvent(stream, m.ev_out, 0));
}

OpProfile DiTGpu::profile_forward(int expert, const DiTShape& shape, const DiTInputs& in, float* out,
                                  cudaStream_t stream) {
  Impl& m = *impl_;
  CUDA_CHECK(cudaSetDevice(m.opt.device));
  WAN_CHECK(m.opt.parallel.degrees().seq() == 1, "DiT GPU profile_forward: a sequence split over ",
            m.opt.parallel.degrees().seq(), " ranks is not profiled (its self-attention is not bracketed); profile "
            "the single-GPU or CFG-parallel forward");
  // Events inside a capture would become graph nodes that the host cannot read per op afterwards.
  for (cudaStream_t st : {stream, m.stream}) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(st, &cs));
    WAN_CHECK(cs == cudaStreamCaptureStatusNone, "DiT GPU profile_forward: the stream is being captured into a CUDA "
              "graph; the op profile times an eager forward and reads its events on the host, so it cannot run "
              "inside a capture (profile outside it)");
  }
  const Impl::Key key = Impl::key_of(expert, shape, geometry(m.cfg, shape, m.par));
  if (!m.warmed.count(key)) m.forward(expert, shape, in, out, stream, true);  // builds the plans, untimed
  if (!m.profiler) m.profiler = std::make_unique<Impl::OpProfiler>();
  Impl::OpProfiler& p = *m.profiler;
  p.reserve(Impl::profile_events(m.cfg.num_layers, m.chunk_units(geometry(m.cfg, shape, m.par))));
  p.used = 0;
  p.spans.clear();
  p.spans.reserve(p.events.size() / 2);
  m.prof = &p;
  try {
    m.forward(expert, shape, in, out, stream, true);
  } catch (...) {
    m.prof = nullptr;
    throw;
  }
  m.prof = nullptr;
  WAN_ASSERT(p.used >= 2, "op profiler: no events recorded");
  CUDA_CHECK(cudaEventSynchronize(p.events[p.used - 1]));
  auto elapsed = [&](size_t a, size_t b) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, p.events[a], p.events[b]));
    return static_cast<double>(ms);
  };
  OpProfile r;
  r.layers = m.cfg.num_layers;
  r.total_ms = elapsed(0, p.used - 1);
  for (const Impl::OpProfiler::Span& sp : p.spans) {
    const double ms = elapsed(sp.begin, sp.end);
    switch (sp.cat) {
      case Impl::OpCat::Gemm: r.gemm_ms += ms, ++r.gemms; break;
      case Impl::OpCat::SelfAttention: r.self_attention_ms += ms, ++r.self_attentions; break;
      case Impl::OpCat::CrossAttention: r.cross_attention_ms += ms, ++r.cross_attentions; break;
    }
  }
  return r;
}

DiTGpu::Attention DiTGpu::parse_attention(const std::string& s) {
  if (s == "auto") return Attention::Auto;
  if (s == "cudnn") return Attention::Cudnn;
  if (s == "own") return Attention::Own;
  if (s == "own-fp8") return Attention::OwnFp8;
  WAN_THROW("--attention: expected auto, cudnn, own or own-fp8, got '", s, "'");
}

DiTGpu::Attention DiTGpu::resolve_attention(Attention a) {
  if (a == Attention::Cudnn) return a;
  if (a == Attention::OwnFp8) {
    WAN_CHECK(OwnAttentionFp8::supported(), "--attention own-fp8: the FP8 attention kernel needs an sm_90 (Hopper) "
                                            "GPU built with the sm_90a target");
    return a;
  }
  const bool own_ok = OwnAttention::supported();
  if (a == Attention::Own) {
    WAN_CHECK(own_ok, "--attention own: the engine's attention kernel needs an sm_90 (Hopper) GPU built with the "
                      "sm_90a target; use --attention cudnn");
    return a;
  }
  return own_ok ? Attention::Own : Attention::Cudnn;
}

DiTGpu::Attention DiTGpu::attention() const { return impl_->opt.attention; }
DiTGpu::Gemm DiTGpu::gemm() const { return impl_->opt.gemm; }

const MemoryPlan& DiTGpu::memory_plan() const { return impl_->plan; }
const DiTConfig& DiTGpu::config() const { return impl_->cfg; }
int DiTGpu::experts() const { return static_cast<int>(impl_->ptrs.size()); }
void DiTGpu::set_use_graphs(bool on) { impl_->opt.use_graphs = on; }
size_t DiTGpu::graphs_captured() const { return impl_->graphs.size(); }

Tensor DiTGpu::download_weight(int expert, const std::string& official_name) const {
  const Impl& m = *impl_;
  WAN_CHECK(expert >= 0 && expert < static_cast<int>(m.ptrs.size()), "DiT GPU: expert ", expert, " of ",
            m.ptrs.size());
  CUDA_CHECK(cudaSetDevice(m.opt.device));
  CUDA_CHECK(cudaStreamSynchronize(m.stream));
  return m.download(expert, official_name);
}

void* DiTGpu::weight_allocation(int expert, size_t* bytes) const {
  const Impl& m = *impl_;
  WAN_CHECK(!m.res, "DiT GPU: the weight allocation of an expert is there only with resident weights (this DiT "
            "runs with ", m.plan.residency.str(), ")");
  WAN_CHECK(expert >= 0 && expert < static_cast<int>(m.weights.size()), "DiT GPU: expert ", expert, " of ",
            m.weights.size());
  if (bytes) *bytes = m.table.bytes;
  return m.weights[static_cast<size_t>(expert)];
}

int DiTGpu::add_weight_loads(int expert, size_t begin, size_t end, const DiTWeightGetter& get,
                             const DiTWeightSpan& span, DeviceLoader& loader, int group,
                             const WeightMergeFn& merge) const {
  size_t bytes = 0;
  char* base = static_cast<char*>(weight_allocation(expert, &bytes));
  const std::string what = cat("DiT expert ", expert);
  int added = 0;
  for (LoadTarget& t : dit_gpu_detail::weight_targets(impl_->table, base, get, what.c_str(), span, group, merge)) {
    const size_t off = static_cast<size_t>(static_cast<char*>(t.dst) - base);
    if (off < begin || off >= end) continue;
    loader.add(std::move(t));
    ++added;
  }
  return added;
}

}  // namespace wan::cuda
