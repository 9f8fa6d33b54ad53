// CPU float32 ops of the Wan VAEs (spec §5.2, §6.1): causal 3-D / 2-D convolution, channel RMS norm,
// SiLU, nearest up-sampling, per-frame single-head attention and the Wan 2.2 parameter-free paths
// (pixel patchify, AvgDown3D, DupUp3D).
// Layout: activations are FRAME-MAJOR float32 tensors [T, C, H, W] (batch 1), so one frame is one
// contiguous [C, H, W] block; causal padding and the chunk caches then reduce to lists of frame
// pointers (no copies), and a chunk's frames can be appended to a video frame by frame. The model
// API converts from / to PyTorch's [C, T, H, W] at its edges (to_frames / from_frames).
// Invariants: every op is multi-threaded with wan::parallel_for and deterministic (each output
// element sums over its inputs in a fixed order, independent of the thread count); inputs are
// never modified unless the name ends in _inplace; shapes are checked (wan::Error naming the op).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace wan::vae {

// [C, T, H, W] <-> [T, C, H, W] (a transpose of the two leading dims; any float dtype in, f32 out).
Tensor to_frames(const Tensor& cthw);
Tensor from_frames(const Tensor& tchw);

// Frame-major helpers.
inline int64_t frame_elems(const Tensor& x) { return x.dim(1) * x.dim(2) * x.dim(3); }
inline const float* frame_ptr(const Tensor& x, int64_t t) { return x.f32() + t * frame_elems(x); }
// Frames [t0, t1) as a new tensor (copy).
Tensor slice_frames(const Tensor& x, int64_t t0, int64_t t1);
// Concatenation along T (either may be undefined = empty).
Tensor cat_frames(const Tensor& a, const Tensor& b);

// Convolution geometry beyond the kernel size (which comes from the weight).
struct ConvGeom {
  int st = 1, sh = 1, sw = 1;                  // strides (time, height, width)
  int pad_top = 0, pad_bottom = 0;             // spatial zero padding; time padding is done by the
  int pad_left = 0, pad_right = 0;             // caller through null entries in the frame list
  static ConvGeom same(int p) { return {1, 1, 1, p, p, p, p}; }
};

// 3-D convolution over a list of input frames: frames[i] -> [Cin, H, W], or nullptr for an all-zero
// frame (causal padding). weight [Cout, Cin, kt, kh, kw] (5-D) or a Conv2d weight [Cout, Cin, kh, kw]
// (kt = 1); bias [Cout] (may be undefined). Output [Tout, Cout, Hout, Wout] with
// Tout = (frames.size() - kt) / st + 1, Hout = (H + pad_top + pad_bottom - kh) / sh + 1 (same for W).
// im2col tiles packed into 16-column panels + a register-blocked GEMM; fp32 sums over
// k = (ci, dt, dy, dx) in increasing order, bias added first.
Tensor conv3d(const std::vector<const float*>& frames, int64_t Cin, int64_t H, int64_t W, const Tensor& weight,
              const Tensor& bias, const ConvGeom& g);
// The frames of x as a pointer list (convenience for conv3d).
std::vector<const float*> frame_list(const Tensor& x);
// Conv2d applied to every frame of x [T, Cin, H, W] independently.
Tensor conv2d_frames(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeom& g);

// RMS_norm over channels (spec §5.2): y = x / max(||x||_2 over C, 1e-12) * sqrt(C) * gamma[c], then
// SiLU (y * sigmoid(y)) when silu is set. x [T, C, H, W]; gamma has C elements (any shape).
Tensor rms_norm(const Tensor& x, const Tensor& gamma, bool silu);

// x += y (same shape).
void add_inplace(Tensor& x, const Tensor& y);
// x = min(max(x, lo), hi).
void clamp_inplace(Tensor& x, float lo, float hi);

// Nearest-neighbour x2 in H and W per frame ("nearest-exact" at factor 2: out[i] = in[i / 2]).
Tensor upsample_nearest2x(const Tensor& x);

// Wan AttentionBlock core for every frame of x [T, C, H, W]: n = rms_norm(x) (images gamma);
// qkv = to_qkv(n) (1x1, q = channels [0, C), k = [C, 2C), v = [2C, 3C)); single-head softmax
// attention over the H*W tokens with scale 1/sqrt(C); proj (1x1); returns x + proj(attn).
Tensor attention_block(const Tensor& x, const Tensor& gamma, const Tensor& qkv_w, const Tensor& qkv_b,
                       const Tensor& proj_w, const Tensor& proj_b);

// Wan 2.2 pixel patchify (spec §6.1): [T, C, H, W] -> [T, C*p*p, H/p, W/p] with channel
// c*p*p + r*p + q, q = row offset, r = column offset inside the p x p patch; unpatchify inverts it.
Tensor patchify(const Tensor& x, int p);
Tensor unpatchify(const Tensor& x, int p);

// AvgDown3D(Cin -> Cout, ft, fs) (spec §6.2): left-pads time with zero frames to a multiple of ft,
// groups (ft x fs x fs) neighbourhoods into channels ordered (c, dt, dh, dw) and averages groups of
// Cin*ft*fs*fs/Cout consecutive channels. x [T, Cin, H, W] -> [ceil(T/ft), Cout, H/fs, W/fs].
Tensor avg_down3d(const Tensor& x, int64_t Cout, int ft, int fs);
// DupUp3D(Cin -> Cout, ft, fs): repeats every channel Cout*ft*fs*fs/Cin times, reads the result as
// (c, dt, dh, dw) and scatters to (t*ft + dt, h*fs + dh, w*fs + dw); drops the first ft - 1 output
// frames when first_chunk. x [T, Cin, H, W] -> [T*ft (- (ft-1)), Cout, H*fs, W*fs].
Tensor dup_up3d(const Tensor& x, int64_t Cout, int ft, int fs, bool first_chunk);

}  // namespace wan::vae
