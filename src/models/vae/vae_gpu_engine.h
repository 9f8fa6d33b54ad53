// What the GPU VAE encoder and decoder share (internal to vae_gpu*.cpp): the planned arena, the cache
// slots, the three passes over one schedule, and the blocks both coders run (causal convolution with
// its 2-frame cache, residual block, attention block, the Wan 2.2 stage shortcuts). A coder derives
// from Engine and writes its chunk schedule once; the passes make the plan agree with the work:
// Size (shapes only: each buffer role's largest use, the cache slots, every conv plan), Find (find
// mode only: times cuDNN's algorithms on the arena's buffers) and Run.
//
// Dataflow: a conv output is never biased in place; the value of the residual stream is kept "pending"
// as (a + a_bias) + (r + r_bias) and materialised by the next kernel that needs it (vae_fuse), which
// also writes the next conv's normalised input into the staging. Buffer roles:
//   X   the residual stream (bf16 [T, HW, C]), written in place by the fuse kernel
//   H0  conv outputs (read once by the next fuse/upsample before the next conv overwrites it)
//   H1  the 1×1 shortcut of a ResidualBlock that changes width
//   S   conv staging (the 2 cached frames + the chunk, the folded layout, or down3d's time stream)
//   I   a Wan 2.2 stage's input, kept for its AvgDown3D / DupUp3D shortcut
//   U   up-sampled frames; the attention's scratch (Q/K/V, scores, probabilities) aliases it
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/vae_conv.h"
#include "kernels/vae_kernels.h"
#include "models/config.h"
#include "models/vae/vae_gpu.h"
#include "models/vae/vae_gpu_weights.h"
#include "models/vae/weights.h"

namespace wan::cuda::vae_gpu_detail {

using vae_detail::ConvRunner;
using vae_detail::ConvShape;

constexpr size_t kBlasWorkspace = size_t{32} << 20;  // cuBLAS's recommended Hopper workspace
constexpr size_t kReserve = size_t{512} << 20;       // left free for handles, kernels, library internals
constexpr int kCheckPoints = 64;                     // sampled outputs per conv in self-check mode

inline double mib(size_t b) { return static_cast<double>(b) / 1048576.0; }

enum Role { kX, kH0, kH1, kS, kI, kU, kAN, kAQ32, kAQ, kAS, kAP, kAO, kRoles };

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
  bool seen = false;  // upsample3d: "Rep" (first call done); downsample3d: first chunk kept
};

enum class Pass { Size, Find, Run };

// Weights of the configuration's table shapes, allocated and never read: device_bytes plans with them.
VaeWeights placeholder_weights(const VaeConfig& config);
// Throws wan::Error (naming `what`) unless the configuration is a released one the GPU VAE runs:
// Wan 2.1 (z_dim 16, patch 1) or Wan 2.2 (z_dim 48, patch 2), and the latent size is positive.
void check_supported(const VaeConfig& config, VaeGpuShape shape, const char* what);
// Host convenience of a device run: uploads `in` (fp32), runs run(device in, device out) on the
// default stream and downloads `out` (its shape fixed by the caller).
void run_on_host(const Tensor& in, Tensor& out, const std::function<void(const float*, float*)>& run);

using PackFn = DevVae (*)(const VaeConfig&, const VaeWeights&, VaeConvMode, std::vector<uint8_t>&, size_t*);

class Engine {
 public:
  explicit Engine(const VaeGpuOptions& options) : opt(options) {}
  virtual ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  VaeGpuOptions opt;
  VaeGpuShape shape;  // latent frame size the arena is planned for
  int tf = 4, sf = 8;  // the VAE's temporal and spatial factors
  DevVae net;
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

  // Profile: events around every op of the last run.
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

  // The coder's shape-only walk of its first and one later chunk (Size and Find passes).
  virtual void dry_chunks() = 0;

