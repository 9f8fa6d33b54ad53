// Video output front door: the exact uint8 quantisation of the official save_video, format selection by
// extension, argument checks (the target through formats/output_file.h before anything is encoded), and
// the PNG sequence's names and its pattern's existing frames.
// Invariant: quantize_unit_to_u8 does the float32 steps of torch in the same order (clamp, + 1, / 2,
// * 255, truncate) with no contraction (the build uses -ffp-contract=off), so its bytes equal torch's.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/output_file.h"
#include "formats/video.h"
#include "formats/video_internal.h"

namespace fs = std::filesystem;

namespace wan {

uint8_t quantize_unit_to_u8(float x) {
  if (std::isnan(x)) return 0;  // torch's NaN -> uint8 cast is undefined; pick black, deterministically
  // torch.clamp then make_grid's normalize: clamp_(low, high), sub_(low), div_(high - low); then * 255.
  const float c = std::min(std::max(x, -1.0f), 1.0f);
  const float unit = (c - (-1.0f)) / 2.0f;
  const float scaled = unit * 255.0f;
  return static_cast<uint8_t>(scaled);  // in [0, 255] by the clamp; truncation like .type(torch.uint8)
}

namespace {

void check_dims(const std::string& path, int frames, int height, int width, int fps) {
  WAN_CHECK(frames > 0, "cannot write video '", path, "': no frames (frames = ", frames, ")");
  WAN_CHECK(height > 0 && width > 0 && height <= 32768 && width <= 32768, "cannot write video '", path,
            "': bad frame size ", width, "x", height, " (each side must be 1..32768)");
  WAN_CHECK(fps > 0 && fps <= 1000, "cannot write video '", path, "': bad fps ", fps, " (must be 1..1000)");
  // [3, F, H, W] must be addressable; 32768^2 * 3 already fits, so only F can overflow.
  const uint64_t frame_px = uint64_t(height) * uint64_t(width);
  WAN_CHECK(uint64_t(frames) <= (uint64_t(1) << 62) / (3 * frame_px), "cannot write video '", path,
            "': too many frames (", frames, ")");
}

std::string lower_ext(const std::string& path) {
  std::string e = fs::path(path).extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  return e;
}

}  // namespace

namespace video_detail {

void check_video_write(const std::string& path, const VideoDims& d, const VideoWriteOptions& opt) {
  const VideoFormat fmt = video_format_from_path(path);
  check_dims(path, d.frames, d.height, d.width, d.fps);
  if (fmt == VideoFormat::Mp4) {
    WAN_CHECK(video_have_ffmpeg() && !opt.disable_ffmpeg, "cannot write video '", path,
              "': this build has no FFmpeg (libavcodec) support, so .mp4 is unavailable; write .y4m or .png "
              "instead, or rebuild with the libavcodec/libavformat/libswscale development packages");
    WAN_CHECK(d.height % 2 == 0 && d.width % 2 == 0, "cannot write video '", path, "': H.264 yuv420p needs "
              "an even width and height, got ", d.width, "x", d.height);
  }
  (void)resolve_output_target(path, video_detail::video_who(path));  // before anything is encoded
}

void write_frames(const std::string& path, const VideoDims& d, const FrameSource& src, const VideoWriteOptions& opt) {
  check_video_write(path, d, opt);
  switch (video_format_from_path(path)) {
    case VideoFormat::Mp4: video_detail::write_mp4(path, d, src); break;
    case VideoFormat::Y4m: video_detail::write_y4m(path, d, src); break;
    case VideoFormat::Png: video_detail::write_png_sequence(path, d, src, opt.overwrite_frames); break;
  }
}

}  // namespace video_detail

VideoFormat video_format_from_path(const std::string& path) {
  const std::string e = lower_ext(path);
  if (e == ".mp4") return VideoFormat::Mp4;
  if (e == ".y4m") return VideoFormat::Y4m;
  if (e == ".png") return VideoFormat::Png;
  WAN_THROW("cannot write video '", path, "': unknown extension '", fs::path(path).extension().string(),
            "' (accepted: .mp4, .y4m, .png)");
}

bool video_have_ffmpeg() {
#if defined(WAN_HAVE_FFMPEG) && WAN_HAVE_FFMPEG
  return true;
#else
  return false;
#endif
}

std::vector<uint8_t> video_to_rgb8(const float* video, int frames, int height, int width) {
  WAN_CHECK(video != nullptr, "video_to_rgb8: null video");
  WAN_CHECK(frames > 0 && height > 0 && width > 0, "video_to_rgb8: bad shape [3, ", frames, ", ", height, ", ",
            width, "]");
  const size_t plane = size_t(height) * size_t(width);
  const size_t channel = size_t(frames) * plane;
  std::vector<uint8_t> out(channel * 3);
  parallel_for(int64_t(frames) * height, 16, [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      const size_t off = size_t(row) * size_t(width);  // row `row` of the [F*H, W] view of one channel
      uint8_t* o = out.data() + off * 3;
      for (int x = 0; x < width; ++x)
        for (int ch = 0; ch < 3; ++ch) o[size_t(x) * 3 + ch] = quantize_unit_to_u8(video[ch * channel + off + x]);
    }
  });
  return out;
}

