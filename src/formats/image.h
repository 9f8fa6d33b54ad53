// Image input for the image-to-video tasks: one still image file -> 8-bit RGB, as the reference's
// `Image.open(path).convert("RGB")` (after `ImageOps.exif_transpose`) sees it.
// Invariants: every failure is one wan::Error line naming the (escaped) path and what is wrong; the
// size is checked against ImageLimits from the file's header before any pixel memory is allocated;
// malformed input never reads out of bounds, crashes or hangs. The result always has
// width * height * 3 bytes with width, height >= 1.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace wan {

// 8-bit RGB, row-major HWC: pixel (x, y) channel c at rgb[(y * width + x) * 3 + c].
struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

// Decompression-bomb guard: images over these are refused from their header, before decoding.
struct ImageLimits {
  int64_t max_side = 16384;          // pixels along either side
  int64_t max_pixels = 1LL << 27;    // width * height
  int64_t max_file_bytes = 1LL << 30;
};

struct ImageReadOptions {
  ImageLimits limits;
  // Turn the pixels as the EXIF orientation tag (1..8) says, as PIL's ImageOps.exif_transpose does
  // (JPEG APP1, PNG eXIf and WebP EXIF; IFD0's tag 0x0112). The official generate.py does not call
  // exif_transpose, so `false` reproduces it exactly on photos that carry the tag.
  bool exif_orientation = true;
  // Act as a build without FFmpeg, so that branch is testable in any build.
  bool disable_ffmpeg = false;
};

// Reads the first frame of the image file at `path`.
//  - Binary PPM / PGM (P6 / P5, maxval 1..65535) by a native reader, in every build. Samples scale as
//    Pillow's PPM reader does: min(255, round_half_even(v / maxval * 255)) in double (a plain copy at
//    maxval 255). Pillow reads a P5 with maxval > 255 as mode "I" and convert("RGB") then clips it at
//    255; here it scales like P6.
//  - Everything else libavformat's image demuxers and libavcodec decode (PNG, JPEG, WebP, GIF, BMP,
//    TIFF, ...), first frame, when the build has FFmpeg (WAN_HAVE_FFMPEG); without it a clear error.
//    Videos and other non-image containers are refused. Pixels go to RGB through swscale (accurate
//    rounding, bit-exact mode); YUV keeps the range it is tagged with (JPEG's yuvj* is full range) and
//    its matrix (BT.601 unless tagged otherwise). 8-bit YUV subsampled 2x either way (JPEG 4:2:0 / 4:2:2
//    / 4:4:0, lossy WebP) is first upsampled exactly as libjpeg's "fancy" upsampling does, which is
//    what Pillow's decode does; swscale then only applies the matrix. Alpha is dropped without
//    compositing (what convert("RGB") does), palettes are looked up, CMYK / YCCK JPEG is converted by
//    FFmpeg's decoder. Deeper than 8 bits per sample (16-bit PNG, ...): the high byte of each 16-bit
//    sample (v >> 8), which is what Pillow does for 16-bit RGB PNG ("RGB;16B"); Pillow clips 16-bit
//    grey at 255 instead, here it is v >> 8 as well.
//  - Lossless formats equal Pillow's decode exactly. JPEG and lossy WebP differ by a level or two
//    (FFmpeg's integer IDCT and swscale's matrix round differently from libjpeg-turbo / libwebp;
//    measured max 3, mean <= 0.08 per sample); CMYK JPEG by up to 2, mean 1.
//  - Truncated or corrupt data is an error (FFmpeg's decoders run with AV_EF_EXPLODE), not a picture
//    patched up with grey, matching Pillow's "image file is truncated".
RgbImage read_image(const std::string& path, const ImageReadOptions& opt = {});

// The same on an image already in memory; `name` stands for the path in messages.
RgbImage decode_image(const uint8_t* data, size_t size, const std::string& name, const ImageReadOptions& opt = {});

// True when this build decodes formats other than PPM / PGM (compiled with WAN_HAVE_FFMPEG).
bool image_have_ffmpeg();

}  // namespace wan
