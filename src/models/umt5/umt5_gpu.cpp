// UMT5 encoder on the GPU: weight table, upload / random draw, activation arena and the forward
// (see umt5_gpu.h for the numerics and kernels/t5_kernels.h for the kernels).
#include "models/umt5/umt5_gpu.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/check.h"
#include "kernels/gemm.h"
#include "kernels/t5_kernels.h"
#include "models/weights_gpu.h"
#include "models/umt5/weights.h"

namespace wan::cuda {

using bf16 = __nv_bfloat16;
using dit_gpu_detail::DeviceEntry;
using dit_gpu_detail::DeviceTable;
using dit_gpu_detail::align_up;
using t5_gpu_detail::kMaxTokens;

namespace {

constexpr size_t kReserveBytes = size_t{512} << 20;     // context, handles, kernels
constexpr size_t kCublasWorkspace = size_t{32} << 20;   // the batched attention GEMMs

void check_config(const T5Config& c) {
  WAN_CHECK(c.vocab >= 1 && c.num_layers >= 1, "T5 GPU: vocab and num_layers must be positive");
  WAN_CHECK(c.dim > 0 && c.dim % 8 == 0, "T5 GPU: dim ", c.dim, " must be a positive multiple of 8");
  WAN_CHECK(c.dim_ffn > 0 && c.dim_ffn % 8 == 0, "T5 GPU: dim_ffn ", c.dim_ffn, " must be a positive multiple of 8");
  WAN_CHECK(c.num_heads > 0 && c.dim_attn > 0 && c.dim_attn % c.num_heads == 0 && c.head_dim() % 8 == 0,
            "T5 GPU: dim_attn ", c.dim_attn, " / num_heads ", c.num_heads, " must give a head_dim multiple of 8");
  WAN_CHECK(c.num_buckets >= 4 && c.num_buckets % 2 == 0, "T5 GPU: num_buckets ", c.num_buckets,
            " must be even and >= 4");
  WAN_CHECK(c.max_distance > c.num_buckets / 4, "T5 GPU: max_distance ", c.max_distance,
            " must exceed the exact range ", c.num_buckets / 4);
  WAN_CHECK(c.eps > 0.0f, "T5 GPU: eps must be positive");
}

// The weight table (models/umt5/weights.h) placed DiT-style (weights_gpu.h): each tensor one range of
// one allocation; q|k|v and gate|fc1 back to back (fused GEMM operands).
DeviceTable build_table(const T5Config& c) {
  check_config(c);
  return dit_gpu_detail::place_weights(umt5_weight_table(c));
}

// The activation arena for kMaxTokens tokens (byte offsets).
struct Arena {
  size_t ids, buckets, x, a, qkv, S, P, att, y, gf, h, gemm_ws, cublas_ws, bytes;
};
Arena plan_arena(const T5Config& c) {
  const size_t L = static_cast<size_t>(kMaxTokens), D = c.dim, A = c.dim_attn, F = c.dim_ffn, H = c.num_heads;
  Arena r{};
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off = align_up(off + bytes, dit_gpu_detail::kGroupAlign);
    return at;
  };
  r.ids = take(L * 4);
  r.buckets = take((2 * L - 1) * 4);
  r.x = take(L * D * 4);
  r.a = take(L * D * 2);
  r.qkv = take(L * 3 * A * 2);
  r.S = take(H * L * L * 4);
  r.P = take(H * L * L * 2);
  r.att = take(L * A * 2);
  r.y = take(L * D * 2);
  r.gf = take(L * 2 * F * 2);
  r.h = take(L * F * 2);
  r.gemm_ws = take(GemmRunner::kWorkspaceBytes);
  r.cublas_ws = take(kCublasWorkspace);
  r.bytes = off;
  return r;
}

double mib(size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

struct BlockPtrs {
  const bf16 *qkv, *o, *gf, *fc2;
  const float *norm1, *norm2, *pos;
};

}  // namespace

struct T5EncoderGpu::Impl {
  T5Config cfg;
  int device = 0;
  DeviceTable table;
  Arena arena_plan{};
  void* weights = nullptr;
  char* arena = nullptr;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  std::unique_ptr<GemmRunner> gemm;
  const bf16* emb = nullptr;
  const float* final_norm = nullptr;
  std::vector<BlockPtrs> blocks;
  std::vector<uint16_t> host_out;

