// CPU float32 forward of the official WanModel (spec §2), composed from wan::ops.
// Layout: the residual stream is [B, S, D] (S = seq_len rows per sample, the first L = f·h·w real);
// modulation tensors are [B, Lt, 6, D] with Lt = 1 (per-sample timestep, broadcast with stride 0)
// or Lt = S (per-token timestep), which is numerically the official [B] -> [B, seq_len] expansion.
#include "models/dit/dit_cpu.h"

#include <cmath>
#include <cstring>
#include <map>

#include "core/dtype.h"
#include "core/error.h"
#include "models/dit/weights.h"
#include "ops/cpu_ops.h"
#include "ops/fp8_ref.h"

namespace wan {

namespace {

// Loads by name with the shape the weight table gives (models/dit/weights.h), checked and up-cast to f32.
class Loader {
 public:
  Loader(const DiTConfig& cfg, const DiTWeightFn& get) : shapes_(dit_expected_shapes(cfg)), get_(get) {}
  Tensor operator()(const std::string& name) const {
    auto it = shapes_.find(name);
    WAN_ASSERT(it != shapes_.end(), "DiT weight ", name, " is not in the weight table");
    Tensor t;
    WAN_WITH_CONTEXT(cat("DiT weight ", name), t = get_(name));
    WAN_CHECK(t.defined(), "DiT weight ", name, ": missing");
    WAN_CHECK(t.shape() == it->second, "DiT weight ", name, ": shape ", t.shape().str(), ", expected ",
              it->second.str());
    if (t.dtype() != DType::F32 || !t.view().is_contiguous()) t = t.to_f32();
    return t;
  }
  DiTLinear linear(const std::string& name) const { return {(*this)(name + ".weight"), (*this)(name + ".bias")}; }
  DiTAttention attention(const std::string& p) const {
    DiTAttention a;
    a.q = linear(p + ".q");
    a.k = linear(p + ".k");
    a.v = linear(p + ".v");
    a.o = linear(p + ".o");
    a.norm_q = (*this)(p + ".norm_q.weight");
    a.norm_k = (*this)(p + ".norm_k.weight");
    return a;
  }