  // ---- lifecycle ----
  // Packs the weights with `pack` into *image (or, without an image, only sizes them), then plans on
  // shapes only (conv runner, Size pass, layout); nothing is allocated on the device.
  void prepare(PackFn pack, const VaeConfig& config, const VaeWeights& w, VaeGpuShape s, std::vector<uint8_t>* image);
  // Checks the fit, allocates and uploads the weights and the arena, makes the cuBLAS handle and, in
  // find mode, times the algorithms. `what` names the coder in the error when the plan does not fit.
  void allocate(const std::vector<uint8_t>& weight_image, const char* what);
  size_t planned_bytes() const { return weights_bytes + arena_size + kReserve; }
  // Starts a Run pass on `stream` (caches zeroed, counters reset); finish_run() ends it (profile,
  // self-check statistics; both synchronise only when those options are on).
  void start_run(cudaStream_t s);
  void finish_run();
  std::string plan_str(const std::string& title) const;

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
    check_role(r, bytes);
    return reinterpret_cast<T*>(arena + role_off[r]);
  }
  Slot& next_slot(size_t bytes);
  bf16* slot_ptr(const Slot& s) { return running() ? reinterpret_cast<bf16*>(arena + s.off) : nullptr; }

  // ---- profiling ----
  int event();
  struct Scope {
    Engine* m;
    int e0 = -1;
    std::string name;
    double flops;
    Scope(Engine* e, std::string n, double f = 0) : m(e), name(std::move(n)), flops(f) {
      if (m->running() && m->opt.profile) e0 = m->event();
    }
    ~Scope() {
      if (e0 >= 0) m->marks.push_back(Mark{std::move(name), flops, e0, m->event()});
    }
  };

  // ---- ops ----
  void fuse(const Pending& P, bf16* x_out, StageDst y, NormMode mode, size_t gamma_off, bool has_gamma);
  // Writes the pending value into X (if it is not there already); returns it as a plain pending.
  Pending materialize(const Pending& P);
  void run_conv(const DevConv& cv, const ConvShape& s, const bf16* in, bf16* out);
  void copy_async(void* dst, const void* src, size_t bytes);  // device to device, Run pass only

  // A temporal-kernel-3 causal conv of the chunk's T frames with the slot's 2 cached frames in front:
  // produce(dst) writes the T input frames (stream frames 2..T+1); the slot then keeps frames T, T+1.
  template <class Produce>
  void causal_conv(const DevConv& cv, Slot& slot, int64_t T, int64_t H, int64_t W, Produce produce, bf16* out) {
    const int64_t C = cv.cin, HW = H * W;
    const bool folded = opt.conv_mode == VaeConvMode::Folded2d;
    bf16* S = buf(kS, (folded ? 3 * T : T + 2) * HW * C * 2);
    bf16* cache = slot_ptr(slot);
    cache_in(cache, S, T, HW, C, folded);
    produce(StageDst{S, folded ? StageDst::Folded : StageDst::Plain, static_cast<int32_t>(T), 2});
    run_conv(cv, causal_shape(cv, T, H, W, folded), S, out);
    cache_out(S, cache, T, HW, C, folded);
  }

  // y[M, N] = x[M, K] · w[N, K]ᵀ (row-major, leading dims in elements), bf16 in, fp32 accumulate.
  void gemm_xwT(const bf16* x, int64_t ldx, const bf16* w, int64_t ldw, void* y, int64_t ldy, bool y_f32, int64_t M,
                int64_t N, int64_t K);

  // ---- blocks ----
  Pending resblock(const DevRes& b, const Pending& P);
  Pending attention(const DevAttn& m, const Pending& P);
  // Wan 2.2 stage shortcut: stage_input keeps the stage's input in role I (returned as a plain
  // pending there); add_shortcut materialises P + AvgDown3D / DupUp3D(in) into X (drop: DupUp3D's
  // dropped leading frames).
  Pending stage_input(const Pending& P);
  Pending add_shortcut(const DevStage& st, VaeShortcut::Kind kind, const Pending& P, const Pending& in, int drop);

 private:
  void check_role(Role r, size_t bytes) const;
  ConvShape causal_shape(const DevConv& cv, int64_t T, int64_t H, int64_t W, bool folded) const;
  void cache_in(const bf16* cache, bf16* S, int64_t T, int64_t HW, int64_t C, bool folded);
  void cache_out(const bf16* S, bf16* cache, int64_t T, int64_t HW, int64_t C, bool folded);
  void dry(Pass p);
  void layout();
  void finish_profile();
};

// A coder ImplT (an Engine) planned for `shape`: checked, its weights packed with `pack` into *image
// (or, without an image, only sized), then the Size pass and the layout.
template <class ImplT>
std::unique_ptr<ImplT> planned(PackFn pack, const char* what, const VaeConfig& config, const VaeWeights& weights,
                               VaeGpuShape shape, const VaeGpuOptions& options, std::vector<uint8_t>* image) {
  check_supported(config, shape, what);
  auto impl = std::make_unique<ImplT>(options);
  impl->prepare(pack, config, weights, shape, image);
  return impl;
}
// A coder's device_bytes: planned on placeholder weights of the config's shapes.
template <class ImplT>
size_t planned_device_bytes(PackFn pack, const char* what, const VaeConfig& config, VaeGpuShape shape,
                            const VaeGpuOptions& options) {
  check_supported(config, shape, what);
  return planned<ImplT>(pack, what, config, placeholder_weights(config), shape, options, nullptr)->planned_bytes();
}
// A coder's create: planned, then allocated.
template <class ImplT>
std::unique_ptr<ImplT> created(PackFn pack, const char* what, const VaeConfig& config, const VaeWeights& weights,
                               VaeGpuShape shape, const VaeGpuOptions& options) {
  std::vector<uint8_t> image;
  auto impl = planned<ImplT>(pack, what, config, weights, shape, options, &image);
  impl->allocate(image, what);
  return impl;
}

}  // namespace wan::cuda::vae_gpu_detail
