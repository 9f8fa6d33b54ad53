// Image preprocessing of the image-to-video tasks, exactly as the reference does it on the CPU:
//  - normalisation: TF.to_tensor(img).sub_(0.5).div_(0.5)                        (image_to_tensor)
//  - I2V:  F.interpolate(img[None], size=(H, W), mode="bicubic")  on float32     (resize_bicubic)
//  - TI2V: img.resize((W, H), Image.LANCZOS), then img.crop(...)  on 8-bit RGB   (resize_lanczos, crop)
// Invariants: results are bit-identical to the reference (see each function), independent of the thread
// count; every size is validated first (bad input is a wan::Error, never an out-of-bounds access).
// The 8-bit functions take raw HWC RGB (row-major, 3 bytes a pixel); the templates below accept any
// image type with `width`, `height` and a `rgb` byte vector, such as formats/image.h's RgbImage (ops may
// not include formats, so the type is not named here).
#pragma once
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace wan {

// [3, H, W] float32 from 8-bit RGB: x = float(k) / 255.0f, then (x - 0.5f) / 0.5f, each step rounded to
// float32 as torch does it (TF.to_tensor's div(255), then sub_(0.5), div_(0.5)).
Tensor rgb8_to_tensor(const uint8_t* rgb, int width, int height);

// torch.nn.functional.interpolate(x, size=(H, W), mode="bicubic", align_corners=False) of the last two
// dims of a float32 tensor [..., h, w] (e.g. [3, h, w] or [1, 3, h, w]); out [..., H, W].
// PyTorch's CPU kernel (UpSampleKernel.cpp, upsample_bicubic2d, non-separable): scale = float(in) / out,
// source coordinate (dst + 0.5) * scale - 0.5, index floor clamped to in - 1, t clamped to [0, 1], Keys
// cubic with A = -0.75, taps clamped to the border, no antialias and no clamp of values. Its float32
// arithmetic is reproduced with the fused multiply-adds that torch's AVX2 / AVX-512 kernels (the ones
// every x86-64 machine with AVX2 runs) contain, so the result is bit-identical to them; torch's
// non-FMA "DEFAULT" kernel differs from both by up to ~1e-5 relative.
Tensor resize_bicubic(const Tensor& x, int64_t H, int64_t W);

// PIL.Image.resize((W, H), Image.LANCZOS) of 8-bit RGB, bit-exact (Pillow's Resample.c): Lanczos-3 with
// support 3 * max(in / out, 1), coefficients normalised to sum 1 in double, then fixed point with 22
// fraction bits (round half away from zero), one pass per axis with 0.5 rounding start and a clip to
// 0..255 after each. A pass whose size does not change is skipped (the same size both ways is a copy).
// Pass order as Pillow 13.0 does it: vertical first when the height shrinks and the width either does
// not shrink or shrinks by less than half as many pixels (h - H > 2 * (w - W)), otherwise horizontal
// first. The order changes the result; this rule was measured against Pillow 13.0.0 on ~800 random size
// pairs up to 300 pixels, boundaries included (Pillow 12 and older always go horizontal first).
std::vector<uint8_t> resize_lanczos_rgb8(const uint8_t* rgb, int width, int height, int W, int H);

// The w x h window at (x, y); it must lie inside the image (PIL's crop would pad with zeros instead).
std::vector<uint8_t> crop_rgb8(const uint8_t* rgb, int width, int height, int x, int y, int w, int h);

template <typename Image>
concept Rgb8Image = requires(const Image& im) {
  { im.width } -> std::convertible_to<int>;
  { im.height } -> std::convertible_to<int>;
  { im.rgb.data() } -> std::convertible_to<const uint8_t*>;
};

// The same on an image object (the size of `rgb` is checked against width * height * 3).
void check_rgb8_image(int width, int height, size_t bytes);

template <Rgb8Image Image>
Tensor image_to_tensor(const Image& im) {
  check_rgb8_image(im.width, im.height, im.rgb.size());
  return rgb8_to_tensor(im.rgb.data(), im.width, im.height);
}

template <Rgb8Image Image>
Image resize_lanczos(const Image& im, int W, int H) {
  check_rgb8_image(im.width, im.height, im.rgb.size());
  Image out{};
  out.rgb = resize_lanczos_rgb8(im.rgb.data(), im.width, im.height, W, H);
  out.width = W;
  out.height = H;
  return out;
}

template <Rgb8Image Image>
Image crop(const Image& im, int x, int y, int w, int h) {
  check_rgb8_image(im.width, im.height, im.rgb.size());
  Image out{};
  out.rgb = crop_rgb8(im.rgb.data(), im.width, im.height, x, y, w, h);
  out.width = w;
  out.height = h;
  return out;
}

}  // namespace wan
