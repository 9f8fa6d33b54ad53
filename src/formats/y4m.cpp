// YUV4MPEG2 (.y4m) output: an uncompressed stream any player or ffmpeg reads without a codec.
// Layout: "YUV4MPEG2 W<w> H<h> F<fps>:1 Ip A1:1 C444 XCOLORRANGE=FULL\n", then per frame "FRAME\n" and the
// Y, Cb, Cr planes (each H*W bytes, rows top to bottom). 4:4:4 full range keeps the 8-bit RGB nearly
// lossless; the conversion is the integer JFIF one of rgb_to_ycbcr_full (exact, so tests can re-derive it).
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "formats/output_file.h"
#include "formats/video.h"
#include "formats/video_internal.h"

namespace wan {

void rgb_to_ycbcr_full(uint8_t r, uint8_t g, uint8_t b, uint8_t* y, uint8_t* cb, uint8_t* cr) {
  // Coefficients * 65536, rounded so each row sums exactly to 65536 (Y) or 0 (Cb, Cr): grey maps to
  // (v, 128, 128) exactly. The bias is added before the shift so the shift never sees a negative value.
  const int32_t R = r, G = g, B = b;
  const int32_t yy = (19595 * R + 38470 * G + 7471 * B + 32768) >> 16;
  const int32_t u = ((128 << 16) + 32768 - 11058 * R - 21710 * G + 32768 * B) >> 16;
  const int32_t v = ((128 << 16) + 32768 + 32768 * R - 27439 * G - 5329 * B) >> 16;
  *y = uint8_t(std::clamp(yy, 0, 255));
  *cb = uint8_t(std::clamp(u, 0, 255));
  *cr = uint8_t(std::clamp(v, 0, 255));
}

namespace video_detail {

void write_y4m(const std::string& path, const VideoDims& d, const FrameSource& src) {
  OutputFile out(path, video_who(path));
  const size_t plane = size_t(d.height) * size_t(d.width);
  std::vector<uint8_t> rgb(plane * 3), frame(6 + plane * 3);
  std::memcpy(frame.data(), "FRAME\n", 6);
  uint8_t* yuv = frame.data() + 6;
  const std::string header = cat("YUV4MPEG2 W", d.width, " H", d.height, " F", d.fps,
                                 ":1 Ip A1:1 C444 XCOLORRANGE=FULL\n");
  out.write(header.data(), header.size());
  for (int fr = 0; fr < d.frames; ++fr) {
    src(fr, rgb.data());
    for (size_t i = 0; i < plane; ++i)
      rgb_to_ycbcr_full(rgb[3 * i], rgb[3 * i + 1], rgb[3 * i + 2], &yuv[i], &yuv[plane + i], &yuv[2 * plane + i]);
    out.write(frame.data(), frame.size());
  }
  out.commit();  // the destructor removes the temporary file on any error before this
}

}  // namespace video_detail
}  // namespace wan
