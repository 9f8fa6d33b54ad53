// `wan bench` on the GPU: forward timing of a DiTGpu and the isolated per-op breakdown (see
// dit_bench_gpu.h for the two methods and why they are separate).
#include "bench/dit_bench_gpu.h"

#include <cublasLt.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>

#include "core/error.h"
#include "kernels/attention_cudnn.h"
#include "kernels/attention_own.h"
#include "kernels/check.h"
#include "kernels/dit_kernels.h"
#include "kernels/gemm.h"
#include "kernels/rng.h"

namespace wan::cuda {
namespace {

constexpr size_t kAlign = 256;
constexpr int kRopeMaxPos = 1024;              // the reference's RoPE table (as dit_gpu.cpp)
constexpr size_t kHeadroom = size_t{512} << 20;  // left free for handles and lazily loaded kernels

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

size_t device_used() {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return total_b - free_b;
}

// One device allocation carved into 256-byte aligned buffers, every one filled with random values.
class Slab {
 public:
  struct Req {
    void** out;
    size_t n;       // elements
    bool bf16;      // else f32
    float scale;    // bf16: N(0, scale²); f32 buffers are N(0, 1) (philox_normal_fill has no scale)
  };
  void f32(float** p, size_t n) { reqs_.push_back({reinterpret_cast<void**>(p), n, false, 1.0f}); }
  void b16(bf16** p, size_t n, float scale = 1.0f) { reqs_.push_back({reinterpret_cast<void**>(p), n, true, scale}); }
  void raw(void** p, size_t bytes) { reqs_.push_back({p, bytes, false, 0.0f}); raw_.push_back(reqs_.size() - 1); }
  size_t bytes() const {
    size_t b = 0;
    for (size_t i = 0; i < reqs_.size(); ++i) b += align(size_of(i));
    return b;
  }
  void allocate(uint64_t seed, cudaStream_t s) {
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&base_), bytes()));
    size_t at = 0;
    for (size_t i = 0; i < reqs_.size(); ++i) {
      const Req& r = reqs_[i];
      *r.out = base_ + at;
      if (is_raw(i)) {
        CUDA_CHECK(cudaMemsetAsync(base_ + at, 0, r.n, s));  // workspaces: contents irrelevant
      } else if (r.bf16) {
        philox_normal_fill_bf16(reinterpret_cast<uint16_t*>(base_ + at), r.n, seed + i, 0, r.scale, s);
      } else {
        philox_normal_fill(reinterpret_cast<float*>(base_ + at), r.n, seed + i, 0, s);
      }
      at += align(size_of(i));
    }
  }
  ~Slab() {
    if (base_) cudaFree(base_);
  }

 private:
  static size_t align(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }
  bool is_raw(size_t i) const { return std::find(raw_.begin(), raw_.end(), i) != raw_.end(); }
  size_t size_of(size_t i) const {
    const Req& r = reqs_[i];
    return is_raw(i) ? r.n : r.n * (r.bf16 ? 2 : 4);
  }
  std::vector<Req> reqs_;
  std::vector<size_t> raw_;
  char* base_ = nullptr;
};

struct Op {
  std::string name;
  OpKind kind;
  bool per_block;
  double flops;
  std::function<void(cudaStream_t)> run;
};

}  // namespace

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::Gemm: return "gemm";
    case OpKind::Attention: return "attention";
    case OpKind::Other: return "other";
  }
  return "?";
}

double OpBreakdown::block_ms(OpKind k) const {
  double s = 0;
  for (const OpTime& o : ops)
    if (o.per_block && o.kind == k) s += o.ms;
  return s;
}
double OpBreakdown::nonblock_ms(OpKind k) const {
  double s = 0;
  for (const OpTime& o : ops)
    if (!o.per_block && o.kind == k) s += o.ms;
  return s;
}
double OpBreakdown::block_flops(OpKind k) const {
  double s = 0;
  for (const OpTime& o : ops)
    if (o.per_block && o.kind == k) s += o.flops;
  return s;
}

BenchDevice bench_device(int device) {
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  BenchDevice d;
  d.name = p.name;
  d.sm_count = p.multiProcessorCount;
  d.total_bytes = p.totalGlobalMem;
  CUDA_CHECK(cudaDriverGetVersion(&d.driver_version));
  CUDA_CHECK(cudaRuntimeGetVersion(&d.runtime_version));
#ifdef WAN_HAVE_CUDNN
  d.cudnn_version = static_cast<int>(cudnnGetVersion());
#endif
  d.cublaslt_version = static_cast<int>(cublasLtGetVersion());
  return d;
}

