// Image preprocessing ops (see image_ops.h): the reference's normalisation, torch's float32 bicubic
// interpolate and Pillow's 8-bit Lanczos resize, reproduced operation for operation.
// Invariants: each output element is computed by one fixed sequence of float / integer operations (no
// reassociation; -ffp-contract=off plus explicit std::fma where torch's kernels fuse), so results are
// bit-identical to the reference and independent of the thread count; all indices are clamped or
// bounds-checked against the input before use.
#include "ops/image_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "core/error.h"
#include "core/thread_pool.h"

namespace wan {
namespace {

// Bounds sizes so every index product below fits comfortably in int64 (and Pillow's int arithmetic).
constexpr int64_t kMaxSide = 1 << 20;

// ---- bicubic (torch) -----------------------------------------------------------------------------------

// Keys cubic convolution with A = -0.75 (UpSample.h: cubic_convolution1 / 2). torch's AVX2 / AVX-512
// kernels fuse exactly these products into FMAs; the remaining operations round separately.
float cubic_near(float x) {  // |x| <= 1: ((A + 2) * x - (A + 3)) * x * x + 1
  constexpr float A = -0.75f;
  return (std::fma(A + 2, x, -(A + 3)) * x) * x + 1;
}
float cubic_far(float x) {  // 1 <= |x| <= 2: ((A * x - 5 * A) * x + 8 * A) * x - 4 * A
  constexpr float A = -0.75f;
  return std::fma(std::fma(A, x, -(5 * A)), x, 8 * A) * x - 4 * A;
}

// The four source indices and weights of each output position along one axis
// (HelperInterpCubic::compute_indices_weights with align_corners = false and no explicit scale).
struct CubicTaps {
  std::vector<int64_t> idx;  // [out][4]
  std::vector<float> w;      // [out][4]
};

CubicTaps cubic_taps(int64_t in, int64_t out) {
  CubicTaps t;
  t.idx.resize(size_t(out) * 4);
  t.w.resize(size_t(out) * 4);
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  for (int64_t i = 0; i < out; ++i) {
    const float real = std::fma(scale, static_cast<float>(i) + 0.5f, -0.5f);
    const int64_t base = std::min(static_cast<int64_t>(std::floor(real)), in - 1);
    const float lambda = std::min(std::max(real - static_cast<float>(base), 0.0f), 1.0f);
    const float w[4] = {cubic_far(lambda + 1.0f), cubic_near(lambda), cubic_near(1.0f - lambda),
                        cubic_far((1.0f - lambda) + 1.0f)};
    for (int j = 0; j < 4; ++j) {
      t.idx[size_t(i) * 4 + j] = std::max(std::min(base + j - 1, in - 1), int64_t(0));
      t.w[size_t(i) * 4 + j] = w[j];
    }
  }
  return t;
}

// Four taps summed as torch's compiled loop does: output = t0 * w0; output += t_j * w_j (j = 1..3),
// which the compiler turns into fma(t3, w3, fma(t2, w2, fma(t0, w0, t1 * w1))).
inline float sum4(const float t[4], const float* w) {
  return std::fma(t[3], w[3], std::fma(t[2], w[2], std::fma(t[0], w[0], t[1] * w[1])));
}

// ---- Lanczos (Pillow) --------------------------------------------------------------------------------

constexpr int kPrecisionBits = 32 - 8 - 2;

double sinc(double x) {
  if (x == 0.0) return 1.0;
  x = x * std::numbers::pi;
  return std::sin(x) / x;
}

double lanczos3(double x) { return (-3.0 <= x && x < 3.0) ? sinc(x) * sinc(x / 3) : 0.0; }

// precompute_coeffs + normalize_coeffs_8bpc for the box (0, in) -> out.
struct LanczosCoeffs {
  int ksize = 0;
  std::vector<int> bounds;  // [out][2]: first input index, number of taps
  std::vector<int32_t> k;   // [out][ksize], fixed point with kPrecisionBits fraction bits
};

LanczosCoeffs lanczos_coeffs(int in, int out) {
  const double scale = static_cast<double>(in) / out;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = 3.0 * filterscale;
  LanczosCoeffs c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.bounds.resize(size_t(out) * 2);
  c.k.assign(size_t(out) * c.ksize, 0);
  std::vector<double> kk(c.ksize);
  for (int xx = 0; xx < out; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    const int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    const int xmax = std::min(static_cast<int>(center + support + 0.5), in) - xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      kk[x] = lanczos3((x + xmin - center + 0.5) * ss);
      ww += kk[x];
    }
    for (int x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? kk[x] / ww : kk[x];
      c.k[size_t(xx) * c.ksize + x] =
          static_cast<int32_t>(v < 0 ? -0.5 + v * (1 << kPrecisionBits) : 0.5 + v * (1 << kPrecisionBits));
    }
    c.bounds[size_t(xx) * 2] = xmin;
    c.bounds[size_t(xx) * 2 + 1] = xmax;
  }
  return c;
}

inline uint8_t clip8(int64_t ss) { return static_cast<uint8_t>(std::clamp<int64_t>(ss >> kPrecisionBits, 0, 255)); }

// Rows [row0, row0 + rows) of `in` (width `in_w`) resampled horizontally to `c`'s output width.
std::vector<uint8_t> lanczos_horizontal(const uint8_t* in, int in_w, int row0, int rows, const LanczosCoeffs& c,
                                        int out_w) {
  std::vector<uint8_t> out(size_t(rows) * out_w * 3);
  parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* src = in + (size_t(row0) + r) * in_w * 3;
      uint8_t* dst = out.data() + size_t(r) * out_w * 3;
      for (int xx = 0; xx < out_w; ++xx) {
        const int xmin = c.bounds[size_t(xx) * 2], xmax = c.bounds[size_t(xx) * 2 + 1];
        const int32_t* k = &c.k[size_t(xx) * c.ksize];
        int64_t ss[3] = {1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1)};
        for (int x = 0; x < xmax; ++x)
          for (int ch = 0; ch < 3; ++ch) ss[ch] += int64_t(src[(size_t(x) + xmin) * 3 + ch]) * k[x];
        for (int ch = 0; ch < 3; ++ch) dst[size_t(xx) * 3 + ch] = clip8(ss[ch]);
      }
    }
  });
  return out;
}