void write_video(const std::string& path, const float* video, int frames, int height, int width, int fps,
                 const VideoWriteOptions& opt) {
  WAN_CHECK(video != nullptr, "cannot write video '", path, "': null video");
  const size_t plane = size_t(std::max(height, 0)) * size_t(std::max(width, 0));
  const size_t channel = size_t(std::max(frames, 0)) * plane;
  // Quantise one frame at a time so a long video never needs a second full-size copy.
  const video_detail::FrameSource src = [=](int f, uint8_t* rgb) {
    const float* base = video + size_t(f) * plane;
    for (size_t i = 0; i < plane; ++i)
      for (int ch = 0; ch < 3; ++ch) rgb[i * 3 + ch] = quantize_unit_to_u8(base[ch * channel + i]);
  };
  video_detail::write_frames(path, {frames, height, width, fps}, src, opt);
}

void write_video_rgb8(const std::string& path, const uint8_t* rgb, int frames, int height, int width, int fps,
                      const VideoWriteOptions& opt) {
  WAN_CHECK(rgb != nullptr, "cannot write video '", path, "': null video");
  const size_t frame_bytes = size_t(std::max(height, 0)) * size_t(std::max(width, 0)) * 3;
  const video_detail::FrameSource src = [=](int f, uint8_t* out) {
    std::memcpy(out, rgb + size_t(f) * frame_bytes, frame_bytes);
  };
  video_detail::write_frames(path, {frames, height, width, fps}, src, opt);
}

std::vector<std::string> png_sequence_paths(const std::string& path, int frames) {
  if (frames == 1) return {path};
  const fs::path p(path);
  const std::string stem = (p.parent_path() / p.stem()).string();
  const std::string ext = p.extension().string();
  int digits = 5;
  for (int64_t cap = 100000; cap < frames; cap *= 10) ++digits;
  std::vector<std::string> out;
  out.reserve(size_t(std::max(frames, 0)));
  for (int f = 0; f < frames; ++f) {
    std::string num = std::to_string(f);
    out.push_back(stem + "_" + std::string(size_t(digits) - num.size(), '0') + num + ext);
  }
  return out;
}

std::vector<std::string> existing_png_frames(const std::string& path) {
  const fs::path p(path);
  const std::string prefix = p.stem().string() + "_", ext = lower_ext(path);
  const fs::path dir = p.parent_path();
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir.empty() ? fs::path(".") : dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() < prefix.size() + 5 + ext.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string tail = lower_ext(name);
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - tail.size());
    if (tail != ext || digits.size() < 5) continue;
    if (std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      out.push_back((dir / name).string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace video_detail {

std::string video_who(const std::string& path) { return cat("cannot write video '", path, "'"); }

}  // namespace video_detail
}  // namespace wan