namespace {

// The breakdown's geometry, as DiTGpu computes it (dit_gpu.cpp): rows = B·L tokens, crow = B·text_len
// context rows.
struct Geometry {
  int64_t B, C, Co, T, H, W;
  int pt, ph, pw;
  int64_t f, gh, gw, L, rows, P, K, OP, D, F, TL, TD, FQ, crow, nx, nout;
  float eps;
  bool first_frame;      // DiTShape::first_frame_t: a second timestep for the first patch frame's tokens
  int64_t first_tokens;  // gh·gw: those tokens
};

Geometry breakdown_geometry(const DiTConfig& cfg, const DiTShape& shape) {
  Geometry g;
  const int64_t B = shape.batch, C = cfg.in_dim, Co = cfg.out_dim, T = shape.frames, H = shape.height,
                W = shape.width;
  const int pt = cfg.patch[0], ph = cfg.patch[1], pw = cfg.patch[2];
  WAN_CHECK(T % pt == 0 && H % ph == 0 && W % pw == 0, "bench: latent ", T, "x", H, "x", W,
            " is not a multiple of the patch");
  const int64_t f = T / pt, gh = H / ph, gw = W / pw, L = f * gh * gw, rows = B * L;
  const int64_t P = static_cast<int64_t>(pt) * ph * pw, K = C * P, OP = Co * P;
  const int64_t D = cfg.dim, F = cfg.ffn_dim, TL = cfg.text_len, TD = cfg.text_dim, FQ = cfg.freq_dim;
  const int64_t crow = B * TL, nx = B * C * T * H * W, nout = B * Co * T * H * W;
  g.B = B, g.C = C, g.Co = Co, g.T = T, g.H = H, g.W = W;
  g.pt = pt, g.ph = ph, g.pw = pw;
  g.f = f, g.gh = gh, g.gw = gw, g.L = L, g.rows = rows, g.P = P, g.K = K, g.OP = OP;
  g.D = D, g.F = F, g.TL = TL, g.TD = TD, g.FQ = FQ, g.crow = crow, g.nx = nx, g.nout = nout;
  g.eps = cfg.eps;
  g.first_frame = shape.first_frame_t, g.first_tokens = gh * gw;
  return g;
}

// Activations (names as in dit_gpu.cpp's arena), one block's weights and the non-block weights.
struct Buffers {
  float *x_src, *x_in, *t, *sinus, *temb, *e, *e_silu, *e0, *resid, *head_out, *out, *out_dst, *rope;
  bf16 *ctx_src, *ctx_in, *ctx_hidden, *ctx, *ckv, *ck, *h, *att, *big;
  float *mod, *n3w, *n3b, *tm0_w, *tm0_b, *tm2_w, *tm2_b, *tp_w, *tp_b, *hmod, *head_w, *head_b;
  bf16 *qkv_w, *qkv_b, *o_w, *o_b, *nq, *nk, *cq_w, *cq_b, *ckv_w, *ckv_b, *co_w, *co_b, *cnq, *cnk;
  bf16 *f0_w, *f0_b, *f2_w, *f2_b, *pe_w, *pe_b, *te0_w, *te0_b, *te2_w, *te2_b;
  void *gemm_ws, *attn_ws_ptr;
  float *t_first, *e_first, *e0_first;  // Geometry::first_frame only (else null)
};

// Chunk k of a block's modulation + e0, and the head's shift (0) / scale (1), as the forward builds them
// (dit_gpu_time.cpp): with a first-frame timestep the tokens of the first patch frame read its rows.
ModVec block_chunk(const Geometry& g, const Buffers& b, int k) {
  ModVec m{b.mod + k * g.D, b.e0 + k * g.D, 6 * g.D, g.L};
  if (g.first_frame) m.e_first = b.e0_first + k * g.D, m.first_tokens = g.first_tokens;
  return m;
}
ModVec head_chunk(const Geometry& g, const Buffers& b, int k) {
  ModVec m{b.hmod + k * g.D, b.e, g.D, g.L};
  if (g.first_frame) m.e_first = b.e_first, m.first_tokens = g.first_tokens;
  return m;
}

// Requests every buffer from the slab. The order fixes each buffer's random stream (seed + index).
void reserve_buffers(const Geometry& g, size_t attn_ws, Slab& sl, Buffers& b) {
  const int64_t B = g.B, rows = g.rows, crow = g.crow, nx = g.nx, nout = g.nout, D = g.D, F = g.F, K = g.K,
                OP = g.OP, TD = g.TD, FQ = g.FQ;
  const auto u = [](int64_t v) { return static_cast<size_t>(v); };
  const auto wscale = [](int64_t fan_in) { return static_cast<float>(1.0 / std::sqrt(3.0 * fan_in)); };
  sl.f32(&b.x_src, u(nx)), sl.f32(&b.x_in, u(nx)), sl.f32(&b.t, u(B)), sl.f32(&b.sinus, u(B * FQ));
  sl.f32(&b.temb, u(B * D)), sl.f32(&b.e, u(B * D)), sl.f32(&b.e_silu, u(B * D)), sl.f32(&b.e0, u(B * 6 * D));
  sl.f32(&b.resid, u(rows * D)), sl.f32(&b.head_out, u(rows * OP)), sl.f32(&b.out, u(nout));
  sl.f32(&b.out_dst, u(nout));
  sl.f32(&b.rope, u(kRopeMaxPos * 128));
  sl.b16(&b.ctx_src, u(crow * TD), 0.2f), sl.b16(&b.ctx_in, u(crow * TD)), sl.b16(&b.ctx_hidden, u(crow * D));
  sl.b16(&b.ctx, u(crow * D)), sl.b16(&b.ckv, u(crow * 2 * D)), sl.b16(&b.ck, u(crow * D));
  sl.b16(&b.h, u(rows * D)), sl.b16(&b.att, u(rows * D));
  sl.b16(&b.big, u(rows * std::max({5 * D, F, 2 * D, K})));  // qkv|q|k, the FFN hidden, fp32 head input
  sl.f32(&b.mod, u(6 * D)), sl.f32(&b.n3w, u(D)), sl.f32(&b.n3b, u(D));
  sl.f32(&b.tm0_w, u(D * FQ)), sl.f32(&b.tm0_b, u(D)), sl.f32(&b.tm2_w, u(D * D)), sl.f32(&b.tm2_b, u(D));
  sl.f32(&b.tp_w, u(6 * D * D)), sl.f32(&b.tp_b, u(6 * D)), sl.f32(&b.hmod, u(2 * D));
  sl.f32(&b.head_w, u(OP * D)), sl.f32(&b.head_b, u(OP));
  sl.b16(&b.qkv_w, u(3 * D * D), wscale(D)), sl.b16(&b.qkv_b, u(3 * D), wscale(D));
  sl.b16(&b.o_w, u(D * D), wscale(D)), sl.b16(&b.o_b, u(D), wscale(D)), sl.b16(&b.nq, u(D)), sl.b16(&b.nk, u(D));
  sl.b16(&b.cq_w, u(D * D), wscale(D)), sl.b16(&b.cq_b, u(D), wscale(D));
  sl.b16(&b.ckv_w, u(2 * D * D), wscale(D)), sl.b16(&b.ckv_b, u(2 * D), wscale(D));
  sl.b16(&b.co_w, u(D * D), wscale(D)), sl.b16(&b.co_b, u(D), wscale(D)), sl.b16(&b.cnq, u(D));
  sl.b16(&b.cnk, u(D));
  sl.b16(&b.f0_w, u(F * D), wscale(D)), sl.b16(&b.f0_b, u(F), wscale(D));
  sl.b16(&b.f2_w, u(D * F), wscale(F)), sl.b16(&b.f2_b, u(D), wscale(F));
  sl.b16(&b.pe_w, u(D * K), wscale(K)), sl.b16(&b.pe_b, u(D), wscale(K));
  sl.b16(&b.te0_w, u(D * TD), wscale(TD)), sl.b16(&b.te0_b, u(D), wscale(TD));
  sl.b16(&b.te2_w, u(D * D), wscale(D)), sl.b16(&b.te2_b, u(D), wscale(D));
  sl.raw(&b.gemm_ws, GemmRunner::kWorkspaceBytes);
  sl.raw(&b.attn_ws_ptr, std::max<size_t>(attn_ws, 256));
  if (g.first_frame) sl.f32(&b.t_first, u(B)), sl.f32(&b.e_first, u(B * D)), sl.f32(&b.e0_first, u(B * 6 * D));
}

// What the ops run with: the allocated buffers, the GEMM runner and the attention kernels.
struct OpEnv {
  const Geometry& g;
  const Buffers& b;
  GemmRunner& gemm;
  CudnnAttention& attn;
  AttentionShape ss, cs;  // self, cross
  size_t attn_ws = 0;
  bool own = false;
};

// The op sequence of one forward: non-block prologue, one block, head (dit_gpu.cpp run_body/block).
struct OpList {
  std::vector<Op> ops;
  size_t first_block = 0, end_block = 0;  // the block's ops: [first_block, end_block)
  void add(std::string name, OpKind kind, bool per_block, double flops, std::function<void(cudaStream_t)> fn) {
    ops.push_back({std::move(name), kind, per_block, flops, std::move(fn)});
  }
};
constexpr OpKind G = OpKind::Gemm, A = OpKind::Attention, O = OpKind::Other;

// Input staging, patch, time and text embeddings, and block 0's norm1.
void add_prologue_ops(const OpEnv& env, OpList& l) {
  const Geometry& g = env.g;
  const Buffers& b = env.b;
  GemmRunner& gemm = env.gemm;
  const int64_t B = g.B, C = g.C, T = g.T, H = g.H, W = g.W, L = g.L, rows = g.rows, K = g.K, D = g.D, TD = g.TD,
                FQ = g.FQ, crow = g.crow, nx = g.nx;
  const int pt = g.pt, ph = g.ph, pw = g.pw;
  const float eps = g.eps;
  const auto u = [](int64_t v) { return static_cast<size_t>(v); };
  const double fl_rows = 2.0 * static_cast<double>(rows);
  const double fl_crow = 2.0 * static_cast<double>(crow);
  const double Dd = static_cast<double>(D);
  const auto chunk = [=](int k) { return block_chunk(g, b, k); };
  l.add("stage inputs (x, t, context copies)", O, false, 0, [=](cudaStream_t st) {
    CUDA_CHECK(cudaMemcpyAsync(b.x_in, b.x_src, u(nx) * 4, cudaMemcpyDeviceToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(b.ctx_in, b.ctx_src, u(crow * TD) * 2, cudaMemcpyDeviceToDevice, st));
  });
  l.add("patchify", O, false, 0,
        [=](cudaStream_t st) { patchify_bf16(b.x_in, b.big, B, C, T, H, W, pt, ph, pw, L, st); });
  l.add("patch embedding GEMM", G, false, fl_rows * K * Dd,
        [=, &gemm](cudaStream_t st) { gemm.linear(b.big, b.pe_w, b.pe_b, b.h, rows, K, D, Act::None, st); });
  l.add("patch rows to fp32 residual", O, false, 0,
        [=](cudaStream_t st) { convert_bf16_to_f32(b.h, b.resid, rows * D, st); });
  // The time MLP and projection of one timestep per sample: t's, then t_first's (first-frame tokens).
  const auto time_ops = [&](const char* of, const float* t, float* e, float* e0) {
    l.add(cat("time embedding", of, " (sinusoid, silu)"), O, false, 0,
          [=](cudaStream_t st) { timestep_embedding(t, B, FQ, b.sinus, st); });
    l.add(cat("time MLP + projection GEMMs", of, " (fp32)"), G, false, 2.0 * B * (FQ * Dd + Dd * Dd + 6 * Dd * Dd),
          [=, &gemm](cudaStream_t st) {
            gemm.linear(b.sinus, b.tm0_w, b.tm0_b, b.temb, B, FQ, D, Act::None, st);
            silu(b.temb, b.temb, B * D, st);
            gemm.linear(b.temb, b.tm2_w, b.tm2_b, e, B, D, D, Act::None, st);
            silu(e, b.e_silu, B * D, st);
            gemm.linear(b.e_silu, b.tp_w, b.tp_b, e0, B, D, 6 * D, Act::None, st);
          });
  };
  time_ops("", b.t, b.e, b.e0);
  if (g.first_frame) time_ops(" of t_first", b.t_first, b.e_first, b.e0_first);
  l.add("text embedding GEMMs", G, false, fl_crow * (TD * Dd + Dd * Dd), [=, &gemm](cudaStream_t st) {
    gemm.linear(b.ctx_in, b.te0_w, b.te0_b, b.ctx_hidden, crow, TD, D, Act::GeluTanh, st);
    gemm.linear(b.ctx_hidden, b.te2_w, b.te2_b, b.ctx, crow, D, D, Act::None, st);
  });
  // Block 0's norm1 runs before the blocks; every later norm1 is fused into the previous block's last
  // residual add. The model below counts that fused op in every block, the forward runs the last
  // block's add unfused (gated_residual_add): one bf16 output pass per forward less than modelled.
  l.add("norm1 LN + modulate (block 0)", O, false, 0,
        [=](cudaStream_t st) { layernorm_modulate(b.resid, b.h, rows, D, chunk(0), chunk(1), eps, st); });
}

// One transformer block: self-attention, cross-attention, FFN, and the next block's fused norm1.
void add_block_ops(const OpEnv& env, OpList& l) {
  const Geometry& g = env.g;
  const Buffers& b = env.b;
  GemmRunner& gemm = env.gemm;
  CudnnAttention& attn = env.attn;
  const AttentionShape ss = env.ss, cs = env.cs;
  const size_t attn_ws = env.attn_ws;
  const bool own = env.own;
  const int64_t B = g.B, L = g.L, rows = g.rows, D = g.D, F = g.F, TL = g.TL, crow = g.crow;
  const float eps = g.eps;
  const double fl_rows = 2.0 * static_cast<double>(rows);
  const double fl_crow = 2.0 * static_cast<double>(crow);
  const double Dd = static_cast<double>(D), Fd = static_cast<double>(F);
  const auto chunk = [=](int k) { return block_chunk(g, b, k); };
  bf16* qkv = b.big;
  bf16* q = b.big + rows * 3 * D;
  bf16* k = b.big + rows * 4 * D;
  bf16* ffn = b.big;
  RopeArgs ra;
  ra.table = b.rope, ra.max_pos = kRopeMaxPos, ra.head_dim = 128, ra.seq = L, ra.f = g.f, ra.h = g.gh, ra.w = g.gw;
  l.first_block = l.ops.size();
  l.add("self q|k|v GEMM", G, true, fl_rows * Dd * 3 * Dd,
        [=, &gemm](cudaStream_t st) { gemm.linear(b.h, b.qkv_w, b.qkv_b, qkv, rows, D, 3 * D, Act::None, st); });
  l.add("self q/k RMSNorm + RoPE", O, true, 0, [=](cudaStream_t st) {
    const RmsNormJob jq{qkv, 3 * D, b.nq, q, rows}, jk{qkv + D, 3 * D, b.nk, k, rows};
    qk_rmsnorm_rope(jq, &jk, D, eps, &ra, st);
  });
  l.add(own ? "self-attention (own)" : "self-attention (cuDNN)", A, true, 4.0 * B * static_cast<double>(L) * L * Dd,
        [=, &attn](cudaStream_t st) {
          AttentionArgs a;
          a.q = q, a.k = k, a.v = qkv + 2 * D, a.o = b.att;
          if (own) OwnAttention::run(ss, a, st);
          else attn.run(ss, a, b.attn_ws_ptr, attn_ws, st);
        });
  l.add("self o GEMM", G, true, fl_rows * Dd * Dd,
        [=, &gemm](cudaStream_t st) { gemm.linear(b.att, b.o_w, b.o_b, q, rows, D, D, Act::None, st); });
  l.add("gated residual add (attn) + norm3 LN (affine)", O, true, 0, [=](cudaStream_t st) {
    const ModVec gate = chunk(2);
    residual_add_layernorm_affine(b.resid, q, &gate, b.n3w, b.n3b, b.h, rows, D, eps, st);
  });
  l.add("cross q GEMM", G, true, fl_rows * Dd * Dd,
        [=, &gemm](cudaStream_t st) { gemm.linear(b.h, b.cq_w, b.cq_b, q, rows, D, D, Act::None, st); });
  l.add("cross k|v GEMM (text)", G, true, fl_crow * Dd * 2 * Dd,
        [=, &gemm](cudaStream_t st) { gemm.linear(b.ctx, b.ckv_w, b.ckv_b, b.ckv, crow, D, 2 * D, Act::None, st); });
  l.add("cross q/k RMSNorm", O, true, 0, [=](cudaStream_t st) {
    const RmsNormJob cq{q, D, b.cnq, q, rows}, cjk{b.ckv, 2 * D, b.cnk, b.ck, crow};
    qk_rmsnorm_rope(cq, &cjk, D, eps, nullptr, st);
  });
  l.add(own ? "cross-attention (own)" : "cross-attention (cuDNN)", A, true,
        4.0 * B * static_cast<double>(L) * TL * Dd, [=, &attn](cudaStream_t st) {
          AttentionArgs a;
          a.q = q, a.k = b.ck, a.v = b.ckv + D, a.o = b.att;
          if (own) OwnAttention::run(cs, a, st);
          else attn.run(cs, a, b.attn_ws_ptr, attn_ws, st);
        });
  l.add("cross o GEMM", G, true, fl_rows * Dd * Dd,
        [=, &gemm](cudaStream_t st) { gemm.linear(b.att, b.co_w, b.co_b, q, rows, D, D, Act::None, st); });
  l.add("residual add (cross) + norm2 LN + modulate", O, true, 0, [=](cudaStream_t st) {
    residual_add_layernorm_modulate(b.resid, q, nullptr, b.h, rows, D, chunk(3), chunk(4), eps, st);
  });
  l.add("FFN up GEMM + GELU", G, true, fl_rows * Dd * Fd,
        [=, &gemm](cudaStream_t st) { gemm.linear(b.h, b.f0_w, b.f0_b, ffn, rows, D, F, Act::GeluTanh, st); });
  l.add("FFN down GEMM", G, true, fl_rows * Fd * Dd,
        [=, &gemm](cudaStream_t st) { gemm.linear(ffn, b.f2_w, b.f2_b, b.att, rows, F, D, Act::None, st); });
  l.add("gated residual add (FFN) + next norm1 LN + modulate", O, true, 0, [=](cudaStream_t st) {
    const ModVec gate = chunk(5);  // the next block's norm1 modulation: this block's (same shapes)
    residual_add_layernorm_modulate(b.resid, b.att, &gate, b.h, rows, D, chunk(0), chunk(1), eps, st);
  });
  l.end_block = l.ops.size();
}

// The head (fp32) and the output staging.
void add_head_ops(const OpEnv& env, OpList& l) {
  const Geometry& g = env.g;
  const Buffers& b = env.b;
  GemmRunner& gemm = env.gemm;
  const int64_t B = g.B, Co = g.Co, L = g.L, rows = g.rows, D = g.D, OP = g.OP, nout = g.nout;
  const float eps = g.eps;
  const auto u = [](int64_t v) { return static_cast<size_t>(v); };
  const double fl_rows = 2.0 * static_cast<double>(rows);
  const double Dd = static_cast<double>(D);
  float* head_in = reinterpret_cast<float*>(b.big);
  l.add("head LN + modulate (fp32)", O, false, 0, [=](cudaStream_t st) {
    layernorm_modulate(b.resid, head_in, rows, D, head_chunk(g, b, 0), head_chunk(g, b, 1), eps, st);
  });
  l.add("head GEMM (fp32)", G, false, fl_rows * Dd * OP,
        [=, &gemm](cudaStream_t st) { gemm.linear(head_in, b.head_w, b.head_b, b.head_out, rows, D, OP, Act::None, st); });
  l.add("unpatchify + output copy", O, false, 0, [=](cudaStream_t st) {
    unpatchify(b.head_out, b.out, B, L, Co, g.f, g.gh, g.gw, g.pt, g.ph, g.pw, st);
    CUDA_CHECK(cudaMemcpyAsync(b.out_dst, b.out, u(nout) * 4, cudaMemcpyDeviceToDevice, st));
  });
}

// Runs the op list on one stream with an event before the first op and after each, and turns the
// events into per-op medians.
struct OpTimer {
  const OpList& l;
  cudaStream_t s;
  std::vector<cudaEvent_t>& ev;
  int reps;

  // One pass (external event-record nodes when captured, so the replayed graph records them too).
  void pass(bool capturing) {
    auto rec = [&](size_t i) {
      if (capturing) CUDA_CHECK(cudaEventRecordWithFlags(ev[i], s, cudaEventRecordExternal));
      else CUDA_CHECK(cudaEventRecord(ev[i], s));
    };
    rec(0);
    for (size_t i = 0; i < l.ops.size(); ++i) {
      l.ops[i].run(s);
      rec(i + 1);
    }
  }
  OpBreakdown collect(const std::string& mode, const std::function<void()>& launch) {
    const std::vector<Op>& ops = l.ops;
    std::vector<std::vector<double>> ms(ops.size());
    std::vector<double> block_ms;
    for (int rep = 0; rep < reps; ++rep) {
      launch();
      CUDA_CHECK(cudaStreamSynchronize(s));
      CUDA_CHECK(cudaGetLastError());
      for (size_t i = 0; i < ops.size(); ++i) {
        float m = 0;
        CUDA_CHECK(cudaEventElapsedTime(&m, ev[i], ev[i + 1]));
        ms[i].push_back(m);
      }
      float b = 0;
      CUDA_CHECK(cudaEventElapsedTime(&b, ev[l.first_block], ev[l.end_block]));
      block_ms.push_back(b);
    }
    OpBreakdown br;
    br.mode = mode;
    br.reps = reps;
    br.block_total_ms = median(block_ms);
    for (size_t i = 0; i < ops.size(); ++i)
      br.ops.push_back({ops[i].name, ops[i].kind, ops[i].per_block, median(ms[i]), ops[i].flops});
    return br;
  }
};

// Captures one pass as a CUDA graph and times its replays. A failed capture leaves the eager numbers
// standing and says why the graph ones are missing.
void time_graph(OpTimer& timer, cudaGraphExec_t& exec, IsolatedTimings& result) {
  cudaStream_t s = timer.s;
  try {
    cudaGraph_t g = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    try {
      timer.pass(true);
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(s, &broken);
      if (broken) cudaGraphDestroy(broken);
      throw;
    }
    CUDA_CHECK(cudaStreamEndCapture(s, &g));
    const cudaError_t st = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    CUDA_CHECK(st);
    result.graph = timer.collect("graph", [&] { CUDA_CHECK(cudaGraphLaunch(exec, s)); });
  } catch (const Error& err) {
    cudaGetLastError();
    result.graph_error = err.what();
  }
}

}  // namespace

IsolatedTimings time_ops_isolated(const DiTConfig& cfg, const DiTShape& shape, int reps, uint64_t seed, int device,
                                  DiTGpu::Attention attention) {
  WAN_CHECK(reps >= 1, "bench: breakdown reps must be >= 1");
  CUDA_CHECK(cudaSetDevice(device));
  const DiTGpu::Attention resolved = DiTGpu::resolve_attention(attention);
  WAN_CHECK(resolved != DiTGpu::Attention::OwnFp8, "bench: the isolated per-op breakdown times bf16 ops only");
  const bool own = resolved == DiTGpu::Attention::Own;
  const Geometry g = breakdown_geometry(cfg, shape);

  CudnnAttention attn;
  AttentionShape ss;  // self: q, k dense [rows, D]; v the last third of the fused qkv rows
  ss.B = g.B, ss.Lq = g.L, ss.Lk = g.L, ss.H = cfg.num_heads, ss.D = 128, ss.v_ld = 3 * g.D;
  AttentionShape cs;  // cross: all text_len keys; v the second half of the fused k|v rows
  cs.B = g.B, cs.Lq = g.L, cs.Lk = g.TL, cs.H = cfg.num_heads, cs.D = 128, cs.v_ld = 2 * g.D;
  const size_t attn_ws = own ? 0 : std::max(attn.workspace_size(ss), attn.workspace_size(cs));

  Buffers b{};
  Slab sl;
  reserve_buffers(g, attn_ws, sl, b);
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  WAN_CHECK(sl.bytes() + kHeadroom <= free_b, "bench: the per-op breakdown needs ", sl.bytes() >> 20,
            " MiB of device memory (activations of batch ", g.B, " x ", g.L, " tokens and one block), only ",
            free_b >> 20, " MiB free; run with --no-breakdown or a smaller size");

  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<cudaEvent_t> ev;
  cudaGraphExec_t exec = nullptr;
  IsolatedTimings result;
  try {
    sl.allocate(seed, s);
    const std::vector<float> rope_host = rope_table_f32(128, kRopeMaxPos);
    CUDA_CHECK(cudaMemcpyAsync(b.rope, rope_host.data(), rope_host.size() * 4, cudaMemcpyHostToDevice, s));
    GemmRunner gemm(b.gemm_ws, GemmRunner::kWorkspaceBytes);

    const OpEnv env{g, b, gemm, attn, ss, cs, attn_ws, own};
    OpList l;
    add_prologue_ops(env, l);
    add_block_ops(env, l);
    add_head_ops(env, l);

    ev.resize(l.ops.size() + 1);
    for (cudaEvent_t& x : ev) CUDA_CHECK(cudaEventCreate(&x));
    OpTimer timer{l, s, ev, reps};
    result.self_attention_engine = own ? "own (sm_90a TMA + wgmma, warp-specialised)" : attn.describe(ss);
    timer.pass(false);  // warm-up: builds every GEMM and attention plan (never inside a capture)
    CUDA_CHECK(cudaStreamSynchronize(s));
    result.eager = timer.collect("eager", [&] { timer.pass(false); });
    time_graph(timer, exec, result);
  } catch (...) {
    cudaStreamSynchronize(s);
    if (exec) cudaGraphExecDestroy(exec);
    for (cudaEvent_t x : ev)
      if (x) cudaEventDestroy(x);
    cudaStreamDestroy(s);
    throw;
  }
  CUDA_CHECK(cudaStreamSynchronize(s));
  if (exec) CUDA_CHECK(cudaGraphExecDestroy(exec));
  for (cudaEvent_t x : ev) CUDA_CHECK(cudaEventDestroy(x));
  CUDA_CHECK(cudaStreamDestroy(s));
  return result;
}

ForwardTiming time_forward(const DiTConfig& cfg, const DiTShape& shape, int warmup, int steps, bool graphs,
                           uint64_t seed, int device, bool verbose, DiTGpu::Attention attention,
                           const DiTGpu::Options::Parallel& parallel, const AfterSteps& after_steps,
                           DiTGpu::Gemm gemm, WeightResidency residency, int experts) {
  WAN_CHECK(warmup >= 1, "bench: --warmup must be >= 1 (the first forward builds the plans)");
  WAN_CHECK(steps >= 1, "bench: --steps must be >= 1");
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaFree(nullptr));  // the context exists before the baseline reading
  ForwardTiming r;
  r.layers = cfg.num_layers;
  r.graphs = graphs;
  r.device_used_before = device_used();
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  DiTGpu::Options opt;
  opt.device = device;
  opt.use_graphs = graphs;
  opt.verbose = verbose;
  opt.attention = attention;
  opt.parallel = parallel;
  opt.gemm = gemm;
  opt.residency = residency;
  std::vector<DiTWeightSource> sources;
  for (int e = 0; e < experts; ++e) sources.push_back(DiTWeightSource::random_weights(seed + static_cast<uint64_t>(e)));
  DiTGpu gpu = DiTGpu::create(cfg, sources, shape, opt);
  r.plan = gpu.memory_plan();

