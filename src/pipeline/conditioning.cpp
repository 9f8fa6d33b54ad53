// See conditioning.h. The sizing formulas are the official ones in float64, with Python's floor
// division and round-half-to-even where the official code uses them.
#include "pipeline/conditioning.h"

#include <cfenv>
#include <cmath>
#include <cstring>
#include <tuple>

#include "core/error.h"
#include "ops/image_ops.h"
#include "pipeline/pipeline.h"

namespace wan {

std::pair<int, int> i2v_video_size(int iw, int ih, int64_t max_area) {
  WAN_CHECK(iw > 0 && ih > 0 && max_area > 0, "image of ", iw, "x", ih, " pixels");
  // image2video.py: aspect_ratio = h / w; np.sqrt(max_area * aspect_ratio) // 8 // 2 * 2.
  const double aspect = static_cast<double>(ih) / static_cast<double>(iw);
  const double area = static_cast<double>(max_area);
  const double lat_h = std::floor(std::floor(std::sqrt(area * aspect) / 8.0) / 2.0) * 2.0;
  const double lat_w = std::floor(std::floor(std::sqrt(area / aspect) / 8.0) / 2.0) * 2.0;
  WAN_CHECK(lat_h >= 2 && lat_w >= 2 && lat_h * 8 <= 1e6 && lat_w * 8 <= 1e6, "an image of ", iw, "x", ih,
            " gives a ", static_cast<int64_t>(lat_w * 8), "x", static_cast<int64_t>(lat_h * 8),
            " video at an area of ", max_area, " pixels: its aspect ratio is too extreme (give --size WxH)");
  return {static_cast<int>(lat_w * 8), static_cast<int>(lat_h * 8)};
}

std::pair<int, int> ti2v_video_size(int iw, int ih, int64_t max_area) {
  WAN_CHECK(iw > 0 && ih > 0 && max_area > 0, "image of ", iw, "x", ih, " pixels");
  constexpr double d = 32;
  const double area = static_cast<double>(max_area);
  const double ratio = static_cast<double>(iw) / static_cast<double>(ih);
  const double ow = std::sqrt(area * ratio), oh = area / ow;
  // Width first, then height first (int() of non-negative floats truncates = floors).
  const double ow1 = std::floor(ow / d) * d;
  const double oh1 = ow1 > 0 ? std::floor(area / ow1 / d) * d : 0;
  const double oh2 = std::floor(oh / d) * d;
  const double ow2 = oh2 > 0 ? std::floor(area / oh2 / d) * d : 0;
  const bool ok1 = ow1 > 0 && oh1 > 0, ok2 = ow2 > 0 && oh2 > 0;
  WAN_CHECK(ok1 || ok2, "an image of ", iw, "x", ih, " has no 32-multiple video size within ", max_area,
            " pixels: its aspect ratio is too extreme (or --size too small)");
  auto off = [&](double r) { return std::max(ratio / r, r / ratio); };
  // The official code divides by zero (and fails) when a candidate is empty; the other one is taken.
  const bool first = ok1 && (!ok2 || off(ow1 / oh1) < off(ow2 / oh2));
  return first ? std::pair<int, int>{static_cast<int>(ow1), static_cast<int>(oh1)}
               : std::pair<int, int>{static_cast<int>(ow2), static_cast<int>(oh2)};
}

Tensor i2v_image(const RgbImage& img, int W, int H) {
  return resize_bicubic(image_to_tensor(img), H, W);
}

Tensor ti2v_image(const RgbImage& img, int W, int H) {
  const double scale = std::max(static_cast<double>(W) / img.width, static_cast<double>(H) / img.height);
  // Python's round(): half to even, which nearbyint gives in the default rounding mode.
  WAN_ASSERT(std::fegetround() == FE_TONEAREST, "rounding mode");
  const int rw = static_cast<int>(std::nearbyint(img.width * scale));
  const int rh = static_cast<int>(std::nearbyint(img.height * scale));
  WAN_CHECK(rw >= W && rh >= H, "resizing a ", img.width, "x", img.height, " image to cover ", W, "x", H, " gave ", rw,
            "x", rh);
  const RgbImage resized = resize_lanczos(img, rw, rh);
  return image_to_tensor(crop(resized, (rw - W) / 2, (rh - H) / 2, W, H));
}

Tensor i2v_pixel_video(const Tensor& first, const Tensor& last, int frames) {
  WAN_ASSERT(first.ndim() == 3 && first.dim(0) == 3 && frames >= 1, "i2v_pixel_video: image ", first.shape().str());
  const int64_t H = first.dim(1), W = first.dim(2), hw = H * W;
  Tensor v = Tensor::f32(Shape{3, frames, H, W});  // zero-filled
  auto put = [&](const Tensor& img, int f) {
    WAN_ASSERT(img.shape() == first.shape(), "i2v_pixel_video: images ", img.shape().str(), " vs ", first.shape().str());
    for (int64_t c = 0; c < 3; ++c)
      std::memcpy(v.f32() + (c * frames + f) * hw, img.f32() + c * hw, static_cast<size_t>(hw) * 4);
  };
  put(first, 0);
  if (last.defined()) {
    WAN_CHECK(frames >= 2, "--last-image needs at least 5 frames");
    put(last, frames - 1);
  }
  return v;
}

Tensor i2v_mask(int frames, int64_t h, int64_t w, bool last) {
  WAN_ASSERT(frames >= 1 && (frames - 1) % 4 == 0, "i2v_mask: ", frames, " frames");
  const int T = (frames - 1) / 4 + 1;
  auto pixel = [&](int f) { return f == 0 || (last && f == frames - 1) ? 1.0f : 0.0f; };
  // Expanded frame k (F + 3 of them): frame 0 four times, then frames 1..F-1; latent t, channel c is k = 4t + c.
  auto expanded = [&](int k) { return pixel(k < 4 ? 0 : k - 3); };
  Tensor m = Tensor::empty(DType::F32, Shape{4, T, h, w});
  for (int c = 0; c < 4; ++c)
    for (int t = 0; t < T; ++t) {
      float* dst = m.f32() + (static_cast<int64_t>(c) * T + t) * h * w;
      std::fill(dst, dst + h * w, expanded(4 * t + c));
    }
  return m;
}

LatentCondition build_condition(Task task, const Tensor& first, const Tensor& last, int frames,
                                const std::function<Tensor(const Tensor&)>& encode) {
  LatentCondition c;
  WAN_ASSERT(first.defined(), "build_condition without an image");
  if (task == Task::TI2V_5B) {
    const Tensor one = first.reshape(Shape{3, 1, first.dim(1), first.dim(2)});
    c.first_frame = encode(one);
    return c;
  }
  WAN_ASSERT(task == Task::I2V_A14B, "build_condition for ", task_name(task));
  const Tensor lat = encode(i2v_pixel_video(first, last, frames));  // [z, T, h, w]
  const Tensor mask = i2v_mask(frames, lat.dim(2), lat.dim(3), last.defined());
  WAN_ASSERT(mask.dim(1) == lat.dim(1), "mask frames ", mask.dim(1), " vs latent ", lat.dim(1));
  c.y = Tensor::empty(DType::F32, Shape{4 + lat.dim(0), lat.dim(1), lat.dim(2), lat.dim(3)});
  std::memcpy(c.y.f32(), mask.f32(), mask.nbytes());
  std::memcpy(c.y.f32() + mask.numel(), lat.f32(), lat.nbytes());
  return c;
}

SourceImages plan_images(const GenerateOptions& o, GeneratePlan& p) {
  SourceImages s;
  const bool i2v = p.task == Task::I2V_A14B, ti2v = p.task == Task::TI2V_5B;
  WAN_CHECK_OPTION("image", !o.image_file.empty() || !i2v, "missing {} FILE: ", task_name(p.task),
                   " animates an image (the first frame)");
  WAN_CHECK_OPTION("image", o.image_file.empty() || i2v || ti2v, "{}: ", task_name(p.task),
                   " takes no image (image-to-video is i2v-A14B or ti2v-5B)");
  WAN_CHECK_OPTION("last-image", o.last_image_file.empty() || i2v, "{}: only i2v-A14B takes a last frame");
  WAN_CHECK_OPTION("last-image", o.last_image_file.empty() || !o.image_file.empty(), "{} needs --image (the first frame)");
  if (o.image_file.empty()) return s;
  WAN_WITH_CONTEXT("--image", s.first = read_image(o.image_file));
  if (!o.last_image_file.empty()) WAN_WITH_CONTEXT("--last-image", s.last = read_image(o.last_image_file));
  p.image_file = o.image_file;
  p.last_image_file = o.last_image_file;
  const bool size_given = (o.width && o.height) || p.init_latents.defined();
  const auto [iw, ih] = std::pair<int, int>{s.first.width, s.first.height};
  if (i2v && !size_given) {
    const int64_t area = static_cast<int64_t>(p.width) * p.height;
    std::tie(p.width, p.height) = i2v_video_size(iw, ih, area);
    p.image_sizing = cat("bicubic resize of the ", iw, "x", ih, " image to the ", area, "-pixel size of its aspect ratio");
  } else if (i2v) {
    p.image_sizing = cat("bicubic resize of the ", iw, "x", ih, " image to the given size");
  } else if (ti2v) {
    const int64_t area = static_cast<int64_t>(p.width) * p.height;
    std::pair<int, int> wh;
    WAN_WITH_CONTEXT("--image", wh = ti2v_video_size(iw, ih, area));
    // --init-latents fix the size: the image's best size must agree (checked with the latents' shape).
    if (!p.init_latents.defined() || (o.width && o.height)) std::tie(p.width, p.height) = wh;
    p.image_sizing = cat("LANCZOS resize of the ", iw, "x", ih, " image to cover the best 32-multiple size of ", area,
                         " pixels, centre crop");
  }
  return s;
}

void size_images(const SourceImages& s, GeneratePlan& p) {
  if (s.first.width == 0) return;
  if (p.task == Task::TI2V_5B) {
    p.image = ti2v_image(s.first, p.width, p.height);
    return;
  }
  p.image = i2v_image(s.first, p.width, p.height);
  if (s.last.width > 0) p.last_image = i2v_image(s.last, p.width, p.height);
}

}  // namespace wan