  ~Impl() {
    // No throws: let queued work finish, release in reverse order, ignore errors.
    if (stream) cudaStreamSynchronize(stream);
    gemm.reset();
    if (cublas) cublasDestroy(cublas);
    if (arena) cudaFree(arena);
    if (weights) cudaFree(weights);
    if (stream) cudaStreamDestroy(stream);
  }

  template <typename T>
  T* at(size_t off) const {
    return reinterpret_cast<T*>(arena + off);
  }
  template <typename T>
  const T* w(const std::string& name) const {
    return reinterpret_cast<const T*>(static_cast<const char*>(weights) + table.at(name).offset);
  }

  void init(const T5Config& c, const T5WeightSource& src, int dev);
  void forward(int64_t L);
};

void T5EncoderGpu::Impl::init(const T5Config& c, const T5WeightSource& src, int dev) {
  cfg = c;
  device = dev;
  table = build_table(c);  // checks the config
  arena_plan = plan_arena(c);
  WAN_CHECK(src.random || static_cast<bool>(src.get), "T5 GPU: the weight source has no callback and is not random");
  int n_dev = 0;
  CUDA_CHECK(cudaGetDeviceCount(&n_dev));
  WAN_CHECK(dev >= 0 && dev < n_dev, "T5 GPU: device ", dev, " does not exist (", n_dev, " devices)");
  CUDA_CHECK(cudaSetDevice(dev));
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t need = table.bytes + arena_plan.bytes + kReserveBytes;
  WAN_CHECK(need <= free_bytes, "T5 GPU: the text encoder needs ", mib(table.bytes), " MiB of weights + ",
            mib(arena_plan.bytes), " MiB of activations + ", mib(kReserveBytes), " MiB reserve = ", mib(need),
            " MiB, but device ", dev, " has only ", mib(free_bytes), " MiB free (of ", mib(total_bytes), ")");

  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaMalloc(&weights, table.bytes));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&arena), arena_plan.bytes));
  gemm = std::make_unique<GemmRunner>(arena + arena_plan.gemm_ws, GemmRunner::kWorkspaceBytes);
  CUBLAS_CHECK(cublasCreate(&cublas));
  CUBLAS_CHECK(cublasSetStream(cublas, stream));
  CUBLAS_CHECK(cublasSetWorkspace(cublas, arena + arena_plan.cublas_ws, kCublasWorkspace));
  CUBLAS_CHECK(cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH));
  // NaN bytes everywhere: an activation element a kernel forgot to write shows up in the output.
  CUDA_CHECK(cudaMemsetAsync(arena, 0xFF, arena_plan.bytes, stream));

  if (src.random) {
    // Every T5 tensor with an offset is fp32, so the bf16 staging scratch is never used.
    WAN_ASSERT(dit_gpu_detail::max_small_floats(table) == 0, "T5 random weights need no scratch");
    dit_gpu_detail::draw_random_weights(table, weights, src.seed, nullptr, 0, stream);
  } else {
    dit_gpu_detail::upload_weights(table, weights, src.get, "T5", src.span, src.loader, src.group);
  }

  // Relative buckets for every rel in (−kMaxTokens, kMaxTokens), indexed rel + kMaxTokens − 1.
  std::vector<int32_t> buckets(static_cast<size_t>(2 * kMaxTokens - 1));
  for (int64_t r = -(kMaxTokens - 1); r <= kMaxTokens - 1; ++r)
    buckets[static_cast<size_t>(r + kMaxTokens - 1)] =
        t5_relative_bucket(r, c.num_buckets, c.max_distance);
  CUDA_CHECK(cudaMemcpyAsync(at<int32_t>(arena_plan.buckets), buckets.data(), buckets.size() * 4,
                             cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));

  emb = w<bf16>("token_embedding.weight");
  final_norm = w<float>("norm.weight");
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = cat("blocks.", i, ".");
    BlockPtrs b;
    b.qkv = w<bf16>(p + "attn.q.weight");
    b.o = w<bf16>(p + "attn.o.weight");
    b.gf = w<bf16>(p + "ffn.gate.0.weight");
    b.fc2 = w<bf16>(p + "ffn.fc2.weight");
    b.norm1 = w<float>(p + "norm1.weight");
    b.norm2 = w<float>(p + "norm2.weight");
    b.pos = w<float>(p + "pos_embedding.embedding.weight");
    blocks.push_back(b);
  }
}

