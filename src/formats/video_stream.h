// A video written while its frames are still being produced: the encoder runs on its own thread and
// takes each frame as soon as the producer marks it ready, so encoding and writing overlap the decode
// instead of following it.
// Invariants: the file rules of video.h hold (one format per extension, a temporary file renamed over
// the target only once complete, nothing left behind on failure or abort). Frames are marked ready in
// order; the bytes written equal write_video_rgb8's for the same frames.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "formats/video.h"

namespace wan {

class VideoStreamWriter {
 public:
  explicit VideoStreamWriter(std::string path, VideoWriteOptions opt = {});
  ~VideoStreamWriter();  // abort() unless finish() returned
  VideoStreamWriter(const VideoStreamWriter&) = delete;
  VideoStreamWriter& operator=(const VideoStreamWriter&) = delete;

  // Checks the size and the target (the errors write_video gives, thrown here), sizes the frame buffer
  // and starts the encoder. Returns the buffer the producer fills: [frames, height, width, 3] uint8 RGB.
  uint8_t* begin(int frames, int height, int width, int fps);
  // Frames [0, n) of the buffer are complete (n only grows; at most the frame count).
  void ready(int n);
  // Waits until the file is complete; rethrows the encoder's error. Every frame must be ready.
  void finish();
  // Stops the encoder: before every frame is ready the target is left as it was; once they all are, the
  // file is completed as by finish() (its errors dropped). Safe at any time; nothing after finish().
  void abort() noexcept;

  bool started() const { return thread_.joinable() || finished_; }
  // The size begin() was given (0 before it).
  int frames() const { return total_; }
  int height() const { return height_; }
  int width() const { return width_; }
  const std::string& path() const { return path_; }

 private:
  void take(int f, uint8_t* rgb);

  std::string path_;
  VideoWriteOptions opt_;
  std::vector<uint8_t> frames_;
  size_t frame_bytes_ = 0;
  int total_ = 0, height_ = 0, width_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  int ready_ = 0;
  bool aborted_ = false, finished_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace wan
