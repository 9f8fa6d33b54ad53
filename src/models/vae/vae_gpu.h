// The Wan 2.1 and Wan 2.2 VAE decoders on one GPU in bf16 (spec §5, §6), with the reference's chunked
// causal execution: one latent frame per chunk, a 2-frame cache per temporal-kernel-3 convolution, the
// skipped first time_conv ("Rep") of each upsample3d, Wan 2.2's DupUp3D stage shortcuts (first-chunk
// frame drop) and un-patchify, clamp to [-1, 1]. The encoder is in vae_gpu_encoder.h.
//
// Memory is planned: create() walks the decoder once on shapes only (the first chunk and a later one),
// records every buffer role's largest use and every convolution's algorithm and workspace, then makes
// one weight allocation and one arena (activations, caches, workspace). Nothing is allocated by
// decode(). The plan depends on the latent height and width only; any number of latent frames decodes.
//
// Invariants: decode() is deterministic (fixed algorithms from cuDNN's heuristics unless
// find_algorithms; fixed reduction orders): the same latents give bit-identical video. All work is
// enqueued on the caller's stream; the object is not thread-safe. Released configurations only:
// Wan 2.1 (z_dim 16, patch 1) and Wan 2.2 (z_dim 48, patch 2), channel widths multiples of 8.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/config.h"
#include "core/tensor.h"
#include "models/vae/vae_tiling.h"
#include "models/vae/weights.h"

namespace wan::cuda {

// Execution: activations channels-last [frames, H·W, C]. A causal 3×3×3 convolution sees its 2 cached
// frames and the chunk's frames in a staging buffer, filled by the producer kernel (residual add + RMS
// norm + SiLU fused) and the cache copies, then one cuDNN call computes it:
//   VaeConvMode::Folded2d  (default) the 3 temporal taps folded into channels ([T, H, W, 3C]) and a
//                          2-D cuDNN convolution: 3× the staging writes, but cuDNN's tuned 2-D kernels
//   VaeConvMode::Conv3d    a cuDNN 3-D convolution over [T + 2, H, W, C] (time padding 0)
// Measured (H100, cuDNN 9.14, 720p, 81 frames, real widths): Folded2d 1.74 s (convs at 539 TFLOP/s),
// Conv3d 2.11 s (383 TFLOP/s: cuDNN's 3-D kernels run the 96-channel 720p convs at 245 TFLOP/s against
// 506 for the folded 2-D ones); timing every algorithm (find_algorithms) picked the heuristic's choice.
// Resample convs are 2-D cuDNN convolutions over the chunk's frames, 1×1 convs and attention cuBLAS
// GEMMs (attention per frame: S = QKᵀ in fp32, row softmax to bf16, PV), biases are added by the next
// kernel that reads a conv output.
enum class VaeConvMode : uint8_t { Conv3d, Folded2d };

struct VaeGpuOptions {
  VaeConvMode conv_mode = VaeConvMode::Folded2d;
  // Time every cuDNN algorithm once per convolution shape (cudnnFindConvolutionForwardAlgorithmEx) and
  // keep the fastest deterministic one. Faster convs perhaps, but the choice can differ between
  // processes (timing noise), so the video may too; off = cuDNN's heuristic order (reproducible).
  bool find_algorithms = false;
  size_t conv_workspace_limit = size_t{1} << 30;  // bytes an algorithm may ask for
  // Plan the convolution workspace at conv_workspace_limit without asking cuDNN for algorithms: an
  // upper bound of device_bytes() that is pure host arithmetic (cuDNN's queries take ~0.3 s; a run's
  // memory plan uses the bound and asks for the exact figure only when the bound does not fit).
  bool workspace_bound = false;
  bool poison = false;      // fill the arena with NaN bytes before every decode (tests: unwritten reads)
  bool self_check = false;  // re-compute sampled outputs of every conv in fp32 (debug; slow)
  bool profile = false;     // time every op with events (adds a sync per decode; see profile_report)
};

// Latent frame geometry the arena is planned for (the encoder's input frames are the VAE's spatial
// factor, 8 or 16, times it).
struct VaeGpuShape {
  int64_t height = 0, width = 0;  // latent
};

// Numerics: bf16 conv/attention weights and activations with fp32 accumulation (cuDNN convolutions with
// fp32 compute, cuBLAS GEMMs with CUBLAS_COMPUTE_32F); biases, norm gammas, RMS norm statistics, SiLU,
// residual sums and softmax in fp32 with one rounding per stored activation; the latent un-normalise
// and conv2 (1×1×1) and the output in fp32. Difference to the fp32 reference: that of bf16 activations,
// measured 1.1e-2 (tiny fixture) and 1.7e-2 (real widths, random weights) relative L2 for Wan 2.1, 0.86
// to 1.06 times the error of the same decoder done plainly in bf16 (tests/gpu/test_vae_gpu.cu).
class VaeDecoderGpu {
 public:
  // Uploads the decoder (and top-level conv2) weights of a Wan 2.1 or 2.2 VAE (any float dtype,
  // converted on the host) and plans the arena for latents of `shape`. Throws wan::Error on an unsupported
  // configuration, inconsistent weights, or when the plan does not fit in free device memory.
  static std::unique_ptr<VaeDecoderGpu> create(const VaeConfig& config, const VaeWeights& weights, VaeGpuShape shape,
                                               const VaeGpuOptions& options = {});
  // create() in two halves. plan() does the host work (weights packed, convolution plans, arena
  // layout) and takes no device memory beyond cuDNN's handle, so it can run on a host thread while
  // another model still holds the device; allocate() then checks the fit and uploads (once; decode
  // needs it). The same errors as create(), each from the half that finds it.
  static std::unique_ptr<VaeDecoderGpu> plan(const VaeConfig& config, const VaeWeights& weights, VaeGpuShape shape,
                                             const VaeGpuOptions& options = {});
  void allocate();
  bool allocated() const;
  // The device bytes create() would need (weights + arena + reserve) for latents of `shape`, planned
  // on the config's shapes alone (no weights read, nothing allocated on the device; cuDNN is asked
  // for its workspaces on the current device). Throws wan::Error on an unsupported configuration.
  static size_t device_bytes(const VaeConfig& config, VaeGpuShape shape, const VaeGpuOptions& options = {});
  ~VaeDecoderGpu();
  VaeDecoderGpu(const VaeDecoderGpu&) = delete;
  VaeDecoderGpu& operator=(const VaeDecoderGpu&) = delete;

