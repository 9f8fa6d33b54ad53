// MP4 (H.264, yuv420p) output through libavcodec/libavformat/libswscale, set up like the official
// writer (imageio-ffmpeg with quality=8 runs `ffmpeg -r <fps> -i - -vcodec libx264 -pix_fmt yuv420p
// -crf 10`): libx264, crf 10, preset medium, encoder-default GOP and B-frames, swscale bicubic RGB24 ->
// YUV420P with its default BT.601 limited-range matrix, tagged as such. The moov atom is moved to the
// front (faststart) so players can start before the whole file arrives.
// Invariants: frame i has pts i in time base 1/fps (constant frame rate); every frame the encoder holds
// back is flushed before the trailer; the file appears under its final name only when complete. The
// bytes depend on the frames and the fps alone: libx264 runs a fixed number of threads (its output
// depends on the count), without its AVX-512 kernels (with them, x264 r3095's MB-tree results depend on
// the contents of uninitialised heap memory, so the same frames gave different files from one process
// to the next, and within one process), and the muxer writes no version strings or dates.
#include "core/error.h"
#include "core/log.h"
#include "formats/output_file.h"
#include "formats/video.h"
#include "formats/video_internal.h"

#if defined(WAN_HAVE_FFMPEG) && WAN_HAVE_FFMPEG
#include <dlfcn.h>
#include <strings.h>

#include <cstring>
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/dict.h>
#include <libavutil/error.h>
#include <libavutil/log.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>
}
#include <memory>
#include <mutex>
#include <vector>

#include "formats/libav.h"
#endif