// The forward over the ids already in the arena; the result (bf16 [L, D]) ends in buffer `a`.
void T5EncoderGpu::Impl::forward(int64_t L) {
  const int64_t D = cfg.dim, A = cfg.dim_attn, F = cfg.dim_ffn, H = cfg.num_heads, Dh = cfg.head_dim();
  const int64_t ld = (L + 7) / 8 * 8;  // score / probability row stride (16-byte rows)
  const Arena& r = arena_plan;
  float* x = at<float>(r.x);
  float* S = at<float>(r.S);
  bf16 *a = at<bf16>(r.a), *qkv = at<bf16>(r.qkv), *P = at<bf16>(r.P), *att = at<bf16>(r.att);
  bf16 *y = at<bf16>(r.y), *gf = at<bf16>(r.gf), *h = at<bf16>(r.h);
  const int32_t* buckets = at<int32_t>(r.buckets);
  const bf16* no_bias = nullptr;
  const float one = 1.0f, zero = 0.0f;
  cudaStream_t s = stream;

  t5_gpu_detail::embed_gather(emb, at<int32_t>(r.ids), x, L, D, s);
  const bf16* pending = nullptr;  // the previous block's FFN output, added by the next norm
  for (const BlockPtrs& b : blocks) {
    // ---- self-attention ----
    t5_gpu_detail::add_rms_norm(x, pending, b.norm1, a, L, D, cfg.eps, s);
    gemm->linear(a, b.qkv, no_bias, qkv, L, D, 3 * A, Act::None, s);
    // S_h [L_q, ld] row-major = (K_h · Q_hᵀ) column-major: A = K (ld 3A, transposed), B = Q (ld 3A).
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(L),
                                            static_cast<int>(L), static_cast<int>(Dh), &one, qkv + A, CUDA_R_16BF,
                                            static_cast<int>(3 * A), Dh, qkv, CUDA_R_16BF, static_cast<int>(3 * A), Dh,
                                            &zero, S, CUDA_R_32F, static_cast<int>(ld), L * ld, static_cast<int>(H),
                                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    t5_gpu_detail::softmax_bias(S, b.pos, buckets, P, H, L, ld, s);
    // O_h [L, Dh] (row stride A) = P_h · V_h; column-major Oᵀ = Vᵀ · Pᵀ.
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(Dh),
                                            static_cast<int>(L), static_cast<int>(L), &one, qkv + 2 * A, CUDA_R_16BF,
                                            static_cast<int>(3 * A), Dh, P, CUDA_R_16BF, static_cast<int>(ld), L * ld,
                                            &zero, att, CUDA_R_16BF, static_cast<int>(A), Dh, static_cast<int>(H),
                                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    gemm->linear(att, b.o, no_bias, y, L, A, D, Act::None, s);
    // ---- gated-GELU feed-forward ----
    t5_gpu_detail::add_rms_norm(x, y, b.norm2, a, L, D, cfg.eps, s);
    gemm->linear(a, b.gf, no_bias, gf, L, D, 2 * F, Act::None, s);
    t5_gpu_detail::gelu_mul(gf, h, L, F, s);
    gemm->linear(h, b.fc2, no_bias, y, L, F, D, Act::None, s);
    pending = y;
  }
  t5_gpu_detail::add_rms_norm(x, pending, final_norm, a, L, D, cfg.eps, s);
}

