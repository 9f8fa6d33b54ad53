// The Wan 2.1 VAE decoder on the GPU (see vae_gpu.h; weights packed by vae_gpu_weights.cpp): the
// planned arena and the chunk schedule, which runs in three passes over the same code so the plan
// cannot disagree with the work: Size (shapes only: each buffer role's largest use, the cache slots,
// every conv plan), Find (find mode only: times cuDNN's algorithms on the arena's buffers) and Run.
//
// Dataflow of one chunk: a conv output is never biased in place; the value of the residual stream is
// kept "pending" as (a + a_bias) + (r + r_bias) and materialised by the next kernel that needs it
// (vae_fuse), which also writes the next conv's normalised input into the staging. Buffer roles:
//   X   the residual stream (bf16 [T, HW, C]), written in place by the fuse kernel
//   H0  conv outputs (read once by the next fuse/upsample before the next conv overwrites it)
//   H1  the 1×1 shortcut of the one ResidualBlock that changes width
//   S   conv staging (the 2 cached frames + the chunk, or the folded layout)
//   U   up-sampled frames; the attention's scratch (Q/K/V, scores, probabilities) aliases it
// plus one 2-frame cache slot per temporal conv (visited in a fixed order, like the reference's
// feat_idx), the cuDNN and cuBLAS workspaces and the self-check counters.
#include "models/vae/vae_gpu.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/check.h"
#include "kernels/vae_conv.h"
#include "kernels/vae_kernels.h"
#include "models/vae/vae_gpu_weights.h"
#include "models/weight_spec.h"

namespace wan::cuda {

using vae_detail::ConvRunner;
using vae_detail::ConvShape;
using vae_gpu_detail::align_up;
using vae_gpu_detail::DevAttn;
using vae_gpu_detail::DevConv;
using vae_gpu_detail::DevDecoder;
using vae_gpu_detail::DevRes;
using vae_gpu_detail::DevStage;
using vae_gpu_detail::kAlign;

namespace {

constexpr size_t kBlasWorkspace = size_t{32} << 20;  // cuBLAS's recommended Hopper workspace
constexpr size_t kReserve = size_t{512} << 20;       // left free for handles, kernels, library internals
constexpr int kCheckPoints = 64;                     // sampled outputs per conv in self-check mode

double mib(size_t b) { return static_cast<double>(b) / 1048576.0; }

// ---- arena roles ----

enum Role { kX, kH0, kH1, kS, kU, kAN, kAQ32, kAQ, kAS, kAP, kAO, kRoles };
constexpr const char* kRoleNames[kRoles] = {"x (residual stream)",  "h0 (conv out)",      "h1 (shortcut)",
                                            "s (conv staging)",     "u (up-sampled)",     "attn norm",
                                            "attn qkv fp32",        "attn qkv",           "attn scores fp32",
                                            "attn probs",           "attn out"};

// The residual stream's value (a + a_bias) + (r + r_bias), geometry [T, H·W, C].
struct Pending {
  const bf16* a = nullptr;
  const float* ab = nullptr;
  const bf16* r = nullptr;
  const float* rb = nullptr;
  int64_t T = 0, H = 0, W = 0, C = 0;
  bool plain_at(const bf16* p) const { return a == p && !ab && !r; }
};

struct Slot {
  size_t off = 0, bytes = 0;
  bool seen = false;  // upsample3d: "Rep" (first call done)
};

enum class Pass { Size, Find, Run };

}  // namespace

struct VaeDecoderGpu::Impl {
  VaeGpuOptions opt;
  VaeGpuShape shape;
  DevDecoder dec;
  uint8_t* weights = nullptr;
  size_t weights_bytes = 0;
  uint8_t* arena = nullptr;
  size_t arena_size = 0;
  size_t role_bytes[kRoles] = {}, role_off[kRoles] = {};
  std::vector<Slot> slots;
  size_t slots_off = 0, slots_bytes = 0;
  size_t ws_off = 0, ws_bytes = 0, blas_off = 0, stats_off = 0;
  std::unique_ptr<ConvRunner> conv;
  cublasHandle_t blas = nullptr;

