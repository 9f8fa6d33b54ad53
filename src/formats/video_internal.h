// Shared pieces of the video writers (not part of the public API): the frame source every writer pulls
// RGB frames from, and the temp-file naming and cleanup that keep failed writes from leaving files behind.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace wan::video_detail {

// Fills `rgb` ([H, W, 3] uint8) with frame `f`. Must be safe to call concurrently for different frames.
using FrameSource = std::function<void(int f, uint8_t* rgb)>;

struct VideoDims {
  int frames, height, width, fps;
};

// "<dir>/<stem>.tmp.<ext>" for the final path "<dir>/<stem>.<ext>".
std::string temp_path_for(const std::string& path);
// Removes a file if it exists, ignoring errors (cleanup on an error path must not throw over the cause).
void remove_quietly(const std::string& path);
// Renames tmp over path; on failure removes tmp and throws naming `path`.
void commit_file(const std::string& tmp, const std::string& path);

void write_y4m(const std::string& path, const VideoDims& d, const FrameSource& src);
void write_png_sequence(const std::string& path, const VideoDims& d, const FrameSource& src);
// Throws a clear error when the build has no FFmpeg.
void write_mp4(const std::string& path, const VideoDims& d, const FrameSource& src);

}  // namespace wan::video_detail