namespace wan::video_detail {

#if defined(WAN_HAVE_FFMPEG) && WAN_HAVE_FFMPEG
namespace {

// imageio's quality=8: int((1 - 8 / 10) * 51) = 10 (see the file comment).
constexpr const char* kCrf = "10";
constexpr const char* kPreset = "medium";
// Only for encoders other than libx264, which take no crf: bits per pixel per frame.
constexpr double kFallbackBitsPerPixel = 0.5;
// libx264's frame threads. A constant, not the CPU count: x264's output depends on its thread count, and
// the bytes must not depend on the machine. x264 uses fewer for short frames on its own (by the height).
constexpr int kX264Threads = 8;

using libav::av_err;
using libav::CodecCloser;
using libav::FrameCloser;
using libav::PacketCloser;
using libav::quiet_libav_once;
using libav::SwsCloser;

struct FormatCloser {
  void operator()(AVFormatContext* f) const {
    if (f->pb) avio_closep(&f->pb);
    avformat_free_context(f);
  }
};


// x264-params that make libx264's bytes a function of its input: its own CPU detection without AVX-512
// ("asm=<flags>", see the file comment). Where this process's libx264 does not export its detection (it
// is linked into libavcodec statically), MB-tree is turned off instead, the part found to misbehave.
std::string x264_determinism_params() {
  struct CpuName {  // x264.h's x264_cpu_name_t
    const char* name;
    uint32_t flags;
  };
  using DetectFn = uint32_t (*)();
  const auto detect = reinterpret_cast<DetectFn>(dlsym(RTLD_DEFAULT, "x264_cpu_detect"));
  const auto* names = static_cast<const CpuName*>(dlsym(RTLD_DEFAULT, "x264_cpu_names"));
  if (!detect || !names) return "mbtree=0";
  uint32_t avx512 = 0, avx2 = 0;
  for (const CpuName* n = names; n->name && n->flags != 0; ++n) {
    if (strcasecmp(n->name, "AVX512") == 0) avx512 = n->flags;
    if (strcasecmp(n->name, "AVX2") == 0) avx2 = n->flags;
  }
  const uint32_t only_avx512 = avx512 & ~avx2;  // the table's entries include the levels below
  if (only_avx512 == 0) return "";               // not an x86 build of x264: nothing to take away
  return "asm=" + std::to_string(detect() & ~only_avx512);
}

// Tags the stream with what swscale's conversion actually does: its RGB -> YUV matrix and output
// range (read back from the context, not assumed), and BT.709 primaries and transfer, those of the RGB
// the model produces (it learned from ordinary web video).
void tag_colours(SwsContext* sws, AVCodecContext* c) {
  int *inv_table = nullptr, *table = nullptr, src_range = 0, dst_range = 0, brightness = 0, contrast = 0, sat = 0;
  if (sws_getColorspaceDetails(sws, &inv_table, &src_range, &table, &dst_range, &brightness, &contrast, &sat) < 0 ||
      !table)
    return;  // left unspecified: players guess as before
  auto is = [&](int cs) { return std::memcmp(table, sws_getCoefficients(cs), 4 * sizeof(int)) == 0; };
  c->colorspace = is(SWS_CS_ITU601) ? AVCOL_SPC_SMPTE170M : is(SWS_CS_ITU709) ? AVCOL_SPC_BT709 : AVCOL_SPC_UNSPECIFIED;
  c->color_range = dst_range ? AVCOL_RANGE_JPEG : AVCOL_RANGE_MPEG;
  c->color_primaries = AVCOL_PRI_BT709;
  c->color_trc = AVCOL_TRC_BT709;
}

class Mp4Encoder {
 public:
  Mp4Encoder(const std::string& path, const std::string& tmp, const VideoDims& d) : path_(path), d_(d) {
    const AVCodec* codec = avcodec_find_encoder_by_name("libx264");
    const bool x264 = codec != nullptr;
    if (!codec) codec = avcodec_find_encoder(AV_CODEC_ID_H264);
    check(codec != nullptr, "this FFmpeg has no H.264 encoder (libx264 or another)");
    if (!x264) LOG_WARN("libx264 not in this libavcodec; encoding ", path, " with ", codec->name, " instead");

    // "file:" keeps a name like "a:b.mp4" from being read as protocol "a"; faststart reopens this URL.
    const std::string url = "file:" + tmp;
    AVFormatContext* fmt = nullptr;
    int ret = avformat_alloc_output_context2(&fmt, nullptr, "mp4", url.c_str());
    check(ret >= 0 && fmt, "cannot set up the MP4 muxer: ", av_err(ret));
    fmt_.reset(fmt);
    fmt->flags |= AVFMT_FLAG_BITEXACT;  // no "encoder=Lavf<version>" tag: bytes independent of the library build
    AVStream* st = avformat_new_stream(fmt, nullptr);
    check(st != nullptr, "cannot add a video stream");
    st_index_ = st->index;

    codec_.reset(avcodec_alloc_context3(codec));
    check(codec_ != nullptr, "out of memory allocating the encoder");
    AVCodecContext* c = codec_.get();
    c->codec_id = AV_CODEC_ID_H264;
    c->width = d.width;
    c->height = d.height;
    c->pix_fmt = AV_PIX_FMT_YUV420P;
    c->time_base = AVRational{1, d.fps};
    c->framerate = AVRational{d.fps, 1};
    c->sample_aspect_ratio = AVRational{1, 1};
    c->thread_count = x264 ? kX264Threads : 0;
    if (fmt->oformat->flags & AVFMT_GLOBALHEADER) c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    // SWS_BICUBIC is the ffmpeg CLI's default scaler flag; the matrix is swscale's default (BT.601, TV range).
    sws_.reset(sws_getContext(d.width, d.height, AV_PIX_FMT_RGB24, d.width, d.height, AV_PIX_FMT_YUV420P,
                              SWS_BICUBIC, nullptr, nullptr, nullptr));
    check(sws_ != nullptr, "cannot set up the RGB -> YUV420P conversion");
    tag_colours(sws_.get(), c);
    if (x264) {
      check(av_opt_set(c->priv_data, "preset", kPreset, 0) >= 0, "libx264 rejected preset ", kPreset);
      check(av_opt_set(c->priv_data, "crf", kCrf, 0) >= 0, "libx264 rejected crf ", kCrf);
      const std::string params = x264_determinism_params();
      if (!params.empty())
        check(av_opt_set(c->priv_data, "x264-params", params.c_str(), 0) >= 0, "libx264 rejected ", params);
    } else {
      c->bit_rate = int64_t(kFallbackBitsPerPixel * d.width * d.height * d.fps);
    }
    ret = avcodec_open2(c, codec, nullptr);
    check(ret >= 0, "cannot open the H.264 encoder ", codec->name, ": ", av_err(ret));
    ret = avcodec_parameters_from_context(st->codecpar, c);
    check(ret >= 0, "cannot copy encoder parameters: ", av_err(ret));
    st->time_base = c->time_base;
    st->avg_frame_rate = AVRational{d.fps, 1};
    st->r_frame_rate = AVRational{d.fps, 1};
    st->sample_aspect_ratio = c->sample_aspect_ratio;

    ret = avio_open(&fmt->pb, url.c_str(), AVIO_FLAG_WRITE);
    check(ret >= 0, "cannot create '", tmp, "': ", av_err(ret));
    AVDictionary* opts = nullptr;
    av_dict_set(&opts, "movflags", "+faststart", 0);
    ret = avformat_write_header(fmt, &opts);
    av_dict_free(&opts);
    check(ret >= 0, "cannot write the MP4 header: ", av_err(ret));

    frame_.reset(av_frame_alloc());
    pkt_.reset(av_packet_alloc());
    check(frame_ && pkt_, "out of memory allocating a frame");
    frame_->format = AV_PIX_FMT_YUV420P;
    frame_->width = d.width;
    frame_->height = d.height;
    ret = av_frame_get_buffer(frame_.get(), 0);
    check(ret >= 0, "cannot allocate a frame: ", av_err(ret));
  }

