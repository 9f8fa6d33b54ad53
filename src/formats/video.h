// Video output: the decoded video (float [3, F, H, W] in [-1, 1]) to MP4 (H.264), .y4m or PNG.
// The format follows the output's extension (.mp4 .y4m .png, case-insensitive); anything else is an error.
//
// Invariants: nothing partial is left behind on failure. Each file goes through formats/output_file.h (a
// unique temporary file next to the target, renamed over it only once complete; permissions kept,
// symlinks written through); a PNG sequence writes every frame before it renames any, and on error
// removes the frames this call already renamed. The bytes of every format are a function of the frames
// and the fps alone (MP4: see mp4.cpp). Errors are wan::Error with one line naming the output path.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace wan {

// Quantisation (WAN22.md §7.5.4, the official save_video): clamp to [-1, 1], (x + 1) / 2, * 255, cast to
// uint8 by truncation, every step in float32 exactly as torch does it. NaN (undefined in torch) becomes 0.
//
// Formats:
//  - .mp4: H.264 yuv420p through libavcodec (libx264 with crf 10 and preset medium: exactly what imageio's
//    quality=8 asks ffmpeg for, int((1 - 8/10) * 51) = 10), constant frame rate = fps, moov atom at the
//    front (faststart). RGB -> YUV by swscale's defaults with bicubic scaling (ffmpeg's CLI default, so
//    the same as imageio): BT.601 matrix, limited (TV) range, and the stream is tagged so (matrix
//    smpte170m, range tv; primaries and transfer bt709, those of the RGB the model produces). Width and
//    height must be even. Needs a build with FFmpeg (WAN_HAVE_FFMPEG); without it a clear error.
//  - .y4m: "YUV4MPEG2 W H F<fps>:1 Ip A1:1 C444 XCOLORRANGE=FULL", planar Y, Cb, Cr per frame after a
//    "FRAME" line. 4:4:4 full range (JPEG/JFIF BT.601 coefficients, see rgb_to_ycbcr_full) keeps the most
//    of the 8-bit RGB: the round trip back to RGB is within 1-2 levels. ffmpeg reads it as yuv444p, color_range pc.
//  - .png: one 8-bit RGB PNG per frame. One frame: exactly the given path. F > 1 frames:
//    "dir/name.png" -> "dir/name_00000.png", "dir/name_00001.png", ... (5 digits, zero-based; more digits
//    when F > 100000). A folder that already holds frames of the pattern ("name_<5+ digits>.png") is
//    refused unless overwrite_frames, which then also removes those this write did not replace, so no
//    stale frame of a longer earlier sequence stays. No external library: own deflate (LZ77 + fixed
//    Huffman), CRC-32 and Adler-32.

enum class VideoFormat { Mp4, Y4m, Png };

// Format from the path's extension; a clear error listing the accepted extensions otherwise.
VideoFormat video_format_from_path(const std::string& path);

// True when this build can write .mp4 (compiled with WAN_HAVE_FFMPEG).
bool video_have_ffmpeg();

// The exact quantisation above: [3, F, H, W] float -> [F, H, W, 3] uint8 (RGB interleaved).
std::vector<uint8_t> video_to_rgb8(const float* video, int frames, int height, int width);
// One value, the same arithmetic (for tests and for code that quantises elsewhere).
uint8_t quantize_unit_to_u8(float x);

struct VideoWriteOptions {
  // Acts as if the build had no FFmpeg, so the "no FFmpeg" branch is testable in any build.
  bool disable_ffmpeg = false;
  // PNG: replace the frames of the pattern already in the folder (see above) instead of refusing.
  bool overwrite_frames = false;
};

// Writes `video` ([3, F, H, W] in [-1, 1]) at `fps` frames per second in the format of `path`.
void write_video(const std::string& path, const float* video, int frames, int height, int width, int fps,
                 const VideoWriteOptions& opt = {});
// The same from already quantised frames ([F, H, W, 3] uint8 RGB).
void write_video_rgb8(const std::string& path, const uint8_t* rgb, int frames, int height, int width, int fps,
                      const VideoWriteOptions& opt = {});

// The files a PNG write produces for `frames` frames (the naming rule above).
std::vector<std::string> png_sequence_paths(const std::string& path, int frames);
// The entries of the PNG output `path`'s folder that are frames of its pattern ("name_<5 or more
// digits>.png", the extension matched without regard to case), sorted; empty when there are none.
std::vector<std::string> existing_png_frames(const std::string& path);

// Full-range (JFIF) BT.601 RGB -> YCbCr used by .y4m, integer and exact:
// Y = 0.299 R + 0.587 G + 0.114 B, Cb = 128 + (B - Y) / 1.772, Cr = 128 + (R - Y) / 1.402, each rounded
// to nearest (16-bit fixed point) and clamped to [0, 255].
void rgb_to_ycbcr_full(uint8_t r, uint8_t g, uint8_t b, uint8_t* y, uint8_t* cb, uint8_t* cr);

namespace video_detail {
// Checksums and the PNG encoder, public for tests.
uint32_t crc32(const uint8_t* data, size_t n, uint32_t crc = 0);
uint32_t adler32(const uint8_t* data, size_t n, uint32_t adler = 1);
// A zlib stream (RFC 1950) of `data`: deflate with LZ77 and fixed Huffman codes, or stored blocks.
std::vector<uint8_t> zlib_compress(const uint8_t* data, size_t n, bool stored_only = false);
// A complete PNG file of an 8-bit RGB image ([H, W, 3]).
std::vector<uint8_t> encode_png_rgb8(const uint8_t* rgb, int height, int width);
}  // namespace video_detail

}  // namespace wan