T5EncoderGpu::T5EncoderGpu(const T5Config& cfg, const T5WeightSource& src, int device)
    : impl_(std::make_unique<Impl>()) {
  impl_->init(cfg, src, device);
}

T5EncoderGpu::T5EncoderGpu(const T5Config& cfg, const T5Weights& w, int device) : impl_(std::make_unique<Impl>()) {
  WAN_CHECK(static_cast<int>(w.blocks.size()) == cfg.num_layers, "T5 GPU: weights have ", w.blocks.size(),
            " blocks, the config ", cfg.num_layers);
  std::unordered_map<std::string, Tensor> by_name;
  by_name["token_embedding.weight"] = w.token_embedding;
  by_name["norm.weight"] = w.norm;
  for (int i = 0; i < cfg.num_layers; ++i) {
    const std::string p = cat("blocks.", i, ".");
    const T5Block& b = w.blocks[static_cast<size_t>(i)];
    by_name[p + "norm1.weight"] = b.norm1;
    by_name[p + "attn.q.weight"] = b.q;
    by_name[p + "attn.k.weight"] = b.k;
    by_name[p + "attn.v.weight"] = b.v;
    by_name[p + "attn.o.weight"] = b.o;
    by_name[p + "pos_embedding.embedding.weight"] = b.pos_embedding;
    by_name[p + "norm2.weight"] = b.norm2;
    by_name[p + "ffn.gate.0.weight"] = b.ffn_gate;
    by_name[p + "ffn.fc1.weight"] = b.ffn_fc1;
    by_name[p + "ffn.fc2.weight"] = b.ffn_fc2;
  }
  T5WeightSource src;
  src.get = [&by_name](const std::string& name) -> Tensor {
    auto it = by_name.find(name);
    WAN_CHECK(it != by_name.end(), "T5 GPU: no weight named ", name);
    return it->second;
  };
  impl_->init(cfg, src, device);
}

T5EncoderGpu::~T5EncoderGpu() = default;

Tensor T5EncoderGpu::encode(const int32_t* ids, int64_t length) {
  Impl& m = *impl_;
  WAN_CHECK(length >= 1 && length <= kMaxTokens, "T5 GPU encode: length ", length, " outside [1, ", kMaxTokens, "]");
  WAN_CHECK(ids != nullptr, "T5 GPU encode: no token ids");
  for (int64_t i = 0; i < length; ++i)
    WAN_CHECK(ids[i] >= 0 && ids[i] < m.cfg.vocab, "T5 GPU encode: token id ", ids[i], " at position ", i,
              " is outside the vocabulary [0, ", m.cfg.vocab, ")");
  const int64_t D = m.cfg.dim;
  CUDA_CHECK(cudaSetDevice(m.device));
  CUDA_CHECK(cudaMemcpyAsync(m.at<int32_t>(m.arena_plan.ids), ids, static_cast<size_t>(length) * 4,
                             cudaMemcpyHostToDevice, m.stream));
  m.forward(length);
  m.host_out.resize(static_cast<size_t>(length * D));
  CUDA_CHECK(cudaMemcpyAsync(m.host_out.data(), m.at<bf16>(m.arena_plan.a), m.host_out.size() * 2,
                             cudaMemcpyDeviceToHost, m.stream));
  CUDA_CHECK(cudaStreamSynchronize(m.stream));
  Tensor out = Tensor::empty(DType::F32, {length, D});
  convert_to_f32(DType::BF16, m.host_out.data(), out.f32(), m.host_out.size());
  return out;
}

size_t T5EncoderGpu::weight_bytes() const { return impl_->table.bytes; }
size_t T5EncoderGpu::weight_bytes(const T5Config& cfg) { return build_table(cfg).bytes; }
size_t T5EncoderGpu::device_bytes(const T5Config& cfg) {
  return build_table(cfg).bytes + plan_arena(cfg).bytes + kReserveBytes;
}

}  // namespace wan::cuda