// `in` (width w, rows indexed from row0) resampled vertically to `c`'s output height.
std::vector<uint8_t> lanczos_vertical(const uint8_t* in, int w, int row0, const LanczosCoeffs& c, int out_h) {
  std::vector<uint8_t> out(size_t(out_h) * w * 3);
  parallel_for(out_h, 8, [&](int64_t y0, int64_t y1) {
    for (int64_t yy = y0; yy < y1; ++yy) {
      const int ymin = c.bounds[size_t(yy) * 2] - row0, ymax = c.bounds[size_t(yy) * 2 + 1];
      const int32_t* k = &c.k[size_t(yy) * c.ksize];
      uint8_t* dst = out.data() + size_t(yy) * w * 3;
      for (size_t i = 0; i < size_t(w) * 3; ++i) {
        int64_t ss = 1 << (kPrecisionBits - 1);
        for (int y = 0; y < ymax; ++y) ss += int64_t(in[(size_t(y) + ymin) * w * 3 + i]) * k[y];
        dst[i] = clip8(ss);
      }
    }
  });
  return out;
}

}  // namespace

void check_rgb8_image(int width, int height, size_t bytes) {
  WAN_CHECK(width >= 1 && height >= 1 && width <= kMaxSide && height <= kMaxSide, "image of ", width, "x", height,
            " pixels: each side must be 1..", kMaxSide);
  WAN_CHECK(bytes == size_t(width) * size_t(height) * 3, "image of ", width, "x", height, " pixels has ", bytes,
            " bytes of RGB, not ", size_t(width) * size_t(height) * 3);
}

Tensor rgb8_to_tensor(const uint8_t* rgb, int width, int height) {
  check_rgb8_image(width, height, size_t(width) * size_t(height) * 3);
  Tensor t = Tensor::empty(DType::F32, {3, height, width});
  float* out = t.f32();
  const size_t hw = size_t(width) * size_t(height);
  for (size_t i = 0; i < hw; ++i)
    for (int c = 0; c < 3; ++c) out[c * hw + i] = (static_cast<float>(rgb[i * 3 + c]) / 255.0f - 0.5f) / 0.5f;
  return t;
}