  // Per-pass state.
  Pass pass = Pass::Size;
  cudaStream_t stream = nullptr;
  size_t slot_i = 0;
  uint32_t conv_call = 0;

  // Profile: events around every op of the last decode.
  struct Mark {
    std::string name;
    double flops;
    int e0, e1;
  };
  std::vector<cudaEvent_t> events;
  size_t events_used = 0;
  std::vector<Mark> marks;
  std::string last_profile;
  float check_err = 0.0f;
  int64_t check_nonfinite = 0, checked_calls = 0;

  ~Impl() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    if (blas) cublasDestroy(blas);
    if (arena) cudaFree(arena);
    if (weights) cudaFree(weights);
  }

  bool running() const { return pass == Pass::Run; }
  template <class T>
  const T* wp(size_t off) const {
    return weights ? reinterpret_cast<const T*>(weights + off) : nullptr;  // null while sizing
  }

  // ---- buffers ----
  template <class T = bf16>
  T* buf(Role r, size_t bytes) {
    if (pass == Pass::Size) {
      role_bytes[r] = std::max(role_bytes[r], align_up(bytes));
      return nullptr;
    }
    WAN_ASSERT(bytes <= role_bytes[r], "vae arena role ", kRoleNames[r], ": ", bytes, " > planned ", role_bytes[r]);
    return reinterpret_cast<T*>(arena + role_off[r]);
  }
  Slot& next_slot(size_t bytes) {
    if (pass == Pass::Size && slot_i == slots.size()) slots.push_back(Slot{0, align_up(bytes), false});
    WAN_ASSERT(slot_i < slots.size() && slots[slot_i].bytes == align_up(bytes), "vae cache slot ", slot_i,
               " visited with a different size");
    return slots[slot_i++];
  }
  bf16* slot_ptr(const Slot& s) { return running() ? reinterpret_cast<bf16*>(arena + s.off) : nullptr; }

