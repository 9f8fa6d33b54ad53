// Memory-bound kernels of the Wan 2.1 / 2.2 VAE encoder and decoder on the GPU (everything but the
// convolutions and the attention GEMMs): host launchers on raw device pointers and a stream, no model
// types.
//
// Invariants: C % 8 == 0 and pointers 16-byte aligned (checked, wan::Error); launchers never
// synchronise; kernels are deterministic (fixed reduction order). Outputs never alias inputs except
// where stated (fuse: x_out may equal r).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace wan::cuda {

// Layout: activations are bf16 channels-last per frame, [T, H·W, C] ("NHWC" with the frames as the
// batch), so a position's channels are one contiguous row: the RMS norm reduces a row, an attention
// token is a row, and cuDNN's channels-last convolutions read it directly.
//
// Staging: the input of a temporal-kernel-3 causal convolution is a "stream" of T + 2 frames (the 2
// cached frames, then the chunk's T frames). StageDst says where stream frame s goes:
//   Plain   frame s at base + s·HW·C (a [T + 2, HW, C] buffer for cuDNN's 3-D convolution; the
//           non-staged outputs (attention norm, cache copies) use it with s counted from 0)
//   Folded  the temporal taps folded into channels: [T, HW, 3·C], where row (t, p) holds stream
//           frames t, t+1, t+2 in channel blocks dt = 0, 1, 2; stream frame s is written to every
//           (t = s - dt, dt) with 0 <= t < T, so a plain 2-D convolution over 3·C channels computes
//           the causal 3-D one.
// Numerics: sums, norms and SiLU in fp32 from bf16 inputs and fp32 biases/gammas, one rounding to
// bf16 per output. RMS norm: y = v / max(||v||_2, 1e-12) · sqrt(C) · gamma (spec §5.2).

using bf16 = __nv_bfloat16;

struct StageDst {
  enum Kind : int32_t { Plain = 0, Folded = 1 };
  bf16* base = nullptr;
  Kind kind = Plain;
  int32_t T = 1;    // Folded: chunk frames (rows of the folded buffer)
  int32_t s0 = 0;   // stream index of the first frame the producer writes (2 for a chunk's frames)
};

enum class NormMode : int32_t { Copy = 0, Rms = 1, RmsSilu = 2 };

// v = (a + a_bias) + (r + r_bias) over [P = T·HW, C] (r, biases optional: null = 0). Writes
// x_out = bf16(v) when x_out is set (may equal r: each element is read before it is written), and
// y = mode(v) (Copy: v; Rms / RmsSilu: RMS norm with gamma [C], then SiLU) to the stage destination
// of frame t = position / HW (stream frame y.s0 + t) when y.base is set. C <= 1024.
void vae_fuse(const bf16* a, const float* a_bias, const bf16* r, const float* r_bias, bf16* x_out, StageDst y,
              NormMode mode, const float* gamma, int64_t T, int64_t HW, int64_t C, cudaStream_t stream);

// Nearest ×2 up-sampling per frame with an optional channel split: in [T, H, W, split·C] (+ bias
// [split·C] fp32, optional) -> out [T·split, 2H, 2W, C], out frame t·split + j taking channels
// [j·C, (j+1)·C) of in frame t (the upsample3d time_conv's frame doubling). split 1 or 2.
void vae_upsample2x(const bf16* in, const float* bias, bf16* out, int64_t T, int64_t H, int64_t W, int64_t C,
                    int split, cudaStream_t stream);

// Folded staging <-> contiguous frames (the cache slots): put writes frames [n, HW, C] as stream
// frames s0 .. s0+n-1 into the folded buffer [T, HW, 3C]; get reads stream frames s0 .. s0+n-1 back
// (frame s from row t = min(s, T-1), block s - t) into [n, HW, C]. Streams have T + 2 frames.
void vae_folded_put(const bf16* frames, int64_t n, int64_t s0, bf16* folded, int64_t T, int64_t HW, int64_t C,
                    cudaStream_t stream);
void vae_folded_get(const bf16* folded, int64_t s0, int64_t n, bf16* frames, int64_t T, int64_t HW, int64_t C,
                    cudaStream_t stream);

// The decoder's input for one latent frame t: latents fp32 [Z, Tl, HW] (PyTorch [Z, T, h, w]);
// z = lat / inv_std + mean, y = b + Σ_ci w[co, ci]·z[ci] (conv2, 1×1×1, fp32, ci ascending), written
// as bf16 stream frame y.s0 of the stage destination. Z is 16 (Wan 2.1) or 48 (Wan 2.2).
void vae_latent_in(const float* latents, int64_t Z, int64_t Tl, int64_t t, int64_t HW, const float* inv_std,
                   const float* mean, const float* w, const float* b, StageDst y, cudaStream_t stream);

// The decoder's output: in [T, H·W, Cs] bf16 (the head conv, Cs >= 3·p² padded channels) + bias ->
// video fp32 [3, F, p·H, p·W] frames f0 .. f0+T-1, clamped to [-1, 1] when clamp. patch p = 1 or 2:
// the un-patchify, head channel c·p² + r·p + q going to pixel (y·p + q, x·p + r) (spec §6.1). Cs % 8 == 0.
void vae_video_out(const bf16* in, int64_t Cs, const float* bias, int64_t T, int64_t H, int64_t W, int patch,
                   float* video, int64_t F, int64_t f0, bool clamp, cudaStream_t stream);