Tensor resize_bicubic(const Tensor& x, int64_t H, int64_t W) {
  WAN_CHECK(x.dtype() == DType::F32, "resize_bicubic: input must be float32, not ", dtype_name(x.dtype()));
  WAN_CHECK(x.ndim() >= 2 && x.view().is_contiguous(), "resize_bicubic: input must be a contiguous [..., h, w] "
            "tensor, not ", x.shape().str());
  const int64_t h = x.dim(-2), w = x.dim(-1);
  WAN_CHECK(h >= 1 && w >= 1 && h <= kMaxSide && w <= kMaxSide, "resize_bicubic: input size ", h, "x", w,
            " (each side must be 1..", kMaxSide, ")");
  WAN_CHECK(H >= 1 && W >= 1 && H <= kMaxSide && W <= kMaxSide, "resize_bicubic: output size ", H, "x", W,
            " (each side must be 1..", kMaxSide, ")");
  Shape os = x.shape();
  os[-2] = H;
  os[-1] = W;
  const int64_t planes = x.numel() / (h * w);
  WAN_CHECK(planes <= (int64_t(1) << 40) / (H * W), "resize_bicubic: output ", os.str(), " is too large");
  Tensor out = Tensor::empty(DType::F32, os);
  const CubicTaps th = cubic_taps(h, H), tw = cubic_taps(w, W);
  const float* src = x.f32();
  float* dst = out.f32();
  parallel_for(planes * H, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t p = r / H, oh = r % H;
      const float* plane = src + p * h * w;
      const int64_t* iy = &th.idx[size_t(oh) * 4];
      for (int64_t ow = 0; ow < W; ++ow) {
        const int64_t* ix = &tw.idx[size_t(ow) * 4];
        const float* wx = &tw.w[size_t(ow) * 4];
        float rows[4];
        for (int j = 0; j < 4; ++j) {
          const float* row = plane + iy[j] * w;
          const float t[4] = {row[ix[0]], row[ix[1]], row[ix[2]], row[ix[3]]};
          rows[j] = sum4(t, wx);
        }
        dst[r * W + ow] = sum4(rows, &th.w[size_t(oh) * 4]);
      }
    }
  });
  return out;
}

std::vector<uint8_t> resize_lanczos_rgb8(const uint8_t* rgb, int width, int height, int W, int H) {
  check_rgb8_image(width, height, size_t(width) * size_t(height) * 3);
  WAN_CHECK(W >= 1 && H >= 1 && W <= kMaxSide && H <= kMaxSide, "resize_lanczos: output size ", W, "x", H,
            " (each side must be 1..", kMaxSide, ")");
  const bool need_h = W != width, need_v = H != height;
  if (!need_h && !need_v) return std::vector<uint8_t>(rgb, rgb + size_t(width) * height * 3);
  const LanczosCoeffs cv = lanczos_coeffs(height, H);
  if (H < height && (W >= width || height - H > 2 * (width - W))) {  // Pillow 13: vertical pass first
    const std::vector<uint8_t> tmp = lanczos_vertical(rgb, width, 0, cv, H);
    return need_h ? lanczos_horizontal(tmp.data(), width, 0, H, lanczos_coeffs(width, W), W) : tmp;
  }
  // Horizontal first, on the rows the vertical pass reads (ImagingResampleInner's ybox); every row
  // when there is no vertical pass.
  const int first = need_v ? cv.bounds[0] : 0;
  const int last = need_v ? cv.bounds[size_t(H) * 2 - 2] + cv.bounds[size_t(H) * 2 - 1] : height;
  const std::vector<uint8_t> tmp = lanczos_horizontal(rgb, width, first, last - first, lanczos_coeffs(width, W), W);
  return need_v ? lanczos_vertical(tmp.data(), W, first, cv, H) : tmp;
}

std::vector<uint8_t> crop_rgb8(const uint8_t* rgb, int width, int height, int x, int y, int w, int h) {
  check_rgb8_image(width, height, size_t(width) * size_t(height) * 3);
  WAN_CHECK(w >= 1 && h >= 1 && x >= 0 && y >= 0 && int64_t(x) + w <= width && int64_t(y) + h <= height,
            "crop: window ", w, "x", h, " at (", x, ", ", y, ") is not inside the ", width, "x", height, " image");
  std::vector<uint8_t> out(size_t(w) * h * 3);
  for (int r = 0; r < h; ++r)
    std::memcpy(&out[size_t(r) * w * 3], rgb + ((size_t(y) + r) * width + x) * 3, size_t(w) * 3);
  return out;
}

}  // namespace wan