  // latents: device fp32 [z, T, h, w] (normalised, PyTorch order) -> video: device fp32
  // [3, F, sf·h, sf·w] (sf = 8 for Wan 2.1, 16 for Wan 2.2), F = 1 + 4(T - 1). Enqueued on `stream`;
  // returns without synchronising (except with profile or self_check, which synchronise at the end).
  // chunk_enqueued (optional) is called on the host after each chunk's work is enqueued, with the video
  // frames [f0, f1) that work writes: a caller can enqueue its own use of them (a copy out) behind it.
  using ChunkFn = std::function<void(int64_t f0, int64_t f1)>;
  void decode(const float* latents, int64_t T, float* video, bool clamp, cudaStream_t stream,
              const ChunkFn& chunk_enqueued = {});
  // Host convenience: latents [z, T, h, w] (any float dtype) -> video [3, F, H, W] float32.
  Tensor decode(const Tensor& latents, bool clamp = true);
  // Host: latents [z, T, h, w] of any h, w decoded in the spatial tiles of `tiling` (vae_tiling.h), whose
  // tile size (vae_tile_size) must be this decoder's planned shape: each tile's latents go to the device and
  // its unclamped video comes back, and the blend builds the video on the host, so the device holds this
  // decoder and one tile's latents and video, whatever the frame size. tile_done(n) (optional) after n
  // tiles; what it throws ends the decode. -> video [3, F, sf·h, sf·w] float32.
  Tensor decode_tiled(const Tensor& latents, const VaeTiling& tiling, bool clamp = true,
                      const std::function<void(int64_t tiles_done)>& tile_done = {});

  int64_t frames_out(int64_t T) const;
  int64_t z_dim() const;
  int spatial_factor() const;  // video pixels per latent pixel (8 or 16)
  size_t weight_bytes() const;
  size_t arena_bytes() const;
  std::string plan_str() const;  // buffers, caches and convolution plans (MiB, algorithms)
  // With options.profile: time per op class and per convolution shape of the last decode, and the
  // achieved TFLOP/s of the convolutions.
  std::string profile_report() const;
  // With options.find_algorithms: every algorithm cuDNN timed, per convolution shape.
  std::string find_report() const;
  // With options.self_check: max over all checked conv outputs of |out - ref| / Σ|x·w| and the count
  // of non-finite outputs, for the last decode.
  float self_check_max_err() const;
  int64_t self_check_nonfinite() const;
  int64_t conv_calls_checked() const;

  struct Impl;

 private:
  explicit VaeDecoderGpu(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace wan::cuda
