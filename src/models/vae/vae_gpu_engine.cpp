// The GPU VAE's shared machinery (see vae_gpu_engine.h): arena planning and layout, the cache slots,
// the blocks both coders run, profiling and the self-check. Every op enqueues on the pass's stream
// only in the Run pass; in the Size pass it records buffer sizes and conv plans, so one schedule
// serves both.
#include "models/vae/vae_gpu_engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "core/error.h"
#include "kernels/check.h"
#include "models/weight_spec.h"

namespace wan::cuda::vae_gpu_detail {
namespace {

constexpr const char* kRoleNames[kRoles] = {"x (residual stream)", "h0 (conv out)",   "h1 (shortcut)",
                                            "s (conv staging)",    "i (stage input)", "u (up-sampled)",
                                            "attn norm",           "attn qkv fp32",   "attn qkv",
                                            "attn scores fp32",    "attn probs",      "attn out"};

}  // namespace

VaeWeights placeholder_weights(const VaeConfig& config) {
  std::map<std::string, Shape> shapes = shape_map(vae_weight_table(config));
  return load_vae_weights(config, [&shapes](const std::string& name) {
    auto it = shapes.find(name);
    WAN_ASSERT(it != shapes.end(), "VAE table has no ", name);
    return Tensor::empty(DType::F32, it->second);
  });
}

void check_supported(const VaeConfig& config, VaeGpuShape shape, const char* what) {
  const bool v21 = config.version == 21 && config.z_dim == 16 && config.patch == 1;
  const bool v22 = config.version == 22 && config.z_dim == 48 && config.patch == 2;
  WAN_CHECK(v21 || v22, what, ": only the Wan 2.1 (z_dim 16, no patch) and Wan 2.2 (z_dim 48, patch 2) VAEs ",
            "are supported, got version ", config.version, ", z_dim ", config.z_dim, ", patch ", config.patch);
  WAN_CHECK(static_cast<int>(config.latents_mean.size()) == config.z_dim &&
                static_cast<int>(config.latents_std.size()) == config.z_dim,
            what, ": latent mean/std tables must have ", config.z_dim, " entries");
  WAN_CHECK(shape.height >= 1 && shape.width >= 1, what, ": latent size ", shape.height, "x", shape.width);
}

void run_on_host(const Tensor& in, Tensor& out, const std::function<void(const float*, float*)>& run) {
  const Tensor x = in.to_f32();
  float *dx = nullptr, *dy = nullptr;
  CUDA_CHECK(cudaMalloc(&dx, x.nbytes()));
  try {
    CUDA_CHECK(cudaMalloc(&dy, out.nbytes()));
    CUDA_CHECK(cudaMemcpy(dx, x.f32(), x.nbytes(), cudaMemcpyHostToDevice));
    run(dx, dy);
    CUDA_CHECK(cudaMemcpy(out.f32(), dy, out.nbytes(), cudaMemcpyDeviceToHost));
  } catch (...) {
    cudaFree(dx);
    cudaFree(dy);
    throw;
  }
  cudaFree(dx);
  cudaFree(dy);
}

Engine::~Engine() {
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  if (blas) cublasDestroy(blas);
  if (arena) cudaFree(arena);
  if (weights) cudaFree(weights);
}

// ---- lifecycle ----

void Engine::prepare(PackFn pack, const VaeConfig& config, const VaeWeights& w, VaeGpuShape s,
                     std::vector<uint8_t>* image) {
  shape = s;
  tf = vae_temporal_factor(config);
  sf = vae_spatial_factor(config);
  std::vector<uint8_t> unused;
  size_t sized = 0;
  net = pack(config, w, opt.conv_mode, image ? *image : unused, image ? nullptr : &sized);
  weights_bytes = image ? image->size() : sized;
  conv = std::make_unique<ConvRunner>(opt.find_algorithms, opt.conv_workspace_limit);
  dry(Pass::Size);
  if (!opt.workspace_bound) conv->choose();
  layout();
}

void Engine::allocate(const std::vector<uint8_t>& weight_image, const char* what) {
  WAN_ASSERT(weights_bytes == weight_image.size(), "vae weights: planned ", weights_bytes, " bytes, packed ",
             weight_image.size());
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t need = planned_bytes();
  if (need > free_b) {
    WAN_THROW(what, ": the plan for latents ", shape.height, "x", shape.width, " needs ", mib(need), " MiB (weights ",
              mib(weights_bytes), ", arena ", mib(arena_size), ", reserve ", mib(kReserve), ") but only ", mib(free_b),
              " MiB are free; a smaller frame size would fit (the arena scales with H·W)");
  }
  CUDA_CHECK(cudaMalloc(&weights, weights_bytes));
  CUDA_CHECK(cudaMemcpy(weights, weight_image.data(), weights_bytes, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMalloc(&arena, arena_size));
  CUDA_CHECK(cudaMemset(arena, 0, arena_size));
  CUBLAS_CHECK(cublasCreate(&blas));
  CUBLAS_CHECK(cublasSetWorkspace(blas, arena + blas_off, kBlasWorkspace));
  if (opt.find_algorithms) {
    dry(Pass::Find);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
}

void Engine::start_run(cudaStream_t s) {
  pass = Pass::Run;
  stream = s;
  conv_call = 0;
  checked_calls = 0;
  marks.clear();
  events_used = 0;
  CUBLAS_CHECK(cublasSetStream(blas, stream));  // resets the workspace to cuBLAS's own pool: set ours again
  CUBLAS_CHECK(cublasSetWorkspace(blas, arena + blas_off, kBlasWorkspace));
  if (opt.poison) CUDA_CHECK(cudaMemsetAsync(arena, 0xFF, arena_size, stream));
  CUDA_CHECK(cudaMemsetAsync(arena + slots_off, 0, slots_bytes, stream));  // causal zero history
  CUDA_CHECK(cudaMemsetAsync(arena + stats_off, 0, kAlign, stream));
  for (Slot& sl : slots) sl.seen = false;
}

void Engine::finish_run() {
  if (opt.profile) finish_profile();
  if (opt.self_check) {
    float st[2];
    CUDA_CHECK(cudaMemcpyAsync(st, arena + stats_off, sizeof st, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    check_err = st[0];
    check_nonfinite = static_cast<int64_t>(st[1]);
  }
}

// Runs the schedule of the first and of a later chunk without work (Size, Find passes).
void Engine::dry(Pass p) {
  pass = p;
  stream = nullptr;
  for (Slot& s : slots) s.seen = false;
  dry_chunks();
  for (Slot& s : slots) s.seen = false;
}

void Engine::layout() {
  size_t off = 0;
  for (int r : {kX, kH0, kH1, kS, kI}) {
    role_off[r] = off;
    off += role_bytes[r];
  }
  // The attention runs only at the latent level, where no chunk up-samples (the decoder runs it before
  // its first up-sampler, the encoder has none): its scratch shares the up-sampling buffer.
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
  ws_bytes = align_up(opt.find_algorithms || opt.workspace_bound ? opt.conv_workspace_limit : conv->max_workspace());
  off += ws_bytes;
  blas_off = off;
  off += kBlasWorkspace;
  stats_off = off;
  off += kAlign;
  arena_size = off;
}

std::string Engine::plan_str(const std::string& title) const {
  std::ostringstream o;
  char line[240];
  std::snprintf(line, sizeof line, "%s plan, latents %lldx%lld, %s convs: weights %.1f MiB, arena %.1f MiB\n",
                title.c_str(), static_cast<long long>(shape.height), static_cast<long long>(shape.width),
                opt.conv_mode == VaeConvMode::Conv3d ? "3-D" : "folded 2-D", mib(weights_bytes), mib(arena_size));
  o << line;
  for (int r = 0; r < kRoles; ++r) {
    std::snprintf(line, sizeof line, "  %-22s %9.1f MiB at %9.1f%s\n", kRoleNames[r], mib(role_bytes[r]),
                  mib(role_off[r]), r > kU ? " (aliases u)" : "");
    o << line;
  }
  std::snprintf(line, sizeof line, "  %-22s %9.1f MiB (%zu slots)\n  %-22s %9.1f MiB\n  %-22s %9.1f MiB\n", "caches",
                mib(slots_bytes), slots.size(), "cudnn workspace", mib(ws_bytes), "cublas workspace",
                mib(kBlasWorkspace));
  o << line << "convolutions:\n" << conv->plans_str();
  return o.str();
}

// ---- buffers ----

void Engine::check_role(Role r, size_t bytes) const {
  WAN_ASSERT(bytes <= role_bytes[r], "vae arena role ", kRoleNames[r], ": ", bytes, " > planned ", role_bytes[r]);
}

Slot& Engine::next_slot(size_t bytes) {
  if (pass == Pass::Size && slot_i == slots.size()) slots.push_back(Slot{0, align_up(bytes), false});
  WAN_ASSERT(slot_i < slots.size() && slots[slot_i].bytes == align_up(bytes), "vae cache slot ", slot_i,
             " visited with a different size");
  return slots[slot_i++];
}

// ---- profiling ----

int Engine::event() {
  if (events_used == events.size()) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    events.push_back(e);
  }
  CUDA_CHECK(cudaEventRecord(events[events_used], stream));
  return static_cast<int>(events_used++);
}

void Engine::finish_profile() {
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

// ---- ops ----

void Engine::fuse(const Pending& P, bf16* x_out, StageDst y, NormMode mode, size_t gamma_off, bool has_gamma) {
  if (!running()) return;
  Scope sc(this, "fuse/norm");
  vae_fuse(P.a, P.ab, P.r, P.rb, x_out, y, mode, has_gamma ? wp<float>(gamma_off) : nullptr, P.T, P.H * P.W, P.C,
           stream);
}

Pending Engine::materialize(const Pending& P) {
  bf16* X = buf(kX, P.T * P.H * P.W * P.C * 2);
  if (!P.plain_at(X)) fuse(P, X, StageDst{}, NormMode::Copy, 0, false);
  Pending o = P;
  o.a = X;
  o.ab = nullptr;
  o.r = nullptr;
  o.rb = nullptr;
  return o;
}

void Engine::copy_async(void* dst, const void* src, size_t bytes) {
  if (!running()) return;
  Scope sc(this, "cache copies");
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

void Engine::run_conv(const DevConv& cv, const ConvShape& s, const bf16* in, bf16* out) {
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
                   conv_call, reinterpret_cast<float*>(arena + stats_off), stream, s.is3d ? s.st : 1, s.ss);
    ++checked_calls;
  }
  ++conv_call;
}

ConvShape Engine::causal_shape(const DevConv& cv, int64_t T, int64_t H, int64_t W, bool folded) const {
  ConvShape s;
  s.is3d = !folded;
  s.n = folded ? T : 1;
  s.d = folded ? 1 : T + 2;
  s.h = H;
  s.w = W;
  s.c = folded ? 3 * cv.cin : cv.cin;
  s.k = cv.cout_pad;
  s.kt = folded ? 1 : 3;
  s.kh = cv.kh;
  s.kw = cv.kw;
  s.ph = cv.kh / 2;
  s.pw = cv.kw / 2;
  return s;
}

void Engine::cache_in(const bf16* cache, bf16* S, int64_t T, int64_t HW, int64_t C, bool folded) {
  if (!running()) return;
  Scope sc(this, "cache copies");
  if (folded)
    vae_folded_put(cache, 2, 0, S, T, HW, C, stream);
  else
    CUDA_CHECK(cudaMemcpyAsync(S, cache, 2 * static_cast<size_t>(HW * C) * 2, cudaMemcpyDeviceToDevice, stream));
}

void Engine::cache_out(const bf16* S, bf16* cache, int64_t T, int64_t HW, int64_t C, bool folded) {
  if (!running()) return;
  Scope sc(this, "cache copies");
  if (folded)
    vae_folded_get(S, T, 2, cache, T, HW, C, stream);
  else
    CUDA_CHECK(
        cudaMemcpyAsync(cache, S + T * HW * C, 2 * static_cast<size_t>(HW * C) * 2, cudaMemcpyDeviceToDevice, stream));
}

void Engine::gemm_xwT(const bf16* x, int64_t ldx, const bf16* w, int64_t ldw, void* y, int64_t ldy, bool y_f32,
                      int64_t M, int64_t N, int64_t K) {
  const float one = 1.0f, zero = 0.0f;
  CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M),
                            static_cast<int>(K), &one, w, CUDA_R_16BF, static_cast<int>(ldw), x, CUDA_R_16BF,
                            static_cast<int>(ldx), &zero, y, y_f32 ? CUDA_R_32F : CUDA_R_16BF, static_cast<int>(ldy),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// ---- blocks ----

Pending Engine::resblock(const DevRes& b, const Pending& P) {
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

Pending Engine::attention(const DevAttn& m, const Pending& P) {
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

Pending Engine::stage_input(const Pending& P) {
  bf16* I = buf(kI, P.T * P.H * P.W * P.C * 2);
  fuse(P, I, StageDst{}, NormMode::Copy, 0, false);
  return Pending{I, nullptr, nullptr, nullptr, P.T, P.H, P.W, P.C};
}

Pending Engine::add_shortcut(const DevStage& st, VaeShortcut::Kind kind, const Pending& P, const Pending& in,
                             int drop) {
  const VaeShortcut sc{kind, in.a, in.T, in.H, in.W, in.C, st.sc_ft, st.sc_fs, drop};
  int64_t To = 0, Ho = 0, Wo = 0;
  vae_shortcut_geometry(sc, &To, &Ho, &Wo);
  WAN_ASSERT(To == P.T && Ho == P.H && Wo == P.W && st.sc_out == P.C, "vae stage shortcut gives [", To, ", ", Ho, "x",
             Wo, ", ", st.sc_out, "], the stage [", P.T, ", ", P.H, "x", P.W, ", ", P.C, "]");
  bf16* X = buf(kX, To * Ho * Wo * P.C * 2);
  if (running()) {
    Scope s(this, kind == VaeShortcut::AvgDown ? "avg-down shortcut" : "dup-up shortcut");
    vae_shortcut_add(P.a, P.ab, P.r, P.rb, sc, X, P.C, stream);
  }
  return Pending{X, nullptr, nullptr, nullptr, To, Ho, Wo, P.C};
}

}  // namespace wan::cuda::vae_gpu_detail