// Frames f0 .. f1-1 of video fp32 [3, F, HW] -> rgb uint8 [f1 - f0, HW, 3], quantised exactly as
// formats/video.h's quantize_unit_to_u8 (clamp to [-1, 1], + 1, / 2, · 255 as separate fp32 roundings,
// truncation; NaN -> 0), so a video copied out this way has the bytes of the host quantisation.
void vae_video_rgb8(const float* video, int64_t F, int64_t HW, int64_t f0, int64_t f1, uint8_t* rgb,
                    cudaStream_t stream);

// The encoder's input: frames f0 .. f0+n-1 of video fp32 [3, F, H, W] (PyTorch [C, T, H, W]) patchified
// (patch p as vae_video_out: channel c·p² + r·p + q holds pixel (y·p + q, x·p + r)), rounded to bf16,
// channels 3·p² .. Cs-1 zero, written as stream frames y.s0 .. y.s0+n-1 of the stage destination
// ([n, (H/p)·(W/p), Cs]). Cs % 8 == 0.
void vae_video_in(const float* video, int64_t F, int64_t f0, int64_t n, int64_t H, int64_t W, int patch, int64_t Cs,
                  StageDst y, cudaStream_t stream);

// The encoder's output for latent frame t: v = in [HW, C2] bf16 (the head conv) + in_bias [C2];
// mu[co] = b[co] + Σ_ci w[co, ci]·v[ci] (top-level conv1, 1×1×1, fp32, ci ascending) for co < Z (the
// mean half, C2 = 2Z); latents fp32 [Z, Tl, HW] at frame t = (mu - mean) · inv_std.
void vae_latent_out(const bf16* in, const float* in_bias, int64_t Z, const float* w, const float* b, const float* mean,
                    const float* inv_std, float* latents, int64_t Tl, int64_t t, int64_t HW, cudaStream_t stream);

// The Wan 2.2 parameter-free stage shortcuts (spec §6.2) read from the stage's input `in`
// [Ti, hi·wi, Cin] bf16:
//   AvgDown  (encoder) output [ceil(Ti/ft), (hi/fs)·(wi/fs), Cout]: time left-padded with zero frames to a
//            multiple of ft, channel co averages the expanded channels j in [co·g, (co+1)·g),
//            j = ((c·ft + dt)·fs + dh)·fs + dw, g = Cin·ft·fs²/Cout (fp32 sum in j order, then / g)
//   DupUp    (decoder) output [Ti·ft - drop, (hi·fs)·(wi·fs), Cout]: output (t·ft + dt, y·fs + dh,
//            x·fs + dw, co) = in[t, y, x, j / rep], j = ((co·ft + dt)·fs + dh)·fs + dw,
//            rep = Cout·ft·fs²/Cin; the first `drop` frames (ft - 1 on the decoder's first chunk) dropped
struct VaeShortcut {
  enum Kind : int32_t { AvgDown = 0, DupUp = 1 };
  Kind kind = AvgDown;
  const bf16* in = nullptr;
  int64_t Ti = 0, hi = 0, wi = 0, Cin = 0;
  int32_t ft = 1, fs = 1, drop = 0;
};
// out = bf16(((a + a_bias) + (r + r_bias)) + shortcut) over the shortcut's output geometry [To, Ho·Wo, Cout]
// (r, biases optional: null = 0). out may equal a or r (each element is read before it is written), never
// sc.in.
void vae_shortcut_add(const bf16* a, const float* a_bias, const bf16* r, const float* r_bias, const VaeShortcut& sc,
                      bf16* out, int64_t Cout, cudaStream_t stream);
// The output geometry of a shortcut: frames, height, width.
void vae_shortcut_geometry(const VaeShortcut& sc, int64_t* To, int64_t* Ho, int64_t* Wo);

// out bf16 [rows, C] = bf16(in fp32 [rows, C] + bias [C]).
void vae_bias_to_bf16(const float* in, const float* bias, bf16* out, int64_t rows, int64_t C, cudaStream_t stream);

// Row softmax of s·scale: S fp32 [rows, N] -> P bf16 [rows, N] (max-subtracted, fp32 sums).
void vae_softmax_rows(const float* S, bf16* P, int64_t rows, int64_t N, float scale, cudaStream_t stream);

// Self-check of one convolution: a direct fp32 re-computation of `points` pseudo-randomly chosen
// outputs (seeded by `salt`) of the dense convolution in [D, H, W, Cin] * w [Cout, kt, kh, kw, Cin]
// -> out [Dout, Ho, Wo, Cout] (strides st in time and ss in space, zero padding (0, ph, pw),
// Dout = (D - kt) / st + 1, Ho = (H + 2ph - kh) / ss + 1). Error measure per point: |out - ref| /
// (Σ|x·w| + 1e-20); the maximum over the points is max-reduced into stats[0] (stats[1] counts
// non-finite outputs). stats are float[2] device memory.
void vae_conv_check(const bf16* in, const bf16* w, const bf16* out, int64_t D, int64_t H, int64_t W, int64_t Cin,
                    int64_t Cout, int kt, int kh, int kw, int ph, int pw, int points, uint32_t salt, float* stats,
                    cudaStream_t stream, int st = 1, int ss = 1);

}  // namespace wan::cuda
