// The streaming writer (see video_stream.h): the encoder thread pulls frames through the writers'
// FrameSource, which blocks until the producer has marked the frame ready; abort() wakes it with an
// error, so the writer unwinds through OutputFile and leaves no file.
#include "formats/video_stream.h"

#include <cstring>

#include "core/error.h"
#include "formats/video_internal.h"

namespace wan {

VideoStreamWriter::VideoStreamWriter(std::string path, VideoWriteOptions opt)
    : path_(std::move(path)), opt_(opt) {}

VideoStreamWriter::~VideoStreamWriter() { abort(); }

uint8_t* VideoStreamWriter::begin(int frames, int height, int width, int fps) {
  WAN_CHECK(!started(), video_detail::video_who(path_), ": the stream was already started");
  const video_detail::VideoDims d{frames, height, width, fps};
  video_detail::check_video_write(path_, d, opt_);
  frame_bytes_ = size_t(height) * size_t(width) * 3;
  total_ = frames;
  height_ = height;
  width_ = width;
  frames_.assign(size_t(frames) * frame_bytes_, 0);
  thread_ = std::thread([this, d] {
    try {
      video_detail::write_frames(path_, d, [this](int f, uint8_t* rgb) { take(f, rgb); }, opt_);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
    }
  });
  return frames_.data();
}

void VideoStreamWriter::take(int f, uint8_t* rgb) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return aborted_ || ready_ > f; });
    if (aborted_) WAN_THROW(video_detail::video_who(path_), ": aborted before frame ", f, " was ready");
  }
  std::memcpy(rgb, frames_.data() + size_t(f) * frame_bytes_, frame_bytes_);
}

void VideoStreamWriter::ready(int n) {
  WAN_CHECK(thread_.joinable(), video_detail::video_who(path_), ": frames marked ready before begin()");
  WAN_CHECK(n >= 0 && n <= total_, video_detail::video_who(path_), ": ", n, " of ", total_, " frames ready");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (n > ready_) ready_ = n;
  }
  cv_.notify_all();
}

void VideoStreamWriter::finish() {
  WAN_CHECK(thread_.joinable(), video_detail::video_who(path_), ": finish() without begin()");
  {
    std::lock_guard<std::mutex> lock(mu_);
    WAN_CHECK(ready_ == total_ && !aborted_, video_detail::video_who(path_), ": finished with ", ready_, " of ",
              total_, " frames");
  }
  thread_.join();
  finished_ = true;
  std::vector<uint8_t>().swap(frames_);
  if (error_) std::rethrow_exception(error_);
}

void VideoStreamWriter::abort() noexcept {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

}  // namespace wan