 private:
  std::map<std::string, Shape> shapes_;
  const DiTWeightFn& get_;
};

const float* fp(const Tensor& t) { return static_cast<const float*>(t.data()); }

using Buf = std::vector<float>;

// Copies rows into a fresh tensor for a hook.
void emit(const DiTHook& hook, const std::string& name, const float* data, Shape s) {
  if (!hook) return;
  Tensor t = Tensor::empty(DType::F32, s);
  std::memcpy(t.data(), data, t.nbytes());
  hook(name, t);
}

void linear(const float* x, const DiTLinear& l, float* y, int64_t rows) {
  const int64_t out = l.weight.dim(0), in = l.weight.dim(1);
  ops::linear(x, fp(l.weight), fp(l.bias), y, rows, in, out);
}

// The GPU's FP8 block GEMM (dit_forward's fp8_block_gemms): x rounded to bf16 and quantised per row, the
// weight per output row, the exact scaled sum of ops::linear_fp8_ref.
void linear_fp8(const float* x, const DiTLinear& l, float* y, int64_t rows) {
  const int64_t out = l.weight.dim(0), in = l.weight.dim(1);
  std::vector<float> xb(x, x + rows * in);
  for (float& v : xb) v = bf16_to_f32(f32_to_bf16(v));
  std::vector<uint8_t> xq(static_cast<size_t>(rows * in)), wq(static_cast<size_t>(out * in));
  std::vector<float> xs(static_cast<size_t>(rows)), ws(static_cast<size_t>(out));
  ops::quantize_rows_fp8(xb.data(), rows, in, xq.data(), xs.data());
  ops::quantize_rows_fp8(fp(l.weight), out, in, wq.data(), ws.data());
  ops::linear_fp8_ref(xq.data(), xs.data(), wq.data(), ws.data(), fp(l.bias), y, rows, in, out, false);
}

}  // namespace

DiTWeights load_dit_weights(const DiTConfig& cfg, const DiTWeightFn& get) {
  const Loader load(cfg, get);
  DiTWeights w;
  w.patch_embedding_weight = load("patch_embedding.weight");
  w.patch_embedding_bias = load("patch_embedding.bias");
  w.text_embedding_0 = load.linear("text_embedding.0");
  w.text_embedding_2 = load.linear("text_embedding.2");
  w.time_embedding_0 = load.linear("time_embedding.0");
  w.time_embedding_2 = load.linear("time_embedding.2");
  w.time_projection_1 = load.linear("time_projection.1");
  w.blocks.resize(static_cast<size_t>(cfg.num_layers));
  for (int i = 0; i < cfg.num_layers; ++i) {
    const std::string p = cat("blocks.", i, ".");
    DiTBlock& b = w.blocks[i];
    b.modulation = load(p + "modulation");
    b.self_attn = load.attention(p + "self_attn");
    b.cross_attn = load.attention(p + "cross_attn");
    b.norm3_weight = load(p + "norm3.weight");
    b.norm3_bias = load(p + "norm3.bias");
    b.ffn_0 = load.linear(p + "ffn.0");
    b.ffn_2 = load.linear(p + "ffn.2");
  }
  w.head_modulation = load("head.modulation");
  w.head_head = load.linear("head.head");
  return w;
}

size_t dit_forward_bytes(const DiTConfig& cfg, int64_t B, int64_t S, int64_t Lt, int64_t out_elems) {
  const double D = cfg.dim, F = cfg.ffn_dim, TL = cfg.text_len, TD = cfg.text_dim;
  const double OP = static_cast<double>(cfg.out_dim) * cfg.patch[0] * cfg.patch[1] * cfg.patch[2];
  const double rows = static_cast<double>(B) * static_cast<double>(S), NT = static_cast<double>(B) * Lt;
  const double threads = 256;  // an attention score row per worker thread (more than any pool here)
  const double floats = rows * (7 * D + F + OP) + B * TL * (TD + 4 * D) + NT * (cfg.freq_dim + 16 * D) +
                        threads * static_cast<double>(S) + static_cast<double>(out_elems);
  return floats * 4 > 1.8e19 ? SIZE_MAX : static_cast<size_t>(floats * 4);
}

Tensor dit_forward(const DiTConfig& cfg, const DiTWeights& w, const Tensor& x, const Tensor& t, const Tensor& context,
                   const std::vector<int64_t>& context_lens, int64_t seq_len, const DiTHook& hook,
                   bool fp8_block_gemms) {
  // ---- shapes ----
  WAN_CHECK(x.dtype() == DType::F32 && x.ndim() == 5, "dit_forward: x must be f32 [B, C, T, H, W], got ",
            dtype_name(x.dtype()), " ", x.shape().str());
  const int64_t B = x.dim(0), C = x.dim(1), T = x.dim(2), H = x.dim(3), W = x.dim(4);
  WAN_CHECK(C == cfg.in_dim, "dit_forward: x has ", C, " channels, the model takes in_dim ", cfg.in_dim);
  const int pt = cfg.patch[0], ph = cfg.patch[1], pw = cfg.patch[2];
  WAN_CHECK(T % pt == 0 && H % ph == 0 && W % pw == 0, "dit_forward: latent [", T, ", ", H, ", ", W,
            "] is not a multiple of the patch (", pt, ", ", ph, ", ", pw, ")");
  const int64_t f = T / pt, gh = H / ph, gw = W / pw, L = f * gh * gw;
  const int64_t S = seq_len == 0 ? L : seq_len;
  WAN_CHECK(S >= L, "dit_forward: seq_len ", S, " is smaller than the ", L, " tokens of the latent");
  WAN_CHECK(static_cast<int64_t>(w.blocks.size()) == cfg.num_layers, "dit_forward: weights hold ", w.blocks.size(),
            " blocks, config says ", cfg.num_layers);
  const int64_t D = cfg.dim, F = cfg.ffn_dim, NH = cfg.num_heads, HD = D / NH;
  WAN_CHECK(D % NH == 0 && HD % 2 == 0, "dit_forward: dim ", D, " / heads ", NH, " must give an even head_dim");
  const int64_t P = static_cast<int64_t>(pt) * ph * pw;
  const int64_t TL = cfg.text_len, TD = cfg.text_dim;

  WAN_CHECK(t.dtype() == DType::F32, "dit_forward: t must be f32, got ", dtype_name(t.dtype()));
  int64_t Lt;  // timestep rows per sample
  if (t.ndim() == 1 && t.dim(0) == B) {
    Lt = 1;
  } else if (t.ndim() == 2 && t.dim(0) == B && t.dim(1) == S) {
    Lt = S;
  } else {
    WAN_THROW("dit_forward: t must be [B] = [", B, "] or [B, seq_len] = [", B, ", ", S, "], got ", t.shape().str());
  }
  WAN_CHECK(context.dtype() == DType::F32 && context.ndim() == 3 && context.dim(0) == B && context.dim(2) == TD,
            "dit_forward: context must be f32 [", B, ", <= ", TL, ", ", TD, "], got ", dtype_name(context.dtype()),
            " ", context.shape().str());
  const int64_t LC = context.dim(1);
  WAN_CHECK(static_cast<int64_t>(context_lens.size()) == B, "dit_forward: ", context_lens.size(),
            " context lengths for batch ", B);
  for (int64_t b = 0; b < B; ++b)
    WAN_CHECK(context_lens[b] >= 0 && context_lens[b] <= LC && context_lens[b] <= TL, "dit_forward: context length ",
              context_lens[b], " of sample ", b, " outside [0, min(", LC, ", text_len ", TL, ")]");

  const float* xin = static_cast<const float*>(x.data());
  const float* tin = static_cast<const float*>(t.data());
  const float* cin = static_cast<const float*>(context.data());

  // ---- patch embedding: xs [B, S, D], padding rows zero ----
  Buf xs(static_cast<size_t>(B * S * D), 0.0f);
  for (int64_t b = 0; b < B; ++b)
    ops::patch_embed(xin + b * C * T * H * W, fp(w.patch_embedding_weight), fp(w.patch_embedding_bias),
                     xs.data() + b * S * D, C, T, H, W, D, pt, ph, pw);
  emit(hook, "patch_embed", xs.data(), {B, S, D});

  // ---- time embedding (fp32; sinusoid in float64): e [B·Lt, D], e0 [B·Lt, 6D] ----
  const int64_t NT = B * Lt;
  Buf sinus(static_cast<size_t>(NT * cfg.freq_dim)), e(static_cast<size_t>(NT * D)), tmp(static_cast<size_t>(NT * D));
  Buf e0(static_cast<size_t>(NT * 6 * D));
  ops::timestep_embedding(tin, NT, cfg.freq_dim, sinus.data());
  linear(sinus.data(), w.time_embedding_0, tmp.data(), NT);
  ops::silu(tmp.data(), tmp.data(), NT * D);
  linear(tmp.data(), w.time_embedding_2, e.data(), NT);
  ops::silu(e.data(), tmp.data(), NT * D);
  linear(tmp.data(), w.time_projection_1, e0.data(), NT);
  emit(hook, "time_embed", e.data(), {B, Lt, D});
  emit(hook, "time_proj", e0.data(), {B, Lt, 6 * D});

  // ---- text embedding: zero-pad each prompt to text_len, then the MLP (padded rows not masked) ----
  Buf ctx_in(static_cast<size_t>(B * TL * TD), 0.0f), ctx(static_cast<size_t>(B * TL * D));
  for (int64_t b = 0; b < B; ++b)
    std::memcpy(ctx_in.data() + b * TL * TD, cin + b * LC * TD, sizeof(float) * context_lens[b] * TD);
  {
    Buf hid(static_cast<size_t>(B * TL * D));
    linear(ctx_in.data(), w.text_embedding_0, hid.data(), B * TL);
    ops::gelu_tanh(hid.data(), hid.data(), B * TL * D);
    linear(hid.data(), w.text_embedding_2, ctx.data(), B * TL);
  }
  emit(hook, "text_embed", ctx.data(), {B, TL, D});

  // ---- blocks ----
  const ops::RopeTable rope = ops::rope_table(static_cast<int>(HD));
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const std::vector<int64_t> self_lens(static_cast<size_t>(B), L);
  const int64_t rows = B * S;
  const int64_t mstride = Lt == 1 ? 0 : 6 * D;  // row stride into one sample's [Lt, 6, D] modulation
  Buf mod(static_cast<size_t>(NT * 6 * D));
  Buf h(static_cast<size_t>(rows * D)), q(static_cast<size_t>(rows * D)), k(static_cast<size_t>(rows * D));
  Buf v(static_cast<size_t>(rows * D)), att(static_cast<size_t>(rows * D)), y(static_cast<size_t>(rows * D));
  Buf ffn(static_cast<size_t>(rows * F));
  Buf ck(static_cast<size_t>(B * TL * D)), cv(static_cast<size_t>(B * TL * D));
  // Per-sample modulated ops: sample b's rows and its modulation chunk `c` of [Lt, 6, D].
  auto modulate = [&](const float* src, int chunk_shift, int chunk_scale, float* dst) {
    for (int64_t b = 0; b < B; ++b) {
      const float* m = mod.data() + b * Lt * 6 * D;
      ops::modulate(src + b * S * D, m + chunk_shift * D, m + chunk_scale * D, mstride, dst + b * S * D, S, D);
    }
  };
  auto gate_add = [&](const float* src, int chunk_gate) {
    for (int64_t b = 0; b < B; ++b) {
      const float* m = mod.data() + b * Lt * 6 * D;
      ops::gated_residual(xs.data() + b * S * D, src + b * S * D, m + chunk_gate * D, mstride, S, D);
    }
  };

  // the blocks' GEMMs: fp32, or the GPU's FP8 arithmetic
  auto blin = [fp8_block_gemms](const float* in, const DiTLinear& l, float* out, int64_t n) {
    (fp8_block_gemms ? linear_fp8 : linear)(in, l, out, n);
  };
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    const DiTBlock& blk = w.blocks[i];
    // m = modulation + e0 (fp32), [B·Lt, 6D]
    const float* bm = fp(blk.modulation);
    for (int64_t r = 0; r < NT; ++r)
      for (int64_t j = 0; j < 6 * D; ++j) mod[r * 6 * D + j] = bm[j] + e0[r * 6 * D + j];

    // self-attention: q/k RMSNorm over all heads, RoPE, keys beyond the L real tokens masked
    ops::layer_norm(xs.data(), nullptr, nullptr, h.data(), rows, D, cfg.eps);
    modulate(h.data(), 0, 1, h.data());
    const DiTAttention& sa = blk.self_attn;
    blin(h.data(), sa.q, q.data(), rows);
    ops::rms_norm(q.data(), fp(sa.norm_q), q.data(), rows, D, cfg.eps);
    blin(h.data(), sa.k, k.data(), rows);
    ops::rms_norm(k.data(), fp(sa.norm_k), k.data(), rows, D, cfg.eps);
    blin(h.data(), sa.v, v.data(), rows);
    ops::rope_apply(q.data(), B, S, NH, HD, f, gh, gw, rope);
    ops::rope_apply(k.data(), B, S, NH, HD, f, gh, gw, rope);
    ops::attention(q.data(), k.data(), v.data(), att.data(), B, S, S, NH, HD, self_lens.data(), scale);
    blin(att.data(), sa.o, y.data(), rows);
    gate_add(y.data(), 2);

    // cross-attention: affine pre-norm, no modulation, no gate, all text_len keys
    const DiTAttention& ca = blk.cross_attn;
    ops::layer_norm(xs.data(), fp(blk.norm3_weight), fp(blk.norm3_bias), h.data(), rows, D, cfg.eps);
    blin(h.data(), ca.q, q.data(), rows);
    ops::rms_norm(q.data(), fp(ca.norm_q), q.data(), rows, D, cfg.eps);
    blin(ctx.data(), ca.k, ck.data(), B * TL);
    ops::rms_norm(ck.data(), fp(ca.norm_k), ck.data(), B * TL, D, cfg.eps);
    blin(ctx.data(), ca.v, cv.data(), B * TL);
    ops::attention(q.data(), ck.data(), cv.data(), att.data(), B, S, TL, NH, HD, nullptr, scale);
    blin(att.data(), ca.o, y.data(), rows);
    ops::add_inplace(xs.data(), y.data(), rows * D);

    // feed-forward
    ops::layer_norm(xs.data(), nullptr, nullptr, h.data(), rows, D, cfg.eps);
    modulate(h.data(), 3, 4, h.data());
    blin(h.data(), blk.ffn_0, ffn.data(), rows);
    ops::gelu_tanh(ffn.data(), ffn.data(), rows * F);
    blin(ffn.data(), blk.ffn_2, y.data(), rows);
    gate_add(y.data(), 5);
    emit(hook, cat("block.", i), xs.data(), {B, S, D});
  }

