// Shared pieces of the video writers (not part of the public API): the frame source every writer pulls
// RGB frames from, and how their messages start. Files are created through formats/output_file.h, so a
// failed write leaves no file behind and an existing target is replaced only once the new one is complete.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "formats/video.h"

namespace wan::video_detail {

// Fills `rgb` ([H, W, 3] uint8) with frame `f`. Must be safe to call concurrently for different frames.
using FrameSource = std::function<void(int f, uint8_t* rgb)>;

struct VideoDims {
  int frames, height, width, fps;
};

// "cannot write video '<path>'": how every writer's messages start.
std::string video_who(const std::string& path);

// The argument and target checks every write does before it encodes anything (see video.h).
void check_video_write(const std::string& path, const VideoDims& d, const VideoWriteOptions& opt);
// Checks, then writes the frames `src` gives in the format of `path`.
void write_frames(const std::string& path, const VideoDims& d, const FrameSource& src, const VideoWriteOptions& opt);

void write_y4m(const std::string& path, const VideoDims& d, const FrameSource& src);
// overwrite_frames: see VideoWriteOptions.
void write_png_sequence(const std::string& path, const VideoDims& d, const FrameSource& src, bool overwrite_frames);
// Throws a clear error when the build has no FFmpeg.
void write_mp4(const std::string& path, const VideoDims& d, const FrameSource& src);

}  // namespace wan::video_detail