  // ---- profiling ----
  int event() {
    if (events_used == events.size()) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreate(&e));
      events.push_back(e);
    }
    CUDA_CHECK(cudaEventRecord(events[events_used], stream));
    return static_cast<int>(events_used++);
  }
  struct Scope {
    Impl* m;
    int e0 = -1;
    std::string name;
    double flops;
    Scope(Impl* impl, std::string n, double f = 0) : m(impl), name(std::move(n)), flops(f) {
      if (m->running() && m->opt.profile) e0 = m->event();
    }
    ~Scope() {
      if (e0 >= 0) m->marks.push_back(Mark{std::move(name), flops, e0, m->event()});
    }
  };

  // ---- ops ----
  void fuse(const Pending& P, bf16* x_out, StageDst y, NormMode mode, size_t gamma_off, bool has_gamma) {
    if (!running()) return;
    Scope sc(this, "fuse/norm");
    vae_fuse(P.a, P.ab, P.r, P.rb, x_out, y, mode, has_gamma ? wp<float>(gamma_off) : nullptr, P.T, P.H * P.W, P.C,
             stream);
  }
  // Writes the pending value into X (if it is not there already); returns it as a plain pending.
  Pending materialize(const Pending& P) {
    bf16* X = buf(kX, P.T * P.H * P.W * P.C * 2);
    if (!P.plain_at(X)) fuse(P, X, StageDst{}, NormMode::Copy, 0, false);
    Pending o = P;
    o.a = X;
    o.ab = nullptr;
    o.r = nullptr;
    o.rb = nullptr;
    return o;
  }

  void run_conv(const DevConv& cv, const ConvShape& s, const bf16* in, bf16* out) {
    if (pass == Pass::Size) {
      conv->prepare(s);
      return;
    }
    bf16* ws = reinterpret_cast<bf16*>(arena + ws_off);
    if (pass == Pass::Find) {
      conv->find(s, in, wp<bf16>(cv.w), out, ws, ws_bytes);
      return;
    }
    {
      Scope sc(this, "conv " + s.str(), s.flops());
      conv->run(s, in, wp<bf16>(cv.w), out, ws, ws_bytes, stream);
    }
    if (opt.self_check) {
      const int64_t D = s.is3d ? s.d : s.n;
      vae_conv_check(in, wp<bf16>(cv.w), out, D, s.h, s.w, s.c, s.k, s.kt, s.kh, s.kw, s.ph, s.pw, kCheckPoints,
                     conv_call, reinterpret_cast<float*>(arena + stats_off), stream);
      ++checked_calls;
    }
    ++conv_call;
  }

  // A temporal-kernel-3 causal conv of the chunk's T frames with the slot's 2 cached frames in front:
  // produce(dst) writes the T input frames (stream frames 2..T+1); the slot then keeps frames T, T+1.
  template <class Produce>
  void causal_conv(const DevConv& cv, Slot& slot, int64_t T, int64_t H, int64_t W, Produce produce, bf16* out) {
    const int64_t C = cv.cin, HW = H * W;
    const bool folded = opt.conv_mode == VaeConvMode::Folded2d;
    bf16* S = buf(kS, (folded ? 3 * T : T + 2) * HW * C * 2);
    bf16* cache = slot_ptr(slot);
    const size_t frame_bytes = static_cast<size_t>(HW * C) * 2;
    if (running()) {
      Scope sc(this, "cache copies");
      if (folded)
        vae_folded_put(cache, 2, 0, S, T, HW, C, stream);
      else
        CUDA_CHECK(cudaMemcpyAsync(S, cache, 2 * frame_bytes, cudaMemcpyDeviceToDevice, stream));
    }
    produce(StageDst{S, folded ? StageDst::Folded : StageDst::Plain, static_cast<int32_t>(T), 2});
    ConvShape s;
    s.is3d = !folded;
    s.n = folded ? T : 1;
    s.d = folded ? 1 : T + 2;
    s.h = H;
    s.w = W;
    s.c = folded ? 3 * C : C;
    s.k = cv.cout_pad;
    s.kt = folded ? 1 : 3;
    s.kh = cv.kh;
    s.kw = cv.kw;
    s.ph = cv.kh / 2;
    s.pw = cv.kw / 2;
    run_conv(cv, s, S, out);
    if (running()) {
      Scope sc(this, "cache copies");
      if (folded)
        vae_folded_get(S, T, 2, cache, T, HW, C, stream);
      else
        CUDA_CHECK(cudaMemcpyAsync(cache, S + T * HW * C, 2 * frame_bytes, cudaMemcpyDeviceToDevice, stream));
    }
  }

  // y[M, N] = x[M, K] · w[N, K]ᵀ (row-major, leading dims in elements), bf16 in, fp32 accumulate.
  void gemm_xwT(const bf16* x, int64_t ldx, const bf16* w, int64_t ldw, void* y, int64_t ldy, bool y_f32, int64_t M,
                int64_t N, int64_t K) {
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M),
                              static_cast<int>(K), &one, w, CUDA_R_16BF, static_cast<int>(ldw), x, CUDA_R_16BF,
                              static_cast<int>(ldx), &zero, y, y_f32 ? CUDA_R_32F : CUDA_R_16BF, static_cast<int>(ldy),
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  // ---- blocks ----
  Pending resblock(const DevRes& b, const Pending& P) {
    WAN_ASSERT(P.C == b.cin, "resblock input width");
    const int64_t T = P.T, H = P.H, W = P.W, HW = H * W;
    bf16* X = buf(kX, T * HW * b.cin * 2);
    bf16* h = buf(kH0, T * HW * b.cout * 2);
    bf16* x_out = P.plain_at(X) ? nullptr : X;
    causal_conv(b.c1, next_slot(2 * HW * b.cin * 2), T, H, W,
                [&](StageDst d) { fuse(P, x_out, d, NormMode::RmsSilu, b.g1, true); }, h);
    const bf16* res = X;
    const float* res_b = nullptr;
    if (b.has_sc) {
      bf16* sc = buf(kH1, T * HW * b.cout * 2);
      if (running()) {
        Scope s(this, "gemm (shortcut)", 2.0 * T * HW * b.cin * b.cout);
        gemm_xwT(X, b.cin, wp<bf16>(b.sc.w), b.cin, sc, b.cout, false, T * HW, b.cout, b.cin);
      }
      res = sc;
      res_b = wp<float>(b.sc.b);
    }
    const Pending mid{h, wp<float>(b.c1.b), nullptr, nullptr, T, H, W, b.cout};
    causal_conv(b.c2, next_slot(2 * HW * b.cout * 2), T, H, W,
                [&](StageDst d) { fuse(mid, nullptr, d, NormMode::RmsSilu, b.g2, true); }, h);
    return Pending{h, wp<float>(b.c2.b), res, res_b, T, H, W, b.cout};
  }

  Pending attention(const DevAttn& m, const Pending& P) {
    const int64_t T = P.T, N = P.H * P.W, C = P.C;
    bf16* X = buf(kX, T * N * C * 2);
    bf16* n = buf(kAN, T * N * C * 2);
    float* q32 = buf<float>(kAQ32, N * 3 * C * 4);
    bf16* qkv = buf(kAQ, N * 3 * C * 2);
    float* S = buf<float>(kAS, N * N * 4);
    bf16* Pm = buf(kAP, N * N * 2);
    bf16* O = buf(kAO, T * N * C * 2);
    bf16* h = buf(kH0, T * N * C * 2);
    fuse(P, P.plain_at(X) ? nullptr : X, StageDst{n, StageDst::Plain, static_cast<int32_t>(T), 0}, NormMode::Rms, m.g,
         true);
    if (running()) {
      Scope s(this, "attention", T * (2.0 * N * C * 3 * C + 4.0 * N * N * C + 2.0 * N * C * C));
      const float scale = 1.0f / std::sqrt(static_cast<float>(C));
      for (int64_t f = 0; f < T; ++f) {
        gemm_xwT(n + f * N * C, C, wp<bf16>(m.qkv.w), C, q32, 3 * C, true, N, 3 * C, C);
        vae_bias_to_bf16(q32, wp<float>(m.qkv.b), qkv, N, 3 * C, stream);
        gemm_xwT(qkv, 3 * C, qkv + C, 3 * C, S, N, true, N, N, C);  // S = Q·Kᵀ
        vae_softmax_rows(S, Pm, N, N, scale, stream);
        // O[N, C] = P[N, N] · V[N, C]: column-major O^T = V^T · P^T.
        const float one = 1.0f, zero = 0.0f;
        CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(C), static_cast<int>(N),
                                  static_cast<int>(N), &one, qkv + 2 * C, CUDA_R_16BF, static_cast<int>(3 * C), Pm,
                                  CUDA_R_16BF, static_cast<int>(N), &zero, O + f * N * C, CUDA_R_16BF,
                                  static_cast<int>(C), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
      gemm_xwT(O, C, wp<bf16>(m.proj.w), C, h, C, false, T * N, C, C);
    }
    return Pending{h, wp<float>(m.proj.b), X, nullptr, T, P.H, P.W, C};
  }

  Pending resample(const DevStage& st, const Pending& P) {
    if (st.mode == VaeResampleMode::None) return P;
    const int64_t T = P.T, H = P.H, W = P.W, C = P.C, HW = H * W;
    const bf16* up_in = nullptr;
    const float* up_bias = nullptr;
    int split = 1;
    if (st.mode == VaeResampleMode::Upsample3d) {
      Slot& slot = next_slot(2 * HW * C * 2);
      if (!slot.seen) {  // "Rep": no time_conv, no frame doubling; the slot stays zero
        slot.seen = true;
        up_in = materialize(P).a;
      } else {
        bf16* tc = buf(kH0, T * HW * 2 * C * 2);
        causal_conv(st.tc, slot, T, H, W, [&](StageDst d) { fuse(P, nullptr, d, NormMode::Copy, 0, false); }, tc);
        up_in = tc;
        up_bias = wp<float>(st.tc.b);
        split = 2;
      }
    } else {
      up_in = materialize(P).a;
    }
    const int64_t T2 = T * split;
    bf16* U = buf(kU, T2 * 4 * HW * C * 2);
    if (running()) {
      Scope s(this, "upsample");
      vae_upsample2x(up_in, up_bias, U, T, H, W, C, split, stream);
    }
    bf16* out = buf(kH0, T2 * 4 * HW * st.rs.cout * 2);
    ConvShape s;
    s.n = T2;
    s.h = 2 * H;
    s.w = 2 * W;
    s.c = C;
    s.k = st.rs.cout;
    s.kh = s.kw = 3;
    s.ph = s.pw = 1;
    run_conv(st.rs, s, U, out);
    return Pending{out, wp<float>(st.rs.b), nullptr, nullptr, T2, 2 * H, 2 * W, st.rs.cout};
  }

  // One latent frame t of Tl -> video frames f0.. (1 for the first chunk, 4 later).
  void chunk(int64_t t, const float* latents, int64_t Tl, float* video, int64_t F, int64_t& f0, bool clamp) {
    slot_i = 0;
    const int64_t h = shape.height, w = shape.width, HW = h * w;
    bf16* h0 = buf(kH0, HW * dec.conv1.cout * 2);
    causal_conv(dec.conv1, next_slot(2 * HW * 16 * 2), 1, h, w,
                [&](StageDst d) {
                  if (!running()) return;
                  Scope s(this, "latent in");
                  vae_latent_in(latents, 16, Tl, t, HW, wp<float>(dec.inv_std), wp<float>(dec.mean),
                                wp<float>(dec.conv2_w), wp<float>(dec.conv2_b), d, stream);
                },
                h0);
    Pending P{h0, wp<float>(dec.conv1.b), nullptr, nullptr, 1, h, w, dec.conv1.cout};
    P = resblock(dec.mid0, P);
    P = attention(dec.mid1, P);
    P = resblock(dec.mid2, P);
    for (const DevStage& st : dec.stages) {
      for (const DevRes& b : st.res) P = resblock(b, P);
      P = resample(st, P);
    }
    bf16* o = buf(kH0, P.T * P.H * P.W * dec.head.cout_pad * 2);
    causal_conv(dec.head, next_slot(2 * P.H * P.W * P.C * 2), P.T, P.H, P.W,
                [&](StageDst d) { fuse(P, nullptr, d, NormMode::RmsSilu, dec.head_g, true); }, o);
    if (running()) {
      Scope s(this, "video out");
      vae_video_out(o, dec.head.cout_pad, wp<float>(dec.head.b), P.T, P.H * P.W, video, F, f0, clamp, stream);
    }
    f0 += P.T;
  }

  // Runs the schedule of the first and of a later chunk without work (Size, Find passes).
  void dry(Pass p) {
    pass = p;
    stream = nullptr;
    for (Slot& s : slots) s.seen = false;
    int64_t f0 = 0;
    chunk(0, nullptr, 2, nullptr, 5, f0, true);
    chunk(1, nullptr, 2, nullptr, 5, f0, true);
    WAN_ASSERT(f0 == 5, "vae decoder: planned chunks produce ", f0, " frames, expected 5");
    for (Slot& s : slots) s.seen = false;
  }

  void layout() {
    size_t off = 0;
    for (int r : {kX, kH0, kH1, kS}) {
      role_off[r] = off;
      off += role_bytes[r];
    }
    // The attention runs only at the latent level, before any up-sampling of the chunk: its scratch
    // shares the up-sampling buffer.
    role_off[kU] = off;
    size_t att = 0;
    for (int r : {kAN, kAQ32, kAQ, kAS, kAP, kAO}) {
      role_off[r] = off + att;
      att += role_bytes[r];
    }
    off += std::max(role_bytes[kU], att);
    slots_off = off;
    for (Slot& s : slots) {
      s.off = off;
      off += s.bytes;
    }
    slots_bytes = off - slots_off;
    ws_off = off;
    ws_bytes = align_up(opt.find_algorithms ? opt.conv_workspace_limit : conv->max_workspace());
    off += ws_bytes;
    blas_off = off;
    off += kBlasWorkspace;
    stats_off = off;
    off += kAlign;
    arena_size = off;
  }

  void finish_profile() {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    struct Acc {
      double ms = 0, flops = 0;
      int calls = 0;
    };
    std::map<std::string, Acc> acc;
    double total = 0, conv_ms = 0, conv_flops = 0;
    for (const Mark& m : marks) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, events[m.e0], events[m.e1]));
      Acc& a = acc[m.name];
      a.ms += ms;
      a.flops += m.flops;
      ++a.calls;
      total += ms;
      if (m.name.rfind("conv ", 0) == 0) {
        conv_ms += ms;
        conv_flops += m.flops;
      }
    }
    float wall = 0;
    if (!marks.empty()) CUDA_CHECK(cudaEventElapsedTime(&wall, events[marks.front().e0], events[marks.back().e1]));
    std::vector<std::pair<std::string, Acc>> rows(acc.begin(), acc.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    std::ostringstream o;
    char line[256];
    std::snprintf(line, sizeof line, "  wall %.1f ms, ops %.1f ms; convs %.1f ms at %.1f TFLOP/s\n", wall, total, conv_ms,
                  conv_ms > 0 ? conv_flops / (conv_ms * 1e-3) * 1e-12 : 0.0);
    o << line;
    for (const auto& [name, a] : rows) {
      std::snprintf(line, sizeof line, "  %-56s %5d calls %9.2f ms %5.1f %%", name.c_str(), a.calls, a.ms,
                    100.0 * a.ms / std::max(total, 1e-9));
      o << line;
      if (a.flops > 0) {
        std::snprintf(line, sizeof line, " %7.1f TFLOP/s", a.flops / (a.ms * 1e-3) * 1e-12);
        o << line;
      }
      o << "\n";
    }
    last_profile = o.str();
    marks.clear();
    events_used = 0;
  }
};