  void add_frame(int index, const uint8_t* rgb) {
    int ret = av_frame_make_writable(frame_.get());
    check(ret >= 0, "cannot make a frame writable: ", av_err(ret));
    const uint8_t* src[1] = {rgb};
    const int src_stride[1] = {3 * d_.width};
    const int rows = sws_scale(sws_.get(), src, src_stride, 0, d_.height, frame_->data, frame_->linesize);
    check(rows == d_.height, "RGB -> YUV420P conversion failed on frame ", index);
    frame_->pts = index;
    send(frame_.get());
  }

  // Flushes the frames the encoder holds back (B-frames, lookahead), then writes the trailer and moov.
  void finish() {
    send(nullptr);
    int ret = av_write_trailer(fmt_.get());
    check(ret >= 0, "cannot write the MP4 trailer: ", av_err(ret));
    ret = avio_closep(&fmt_->pb);
    check(ret >= 0, "cannot close the file: ", av_err(ret));
    check(packets_ == d_.frames, "the encoder returned ", packets_, " frames for ", d_.frames);
  }

 private:
  template <typename... Args>
  void check(bool ok, Args&&... args) const {
    if (!ok) WAN_THROW("cannot write video '", path_, "': ", std::forward<Args>(args)...);
  }

  void send(AVFrame* f) {
    int ret = avcodec_send_frame(codec_.get(), f);
    check(ret >= 0, "the H.264 encoder rejected a frame: ", av_err(ret));
    AVStream* st = fmt_->streams[st_index_];
    for (;;) {
      ret = avcodec_receive_packet(codec_.get(), pkt_.get());
      if (ret == AVERROR(EAGAIN) || ret == AVERROR_EOF) return;
      check(ret >= 0, "H.264 encoding failed: ", av_err(ret));
      av_packet_rescale_ts(pkt_.get(), codec_->time_base, st->time_base);
      pkt_->stream_index = st_index_;
      ++packets_;
      ret = av_interleaved_write_frame(fmt_.get(), pkt_.get());  // takes the packet's reference
      check(ret >= 0, "cannot write a packet: ", av_err(ret));
    }
  }

  std::string path_;
  VideoDims d_;
  std::unique_ptr<AVFormatContext, FormatCloser> fmt_;
  std::unique_ptr<AVCodecContext, CodecCloser> codec_;
  std::unique_ptr<AVFrame, FrameCloser> frame_;
  std::unique_ptr<AVPacket, PacketCloser> pkt_;
  std::unique_ptr<SwsContext, SwsCloser> sws_;
  int st_index_ = 0;
  int packets_ = 0;
};

}  // namespace

void write_mp4(const std::string& path, const VideoDims& d, const FrameSource& src) {
  quiet_libav_once();
  // libavformat writes the temporary file by name (faststart reopens it); `out` owns it and renames it.
  OutputFile out(path, video_who(path));
  {
    // swscale's SIMD reads up to 16 bytes past the last pixel; like FFmpeg's own packets the buffer
    // carries AV_INPUT_BUFFER_PADDING_SIZE zero bytes, so those reads stay inside and deterministic.
    std::vector<uint8_t> rgb(size_t(d.height) * size_t(d.width) * 3 + AV_INPUT_BUFFER_PADDING_SIZE, 0);
    Mp4Encoder enc(path, out.temp_path(), d);
    for (int f = 0; f < d.frames; ++f) {
      src(f, rgb.data());
      enc.add_frame(f, rgb.data());
    }
    enc.finish();
  }  // the encoder and its file handle are closed before the rename
  out.commit();
}

#else

void write_mp4(const std::string& path, const VideoDims&, const FrameSource&) {
  WAN_THROW("cannot write video '", path, "': this build has no FFmpeg (libavcodec) support, so .mp4 is "
            "unavailable; write .y4m or .png instead");
}

#endif

}  // namespace wan::video_detail
