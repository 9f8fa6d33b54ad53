// Internal to the FFmpeg users of formats (mp4.cpp writes, image.cpp reads): the owners of libav*
// objects, error text, and the process-wide log level. Include only where WAN_HAVE_FFMPEG is set.
#pragma once
#include <mutex>
#include <string>

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavutil/error.h>
#include <libavutil/frame.h>
#include <libavutil/log.h>
#include <libswscale/swscale.h>
}

#include "core/log.h"

namespace wan::libav {

struct CodecCloser {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct FrameCloser {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct PacketCloser {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct SwsCloser {
  void operator()(SwsContext* s) const { sws_freeContext(s); }
};

inline std::string av_err(int code) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {};
  av_strerror(code, buf, sizeof(buf));
  return buf;
}

// libav* prints encoder banners, statistics and corrupt-data notes at INFO / WARNING: keep stderr to our
// own log (errors only) unless debugging. Process-wide, set once.
inline void quiet_libav_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (log_level() < LogLevel::Debug) av_log_set_level(AV_LOG_ERROR);
  });
}

}  // namespace wan::libav