  const int64_t B = shape.batch, TL = cfg.text_len;
  const size_t nx = static_cast<size_t>(B * cfg.in_dim * shape.frames * shape.height * shape.width);
  const size_t nout = static_cast<size_t>(B * cfg.out_dim * shape.frames * shape.height * shape.width);
  const size_t nctx = static_cast<size_t>(B * TL * cfg.text_dim);
  float *x = nullptr, *out = nullptr;
  uint16_t* ctx = nullptr;
  cudaStream_t s = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  auto cleanup = [&] {
    if (s) cudaStreamSynchronize(s);
    if (x) cudaFree(x);
    if (out) cudaFree(out);
    if (ctx) cudaFree(ctx);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (s) cudaStreamDestroy(s);
  };
  try {
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&x), nx * 4));
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), nout * 4));
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ctx), nctx * 2));
    // Random latents and text states on the device: the step reads them like the sampler's buffers.
    philox_normal_fill(x, nx, seed ^ 0x5EED0001ULL, 0, s);
    philox_normal_fill_bf16(ctx, nctx, seed ^ 0x5EED0002ULL, 0, 0.2f, s);
    CUDA_CHECK(cudaStreamSynchronize(s));
    r.create_s = std::chrono::duration<double>(clock::now() - t0).count();
    r.device_used_peak = device_used();

    const std::vector<float> tsteps(static_cast<size_t>(B), kBenchTimestep);  // one timestep for cond and uncond
    const std::vector<float> tfirst(static_cast<size_t>(B), kBenchFirstFrameTimestep);
    const std::vector<int64_t> lens(static_cast<size_t>(B), TL);  // zero padding costs the same
    DiTInputs in;
    in.x = x, in.t = tsteps.data(), in.context = ctx, in.context_dtype = DType::BF16;
    if (shape.first_frame_t) in.t_first = tfirst.data();
    in.ctx_rows = TL, in.ctx_lens = lens.data();

    t0 = clock::now();
    for (int i = 0; i < warmup; ++i) {
      gpu.forward(0, shape, in, out, s);
      CUDA_CHECK(cudaStreamSynchronize(s));
      r.device_used_peak = std::max(r.device_used_peak, device_used());
    }
    r.warmup_s = std::chrono::duration<double>(clock::now() - t0).count();
    for (int i = 0; i < steps; ++i) {
      CUDA_CHECK(cudaEventRecord(e0, s));
      gpu.forward(0, shape, in, out, s);
      CUDA_CHECK(cudaEventRecord(e1, s));
      CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      r.step_ms.push_back(ms);
      r.device_used_peak = std::max(r.device_used_peak, device_used());
    }
    if (after_steps) after_steps(gpu, in, out, s);
    // A NaN-free output shows the forward really ran on these inputs (random weights keep it finite).
    std::vector<float> probe(std::min<size_t>(nout, 4096));
    CUDA_CHECK(cudaMemcpy(probe.data(), out, probe.size() * 4, cudaMemcpyDeviceToHost));
    for (float v : probe) WAN_CHECK(std::isfinite(v), "bench: the forward produced a non-finite output");
  } catch (...) {
    cleanup();
    throw;
  }
  cleanup();
  r.median_ms = median(r.step_ms);
  double sum = 0;
  for (double v : r.step_ms) sum += v;
  r.mean_ms = sum / static_cast<double>(r.step_ms.size());
  r.min_ms = *std::min_element(r.step_ms.begin(), r.step_ms.end());
  return r;
}