  // ---- head: (shift, scale) = head.modulation + e (not e0) ----
  Buf hmod(static_cast<size_t>(NT * 2 * D));
  const float* hm = fp(w.head_modulation);
  for (int64_t r = 0; r < NT; ++r)
    for (int64_t j = 0; j < 2 * D; ++j) hmod[r * 2 * D + j] = hm[j] + e[r * D + j % D];
  ops::layer_norm(xs.data(), nullptr, nullptr, h.data(), rows, D, cfg.eps);
  for (int64_t b = 0; b < B; ++b) {
    const float* m = hmod.data() + b * Lt * 2 * D;
    ops::modulate(h.data() + b * S * D, m, m + D, Lt == 1 ? 0 : 2 * D, h.data() + b * S * D, S, D);
  }
  const int64_t OP = cfg.out_dim * P;
  Buf head(static_cast<size_t>(rows * OP));
  linear(h.data(), w.head_head, head.data(), rows);
  emit(hook, "head", head.data(), {B, S, OP});

  // ---- unpatchify the first L rows of each sample ----
  Tensor out = Tensor::empty(DType::F32, {B, cfg.out_dim, T, H, W});
  for (int64_t b = 0; b < B; ++b)
    ops::unpatchify(head.data() + b * S * OP, out.f32() + b * cfg.out_dim * T * H * W, cfg.out_dim, f, gh, gw, pt,
                    ph, pw);
  return out;
}

}  // namespace wan