VaeDecoderGpu::VaeDecoderGpu(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
VaeDecoderGpu::~VaeDecoderGpu() = default;

namespace {
void check_supported(const VaeConfig& config, VaeGpuShape shape) {
  WAN_CHECK(config.version == 21 && config.z_dim == 16 && config.patch == 1,
            "GPU VAE decoder: only the Wan 2.1 VAE (z_dim 16, no patch) is supported, got version ", config.version);
  WAN_CHECK(config.latents_mean.size() == 16 && config.latents_std.size() == 16,
            "GPU VAE decoder: latent mean/std tables must have 16 entries");
  WAN_CHECK(shape.height >= 1 && shape.width >= 1, "GPU VAE decoder: latent size ", shape.height, "x", shape.width);
}
}  // namespace

size_t VaeDecoderGpu::device_bytes(const VaeConfig& config, VaeGpuShape shape, const VaeGpuOptions& options) {
  check_supported(config, shape);
  // Placeholder tensors of the table's shapes: allocated, never written or read (pack_decoder sizes).
  std::map<std::string, Shape> shapes = shape_map(vae_weight_table(config));
  const VaeWeights placeholders = load_vae_weights(config, [&shapes](const std::string& name) {
    auto it = shapes.find(name);
    WAN_ASSERT(it != shapes.end(), "VAE table has no ", name);
    return Tensor::empty(DType::F32, it->second);
  });
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  impl->shape = shape;
  std::vector<uint8_t> unused;
  size_t weight_bytes = 0;
  impl->dec = vae_gpu_detail::pack_decoder(config, placeholders, options.conv_mode, unused, &weight_bytes);
  impl->conv = std::make_unique<ConvRunner>(options.find_algorithms, options.conv_workspace_limit);
  impl->dry(Pass::Size);
  impl->layout();
  return weight_bytes + impl->arena_size + kReserve;
}

std::unique_ptr<VaeDecoderGpu> VaeDecoderGpu::create(const VaeConfig& config, const VaeWeights& weights,
                                                     VaeGpuShape shape, const VaeGpuOptions& options) {
  check_supported(config, shape);
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  impl->shape = shape;

  // Weights, in the decoder's walk order (official names in messages).
  std::vector<uint8_t> weight_image;
  impl->dec = vae_gpu_detail::pack_decoder(config, weights, options.conv_mode, weight_image);

  // Plan on shapes only, then check the fit before allocating anything.
  impl->conv = std::make_unique<ConvRunner>(options.find_algorithms, options.conv_workspace_limit);
  impl->dry(Pass::Size);
  impl->layout();
  impl->weights_bytes = weight_image.size();
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t need = impl->weights_bytes + impl->arena_size + kReserve;
  if (need > free_b) {
    WAN_THROW("GPU VAE decoder: the plan for latents ", shape.height, "x", shape.width, " needs ", mib(need),
              " MiB (weights ", mib(impl->weights_bytes), ", arena ", mib(impl->arena_size), ", reserve ", mib(kReserve),
              ") but only ", mib(free_b), " MiB are free; a smaller frame size would fit (the arena scales with H·W)");
  }
  CUDA_CHECK(cudaMalloc(&impl->weights, impl->weights_bytes));
  CUDA_CHECK(cudaMemcpy(impl->weights, weight_image.data(), impl->weights_bytes, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMalloc(&impl->arena, impl->arena_size));
  CUDA_CHECK(cudaMemset(impl->arena, 0, impl->arena_size));
  CUBLAS_CHECK(cublasCreate(&impl->blas));
  CUBLAS_CHECK(cublasSetWorkspace(impl->blas, impl->arena + impl->blas_off, kBlasWorkspace));
  if (options.find_algorithms) {
    impl->dry(Pass::Find);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  return std::unique_ptr<VaeDecoderGpu>(new VaeDecoderGpu(std::move(impl)));
}

void VaeDecoderGpu::decode(const float* latents, int64_t T, float* video, bool clamp, cudaStream_t stream) {
  Impl& m = *impl_;
  WAN_CHECK(T >= 1, "GPU VAE decoder: ", T, " latent frames");
  WAN_CHECK(latents && video, "GPU VAE decoder: null latents or video");
  m.pass = Pass::Run;
  m.stream = stream;
  m.conv_call = 0;
  m.checked_calls = 0;
  m.marks.clear();
  m.events_used = 0;
  CUBLAS_CHECK(cublasSetStream(m.blas, stream));  // resets the workspace to cuBLAS's own pool: set ours again
  CUBLAS_CHECK(cublasSetWorkspace(m.blas, m.arena + m.blas_off, kBlasWorkspace));
  if (m.opt.poison) CUDA_CHECK(cudaMemsetAsync(m.arena, 0xFF, m.arena_size, stream));
  CUDA_CHECK(cudaMemsetAsync(m.arena + m.slots_off, 0, m.slots_bytes, stream));  // causal zero history
  CUDA_CHECK(cudaMemsetAsync(m.arena + m.stats_off, 0, kAlign, stream));
  for (Slot& s : m.slots) s.seen = false;
  const int64_t F = frames_out(T);
  int64_t f0 = 0;
  for (int64_t t = 0; t < T; ++t) m.chunk(t, latents, T, video, F, f0, clamp);
  WAN_ASSERT(f0 == F, "GPU VAE decoder produced ", f0, " frames, expected ", F);
  if (m.opt.profile) m.finish_profile();
  if (m.opt.self_check) {
    float st[2];
    CUDA_CHECK(cudaMemcpyAsync(st, m.arena + m.stats_off, sizeof st, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    m.check_err = st[0];
    m.check_nonfinite = static_cast<int64_t>(st[1]);
  }
}

Tensor VaeDecoderGpu::decode(const Tensor& latents, bool clamp) {
  const Impl& m = *impl_;
  WAN_CHECK(latents.ndim() == 4 && latents.dim(0) == 16 && latents.dim(1) >= 1 && latents.dim(2) == m.shape.height &&
                latents.dim(3) == m.shape.width,
            "GPU VAE decoder: latents ", latents.shape().str(), " are not [16, T, ", m.shape.height, ", ", m.shape.width,
            "]");
  const Tensor z = latents.to_f32();
  const int64_t T = z.dim(1), F = frames_out(T), H = 8 * m.shape.height, W = 8 * m.shape.width;
  Tensor out = Tensor::empty(DType::F32, {3, F, H, W});
  float *dz = nullptr, *dv = nullptr;
  CUDA_CHECK(cudaMalloc(&dz, z.nbytes()));
  try {
    CUDA_CHECK(cudaMalloc(&dv, out.nbytes()));
    CUDA_CHECK(cudaMemcpy(dz, z.f32(), z.nbytes(), cudaMemcpyHostToDevice));
    decode(dz, T, dv, clamp, nullptr);
    CUDA_CHECK(cudaMemcpy(out.f32(), dv, out.nbytes(), cudaMemcpyDeviceToHost));
  } catch (...) {
    cudaFree(dz);
    cudaFree(dv);
    throw;
  }
  cudaFree(dz);
  cudaFree(dv);
  return out;
}

size_t VaeDecoderGpu::weight_bytes() const { return impl_->weights_bytes; }
size_t VaeDecoderGpu::arena_bytes() const { return impl_->arena_size; }

std::string VaeDecoderGpu::plan_str() const {
  const Impl& m = *impl_;
  std::ostringstream o;
  char line[200];
  std::snprintf(line, sizeof line, "GPU VAE decoder plan, latents %lldx%lld, %s convs: weights %.1f MiB, arena %.1f MiB\n",
                static_cast<long long>(m.shape.height), static_cast<long long>(m.shape.width),
                m.opt.conv_mode == VaeConvMode::Conv3d ? "3-D" : "folded 2-D", mib(m.weights_bytes), mib(m.arena_size));
  o << line;
  for (int r = 0; r < kRoles; ++r) {
    std::snprintf(line, sizeof line, "  %-22s %9.1f MiB at %9.1f%s\n", kRoleNames[r], mib(m.role_bytes[r]),
                  mib(m.role_off[r]), r > kU ? " (aliases u)" : "");
    o << line;
  }
  std::snprintf(line, sizeof line, "  %-22s %9.1f MiB (%zu slots)\n  %-22s %9.1f MiB\n  %-22s %9.1f MiB\n",
                "caches", mib(m.slots_bytes), m.slots.size(), "cudnn workspace", mib(m.ws_bytes), "cublas workspace",
                mib(kBlasWorkspace));
  o << line << "convolutions:\n" << m.conv->plans_str();
  return o.str();
}

std::string VaeDecoderGpu::profile_report() const { return impl_->last_profile; }
std::string VaeDecoderGpu::find_report() const { return impl_->conv->find_report(); }
float VaeDecoderGpu::self_check_max_err() const { return impl_->check_err; }
int64_t VaeDecoderGpu::self_check_nonfinite() const { return impl_->check_nonfinite; }
int64_t VaeDecoderGpu::conv_calls_checked() const { return impl_->checked_calls; }

}  // namespace wan::cuda