const char* attention_label(DiTGpu::Attention a) {
  switch (a) {
    case DiTGpu::Attention::Own: return "own";
    case DiTGpu::Attention::OwnFp8: return "own-fp8";
    default: return "cudnn";
  }
}

double forward_error_vs_exact(const DiTConfig& cfg, const DiTShape& shape, uint64_t seed, int device,
                              DiTGpu::Attention attention, DiTGpu::Gemm gemm) {
  auto output = [&](DiTGpu::Attention a, DiTGpu::Gemm g) {
    std::vector<float> host;
    const AfterSteps grab = [&](DiTGpu&, const DiTInputs&, float* out, cudaStream_t s) {
      host.resize(static_cast<size_t>(shape.batch * cfg.out_dim * shape.frames * shape.height * shape.width));
      CUDA_CHECK(cudaStreamSynchronize(s));
      CUDA_CHECK(cudaMemcpy(host.data(), out, host.size() * 4, cudaMemcpyDeviceToHost));
    };
    (void)time_forward(cfg, shape, 1, 1, true, seed, device, false, a, {}, grab, g);
    return host;
  };
  const std::vector<float> lossy = output(attention, gemm);
  const std::vector<float> exact = output(DiTGpu::Attention::Auto, DiTGpu::Gemm::Bf16);
  double num = 0, den = 0;
  for (size_t i = 0; i < exact.size(); ++i) {
    const double d = static_cast<double>(lossy[i]) - exact[i];
    num += d * d;
    den += static_cast<double>(exact[i]) * exact[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace wan::cuda
