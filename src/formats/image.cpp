// Still-image decoding (see image.h): file bytes -> container sniffing (size, EXIF) -> PPM/PGM natively or
// FFmpeg (libavformat image demuxers from memory, libavcodec, swscale) -> 8-bit RGB -> EXIF orientation.
// Invariants: all parsing is over one in-memory buffer with explicit bounds checks (no read past `size`);
// every loop over input structures advances by at least one byte or is capped, so nothing hangs; the
// size limits are checked from the header (own sniffing of PNG / JPEG / WebP, FFmpeg's codec parameters,
// and a get_buffer2 guard in the decoder) before pixel memory exists; FFmpeg never opens another
// resource (no protocol, io_open refuses) and only image demuxers are accepted; the decoder's own log
// lines show only at debug level, so a failure is our one wan::Error line.
#include "formats/image.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>

#include "core/error.h"
#include "core/log.h"
#include "core/printable.h"

#if defined(WAN_HAVE_FFMPEG) && WAN_HAVE_FFMPEG
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/error.h>
#include <libavutil/imgutils.h>
#include <libavutil/mem.h>
#include <libavutil/opt.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}

#include "formats/libav.h"
#endif

namespace wan {
namespace {

// ---- bytes ---------------------------------------------------------------------------------------------

uint32_t be16(const uint8_t* p) { return (uint32_t(p[0]) << 8) | p[1]; }
uint32_t be32(const uint8_t* p) { return (be16(p) << 16) | be16(p + 2); }
uint32_t le16(const uint8_t* p) { return (uint32_t(p[1]) << 8) | p[0]; }
uint32_t le24(const uint8_t* p) { return le16(p) | (uint32_t(p[2]) << 16); }
uint32_t le32(const uint8_t* p) { return le16(p) | (le16(p + 2) << 16); }
bool starts(const uint8_t* d, size_t n, const char* magic, size_t m) { return n >= m && std::memcmp(d, magic, m) == 0; }

bool is_space(uint8_t c) { return c == ' ' || (c >= '\t' && c <= '\r'); }  // " \t\n\v\f\r"

std::string shown(const std::string& name) { return printable(name); }

std::vector<uint8_t> read_file(const std::string& path, const ImageLimits& limits) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) WAN_THROW(shown(path), ": cannot open: ", std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) WAN_THROW(shown(path), ": cannot open: ", std::strerror(errno));
  WAN_CHECK(!S_ISDIR(st.st_mode), shown(path), ": is a directory, not an image file");
  WAN_CHECK(S_ISREG(st.st_mode), shown(path), ": not a regular file");
  WAN_CHECK(st.st_size <= limits.max_file_bytes, shown(path), ": file of ", st.st_size,
            " bytes is over the limit of ", limits.max_file_bytes, " bytes for an image");
  std::vector<uint8_t> data(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::read(fd, data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) WAN_THROW(shown(path), ": cannot read: ", std::strerror(errno));
    if (n == 0) break;  // the file shrank while we read it: decode what is there
    got += static_cast<size_t>(n);
  }
  data.resize(got);
  return data;
}

// Refuses an image over the limits or without pixels, from its declared size.
void check_size(const std::string& name, int64_t w, int64_t h, const ImageLimits& limits) {
  WAN_CHECK(w > 0 && h > 0, shown(name), ": image has no pixels (", w, "x", h, ")");
  WAN_CHECK(w <= limits.max_side && h <= limits.max_side, shown(name), ": image is ", w, "x", h,
            " pixels, over the limit of ", limits.max_side, " pixels a side");
  WAN_CHECK(w <= limits.max_pixels / h, shown(name), ": image is ", w, "x", h, " = ", w * h,
            " pixels, over the limit of ", limits.max_pixels, " pixels");
}

// ---- container headers: declared size and the EXIF block ------------------------------------------------

struct Header {
  const char* format = nullptr;  // "PNG", "JPEG", "WebP", ... (only for messages); null when unknown
  int64_t width = -1, height = -1;  // -1: not known from our own parsing
  const uint8_t* exif = nullptr;    // TIFF bytes ("II*\0" / "MM\0*" ...), "Exif\0\0" already stripped
  size_t exif_size = 0;
};

void set_exif(Header& h, const uint8_t* p, size_t n) {
  if (h.exif) return;  // the first block counts, as in Pillow
  if (starts(p, n, "Exif\0\0", 6)) p += 6, n -= 6;
  h.exif = p;
  h.exif_size = n;
}

void sniff_png(const uint8_t* d, size_t n, Header& h) {
  size_t pos = 8;
  while (pos + 12 <= n) {
    const uint32_t len = be32(d + pos);
    const uint8_t* type = d + pos + 4;
    if (len > n - pos - 12) break;  // truncated chunk: the decoder reports it
    const uint8_t* body = d + pos + 8;
    if (std::memcmp(type, "IHDR", 4) == 0 && len >= 8 && h.width < 0) {
      h.width = be32(body);
      h.height = be32(body + 4);
    } else if (std::memcmp(type, "eXIf", 4) == 0) {
      set_exif(h, body, len);
    } else if (std::memcmp(type, "IEND", 4) == 0) {
      break;
    }
    pos += size_t(len) + 12;
  }
}

bool is_sof(uint8_t m) { return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC; }

void sniff_jpeg(const uint8_t* d, size_t n, Header& h) {
  size_t pos = 2;
  while (pos + 4 <= n) {
    if (d[pos] != 0xFF) break;  // not at a marker: leave the rest to the decoder
    const uint8_t m = d[pos + 1];
    if (m == 0xFF) {  // fill byte
      ++pos;
      continue;
    }
    if (m == 0xD8 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {  // markers without a length
      pos += 2;
      continue;
    }
    if (m == 0xD9 || m == 0xDA) break;  // end of image / start of scan: the header is over
    const size_t len = be16(d + pos + 2);
    if (len < 2 || len > n - pos - 2) break;
    const uint8_t* body = d + pos + 4;
    const size_t body_len = len - 2;
    if (is_sof(m) && body_len >= 5 && h.width < 0) {
      h.height = be16(body + 1);
      h.width = be16(body + 3);
      if (h.height == 0) h.height = -1;  // defined later by a DNL marker: unknown here
    } else if (m == 0xE1 && starts(body, body_len, "Exif\0\0", 6)) {
      set_exif(h, body, body_len);
    }
    pos += 2 + len;
  }
}

void sniff_webp(const uint8_t* d, size_t n, Header& h) {
  size_t pos = 12;
  while (pos + 8 <= n) {
    const uint8_t* id = d + pos;
    const size_t len = le32(d + pos + 4);
    if (len > n - pos - 8) break;
    const uint8_t* b = d + pos + 8;
    if (std::memcmp(id, "VP8X", 4) == 0 && len >= 10) {
      h.width = int64_t(le24(b + 4)) + 1;
      h.height = int64_t(le24(b + 7)) + 1;
    } else if (std::memcmp(id, "VP8L", 4) == 0 && len >= 5 && h.width < 0 && b[0] == 0x2F) {
      const uint32_t bits = le32(b + 1);
      h.width = int64_t(bits & 0x3FFF) + 1;
      h.height = int64_t((bits >> 14) & 0x3FFF) + 1;
    } else if (std::memcmp(id, "VP8 ", 4) == 0 && len >= 10 && h.width < 0 && b[3] == 0x9D && b[4] == 0x01 &&
               b[5] == 0x2A) {
      h.width = le16(b + 6) & 0x3FFF;
      h.height = le16(b + 8) & 0x3FFF;
    } else if (std::memcmp(id, "EXIF", 4) == 0) {
      set_exif(h, b, len);
    }
    pos += 8 + len + (len & 1);
  }
}

Header sniff(const uint8_t* d, size_t n) {
  Header h;
  if (starts(d, n, "\x89PNG\r\n\x1a\n", 8)) {
    h.format = "PNG";
    sniff_png(d, n, h);
  } else if (starts(d, n, "\xFF\xD8\xFF", 3)) {
    h.format = "JPEG";
    sniff_jpeg(d, n, h);
  } else if (n >= 12 && starts(d, n, "RIFF", 4) && std::memcmp(d + 8, "WEBP", 4) == 0) {
    h.format = "WebP";
    sniff_webp(d, n, h);
  } else if (starts(d, n, "GIF87a", 6) || starts(d, n, "GIF89a", 6)) {
    h.format = "GIF";
  } else if (starts(d, n, "BM", 2)) {
    h.format = "BMP";
  } else if (starts(d, n, "II*\0", 4) || starts(d, n, "MM\0*", 4)) {
    h.format = "TIFF";
  }
  return h;
}

// ---- EXIF orientation -------------------------------------------------------------------------------------

// IFD0's Orientation (tag 0x0112, SHORT or LONG) of a TIFF block; 1 when absent or malformed.
int exif_orientation(const uint8_t* t, size_t n) {
  if (t == nullptr || n < 8) return 1;
  const bool le = t[0] == 'I' && t[1] == 'I';
  if (!le && !(t[0] == 'M' && t[1] == 'M')) return 1;
  auto u16 = [&](size_t at) { return le ? le16(t + at) : be16(t + at); };
  auto u32 = [&](size_t at) { return le ? le32(t + at) : be32(t + at); };
  if (u16(2) != 42) return 1;
  const size_t ifd = u32(4);
  if (ifd > n - 2) return 1;
  const size_t count = u16(ifd);
  for (size_t i = 0; i < count; ++i) {
    const size_t e = ifd + 2 + 12 * i;  // < 2^34: no overflow
    if (e + 12 > n) return 1;
    if (u16(e) != 0x0112 || u32(e + 4) < 1) continue;
    const uint32_t type = u16(e + 2);
    const uint32_t v = type == 3 ? u16(e + 8) : type == 4 ? u32(e + 8) : 1;
    return v >= 1 && v <= 8 ? static_cast<int>(v) : 1;
  }
  return 1;
}

// ImageOps.exif_transpose: the transpose that shows the stored pixels upright.
RgbImage apply_orientation(RgbImage in, int o) {
  if (o <= 1 || o > 8) return in;
  const int W = in.width, H = in.height;
  const bool swap = o >= 5;
  RgbImage out;
  out.width = swap ? H : W;
  out.height = swap ? W : H;
  out.rgb.resize(in.rgb.size());
  for (int y = 0; y < out.height; ++y) {
    for (int x = 0; x < out.width; ++x) {
      int xi = x, yi = y;
      switch (o) {
        case 2: xi = W - 1 - x; break;                       // FLIP_LEFT_RIGHT
        case 3: xi = W - 1 - x, yi = H - 1 - y; break;       // ROTATE_180
        case 4: yi = H - 1 - y; break;                       // FLIP_TOP_BOTTOM
        case 5: xi = y, yi = x; break;                       // TRANSPOSE
        case 6: xi = y, yi = H - 1 - x; break;               // ROTATE_270 (clockwise)
        case 7: xi = W - 1 - y, yi = H - 1 - x; break;       // TRANSVERSE
        case 8: xi = W - 1 - y, yi = x; break;               // ROTATE_90 (counter-clockwise)
      }
      std::memcpy(&out.rgb[(size_t(y) * out.width + x) * 3], &in.rgb[(size_t(yi) * W + xi) * 3], 3);
    }
  }
  return out;
}

// ---- PPM / PGM (P6 / P5) ----------------------------------------------------------------------------------

// One decimal header token after whitespace and '#' comments; -1 when there is none.
int64_t ppm_token(const uint8_t* d, size_t n, size_t& pos) {
  while (pos < n) {
    if (d[pos] == '#') {
      while (pos < n && d[pos] != '\n' && d[pos] != '\r') ++pos;
    } else if (is_space(d[pos])) {
      ++pos;
    } else {
      break;
    }
  }
  int64_t v = 0;
  int digits = 0;
  while (pos < n && d[pos] >= '0' && d[pos] <= '9') {
    if (++digits > 9) return -1;  // over 999999999: no valid size or maxval
    v = v * 10 + (d[pos++] - '0');
  }
  return digits > 0 ? v : -1;
}

RgbImage read_ppm(const uint8_t* d, size_t n, const std::string& name, const ImageLimits& limits) {
  const bool rgb = d[1] == '6';
  const char* kind = rgb ? "PPM (P6)" : "PGM (P5)";
  size_t pos = 2;
  const int64_t w = ppm_token(d, n, pos), h = ppm_token(d, n, pos), maxval = ppm_token(d, n, pos);
  WAN_CHECK(w >= 0 && h >= 0 && maxval >= 0 && (pos == n || is_space(d[pos])), shown(name), ": malformed ", kind,
            " header (expected width, height and maxval)");
  WAN_CHECK(maxval >= 1 && maxval <= 65535, shown(name), ": ", kind, " maxval ", maxval, " is not in 1..65535");
  check_size(name, w, h, limits);
  pos = std::min(pos + 1, n);  // the single whitespace byte before the raster
  const int ch = rgb ? 3 : 1, bps = maxval > 255 ? 2 : 1;
  const uint64_t need = uint64_t(w) * uint64_t(h) * ch * bps;
  WAN_CHECK(need <= n - pos, shown(name), ": truncated ", kind, ": its ", w, "x", h, " pixels need ", need,
            " bytes, the file has ", n - pos);
  // Pillow's PPM rule (PpmDecoder): min(255, round(v / maxval * 255)) in double, ties to even.
  uint8_t lut8[256];
  for (int v = 0; v < 256; ++v)
    lut8[v] = static_cast<uint8_t>(std::min(255.0, std::nearbyint(double(v) / double(maxval) * 255.0)));
  RgbImage img;
  img.width = static_cast<int>(w);
  img.height = static_cast<int>(h);
  img.rgb.resize(size_t(w) * size_t(h) * 3);
  const uint8_t* src = d + pos;
  const size_t samples = size_t(w) * size_t(h) * ch;
  for (size_t i = 0; i < samples; ++i) {
    uint8_t v;
    if (bps == 1) {
      v = maxval == 255 ? src[i] : lut8[src[i]];
    } else {
      const double s = be16(src + 2 * i);
      v = static_cast<uint8_t>(std::min(255.0, std::nearbyint(s / double(maxval) * 255.0)));
    }
    if (rgb) {
      img.rgb[i] = v;
    } else {
      std::memset(&img.rgb[i * 3], v, 3);
    }
  }
  return img;
}

bool is_binary_pnm(const uint8_t* d, size_t n) { return n >= 3 && d[0] == 'P' && (d[1] == '5' || d[1] == '6'); }

#if defined(WAN_HAVE_FFMPEG) && WAN_HAVE_FFMPEG
// ---- FFmpeg --------------------------------------------------------------------------------------------

using libav::av_err;
using libav::CodecCloser;
using libav::FrameCloser;
using libav::PacketCloser;
using libav::quiet_libav_once;
using libav::SwsCloser;

// FFmpeg's own log lines (corrupt-data messages and the like) show only at our debug level: per decoder
// through its log_level_offset; the demuxer probe has no such option, so its warnings are held back by
// the same process-wide level the MP4 writer sets (errors only, unless debugging).
int log_offset() { return log_level() >= LogLevel::Debug ? 0 : AV_LOG_DEBUG - AV_LOG_ERROR; }

struct MemoryInput {
  const uint8_t* data;
  size_t size;
  size_t pos = 0;
};

int read_memory(void* opaque, uint8_t* buf, int want) {
  auto* in = static_cast<MemoryInput*>(opaque);
  const size_t n = std::min(in->size - in->pos, static_cast<size_t>(std::max(want, 0)));
  if (n == 0) return AVERROR_EOF;
  std::memcpy(buf, in->data + in->pos, n);
  in->pos += n;
  return static_cast<int>(n);
}

int64_t seek_memory(void* opaque, int64_t offset, int whence) {
  auto* in = static_cast<MemoryInput*>(opaque);
  whence &= ~AVSEEK_FORCE;
  if (whence == AVSEEK_SIZE) return static_cast<int64_t>(in->size);
  const int64_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? int64_t(in->pos) : int64_t(in->size);
  if (whence != SEEK_SET && whence != SEEK_CUR && whence != SEEK_END) return AVERROR(EINVAL);
  if (offset > int64_t(in->size) - base || base + offset < 0) return AVERROR(EINVAL);
  in->pos = static_cast<size_t>(base + offset);
  return static_cast<int64_t>(in->pos);
}

// No demuxer may open anything beyond the buffer (playlists, references to other files).
int refuse_io_open(AVFormatContext*, AVIOContext**, const char*, int, AVDictionary**) { return AVERROR(EPERM); }

bool is_image_demuxer(const AVInputFormat* f) {
  const std::string n = f->name;
  return (n.size() > 5 && n.compare(n.size() - 5, 5, "_pipe") == 0) || n == "gif" || n == "apng" ||
         n == "ico" || n == "image2";
}

struct IoCloser {
  void operator()(AVIOContext* io) const {
    av_freep(&io->buffer);
    avio_context_free(&io);
  }
};
struct FormatCloser {
  void operator()(AVFormatContext* f) const { avformat_close_input(&f); }
};

// Refuses frame buffers over the limits: the decoder asks for pixel memory only here.
struct BufferGuard {
  ImageLimits limits;
  int64_t refused_w = 0, refused_h = 0;
};

int guarded_get_buffer(AVCodecContext* c, AVFrame* f, int flags) {
  auto* g = static_cast<BufferGuard*>(c->opaque);
  const int64_t w = c->width > 0 ? c->width : f->width, h = c->height > 0 ? c->height : f->height;
  if (w > g->limits.max_side || h > g->limits.max_side || w * h > g->limits.max_pixels) {
    g->refused_w = w;
    g->refused_h = h;
    return AVERROR(ENOMEM);
  }
  return avcodec_default_get_buffer2(c, f, flags);
}

// The pixel format swscale should read, and whether its YUV is full range.
AVPixelFormat unjpeg(AVPixelFormat f, bool& full) {
  switch (f) {
    case AV_PIX_FMT_YUVJ420P: full = true; return AV_PIX_FMT_YUV420P;
    case AV_PIX_FMT_YUVJ422P: full = true; return AV_PIX_FMT_YUV422P;
    case AV_PIX_FMT_YUVJ444P: full = true; return AV_PIX_FMT_YUV444P;
    case AV_PIX_FMT_YUVJ440P: full = true; return AV_PIX_FMT_YUV440P;
    case AV_PIX_FMT_YUVJ411P: full = true; return AV_PIX_FMT_YUV411P;
    default: return f;
  }
}

int sws_colorspace(AVColorSpace cs) {
  switch (cs) {
    case AVCOL_SPC_BT709: return SWS_CS_ITU709;
    case AVCOL_SPC_FCC: return SWS_CS_FCC;
    case AVCOL_SPC_SMPTE240M: return SWS_CS_SMPTE240M;
    case AVCOL_SPC_BT2020_NCL:
    case AVCOL_SPC_BT2020_CL: return SWS_CS_BT2020;
    default: return SWS_CS_ITU601;  // JFIF, VP8 and unspecified YUV are BT.601
  }
}

// libjpeg's "fancy" chroma upsampling (jdsample.c h2v1, h1v2, h2v2: triangle filters with its rounding
// biases, edge samples repeated) of 8-bit planar YUV to 4:4:4. That is how Pillow's libjpeg-turbo fills
// in the chroma of 4:2:2, 4:4:0 and 4:2:0 JPEGs; swscale's chroma interpolation differs from it by up to
// ~90 levels at sharp colour edges. Alpha, if any, is dropped here (convert("RGB") drops it anyway).
std::unique_ptr<AVFrame, FrameCloser> fancy_upsample(const AVFrame* fr, const AVPixFmtDescriptor* desc) {
  std::unique_ptr<AVFrame, FrameCloser> p(av_frame_alloc());
  if (!p) return p;
  p->format = AV_PIX_FMT_YUV444P;
  p->width = fr->width;
  p->height = fr->height;
  if (av_frame_get_buffer(p.get(), 0) < 0) return nullptr;
  const int W = fr->width, H = fr->height;
  const bool h2 = desc->log2_chroma_w == 1, v2 = desc->log2_chroma_h == 1;
  const int cw = AV_CEIL_RSHIFT(W, desc->log2_chroma_w), ch = AV_CEIL_RSHIFT(H, desc->log2_chroma_h);
  av_image_copy_plane(p->data[0], p->linesize[0], fr->data[0], fr->linesize[0], W, H);
  std::vector<int> colsum(static_cast<size_t>(cw));
  for (int plane = 1; plane <= 2; ++plane) {
    for (int y = 0; y < H; ++y) {
      const int near = v2 ? y >> 1 : y;
      const int far = v2 ? std::clamp(near + ((y & 1) ? 1 : -1), 0, ch - 1) : near;  // row below / above
      const uint8_t* a = fr->data[plane] + size_t(near) * fr->linesize[plane];
      const uint8_t* b = fr->data[plane] + size_t(far) * fr->linesize[plane];
      uint8_t* out = p->data[plane] + size_t(y) * p->linesize[plane];
      for (int c = 0; c < cw; ++c) colsum[c] = v2 ? 3 * a[c] + b[c] : a[c];
      for (int x = 0; x < W; ++x) {
        if (!h2) {  // h1v2
          out[x] = static_cast<uint8_t>((colsum[x] + ((y & 1) ? 2 : 1)) >> 2);
          continue;
        }
        const int c = x >> 1, n = (x & 1) ? std::min(c + 1, cw - 1) : std::max(c - 1, 0);  // nearer, further
        out[x] = static_cast<uint8_t>(v2 ? (3 * colsum[c] + colsum[n] + ((x & 1) ? 7 : 8)) >> 4   // h2v2
                                         : (3 * colsum[c] + colsum[n] + ((x & 1) ? 2 : 1)) >> 2);  // h2v1
      }
    }
  }
  return p;
}

// Frame -> 8-bit RGB. Deep formats go through RGB48 (exact for 16-bit RGB and grey) and keep the high byte.
RgbImage frame_to_rgb(const AVFrame* frame, const std::string& name) {
  const auto src_fmt = static_cast<AVPixelFormat>(frame->format);
  const AVPixFmtDescriptor* desc = av_pix_fmt_desc_get(src_fmt);
  WAN_CHECK(desc != nullptr, shown(name), ": the decoder returned an unknown pixel format");
  int depth = 0;
  for (int i = 0; i < desc->nb_components; ++i) depth = std::max(depth, desc->comp[i].depth);
  const bool deep = depth > 8;
  bool full = frame->color_range == AVCOL_RANGE_JPEG;
  const AVPixelFormat in_fmt = unjpeg(src_fmt, full);
  const bool yuv = !(desc->flags & (AV_PIX_FMT_FLAG_RGB | AV_PIX_FMT_FLAG_PAL)) && desc->nb_components >= 3;
  if (!yuv) full = true;  // grey samples in image files are full range
  const AVPixelFormat out_fmt = deep ? AV_PIX_FMT_RGB48 : AV_PIX_FMT_RGB24;
  WAN_CHECK(sws_isSupportedInput(in_fmt), shown(name), ": pixel format ", desc->name, " cannot be converted to RGB");
  WAN_CHECK(frame->width > 0 && frame->height > 0, shown(name), ": the decoder returned an empty picture");
  // 8-bit planar YUV subsampled 2x (JPEG, lossy WebP): libjpeg's upsampling first, then swscale does only
  // the matrix. Other subsampling (4:1:1, deeper than 8 bits; rare in still images) is left to swscale,
  // which derives its chroma scale from the plane sizes and so misplaces chroma slightly at odd sizes.
  std::unique_ptr<AVFrame, FrameCloser> upsampled;
  const bool fancy = yuv && (desc->flags & AV_PIX_FMT_FLAG_PLANAR) && desc->comp[0].step == 1 && !deep &&
                     desc->log2_chroma_w <= 1 && desc->log2_chroma_h <= 1 &&
                     (desc->log2_chroma_w | desc->log2_chroma_h) != 0;
  if (fancy) {
    upsampled = fancy_upsample(frame, desc);
    WAN_CHECK(upsampled != nullptr, shown(name), ": out of memory converting the image to RGB");
  }
  const AVFrame* fr = fancy ? upsampled.get() : frame;
  const AVPixelFormat sws_fmt = fancy ? AV_PIX_FMT_YUV444P : in_fmt;
  const AVPixFmtDescriptor* sws_desc = av_pix_fmt_desc_get(sws_fmt);
  std::unique_ptr<SwsContext, SwsCloser> sws(sws_alloc_context());
  WAN_CHECK(sws != nullptr, shown(name), ": out of memory setting up the RGB conversion");
  SwsContext* s = sws.get();
  const int W = fr->width, H = fr->height;
  av_opt_set_int(s, "srcw", W, 0);
  av_opt_set_int(s, "srch", H, 0);
  av_opt_set_int(s, "src_format", sws_fmt, 0);
  av_opt_set_int(s, "dstw", W, 0);
  av_opt_set_int(s, "dsth", H, 0);
  av_opt_set_int(s, "dst_format", out_fmt, 0);
  av_opt_set_int(s, "sws_flags", SWS_BILINEAR | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT | SWS_BITEXACT, 0);
  av_opt_set_int(s, "src_range", full ? 1 : 0, 0);
  av_opt_set_int(s, "dst_range", 1, 0);
  // The declared chroma siting (JPEG: centred), along the subsampled axes only: swscale's positions are
  // in luma units / 256, and a full-resolution axis has its chroma on the luma samples.
  int xpos = 0, ypos = 0;
  if (yuv && frame->chroma_location != AVCHROMA_LOC_UNSPECIFIED &&
      avcodec_enum_to_chroma_pos(&xpos, &ypos, frame->chroma_location) == 0) {
    av_opt_set_int(s, "src_h_chr_pos", sws_desc->log2_chroma_w > 0 ? xpos : 0, 0);
    av_opt_set_int(s, "src_v_chr_pos", sws_desc->log2_chroma_h > 0 ? ypos : 0, 0);
  }
  int ret = sws_init_context(s, nullptr, nullptr);
  WAN_CHECK(ret >= 0, shown(name), ": cannot convert pixel format ", desc->name, " to RGB: ", av_err(ret));
  const int* coeffs = sws_getCoefficients(sws_colorspace(frame->colorspace));
  sws_setColorspaceDetails(s, coeffs, full ? 1 : 0, sws_getCoefficients(SWS_CS_ITU601), 1, 0, 1 << 16, 1 << 16);

  RgbImage img;
  img.width = W;
  img.height = H;
  img.rgb.resize(size_t(W) * size_t(H) * 3);
  std::vector<uint16_t> wide(deep ? img.rgb.size() : 0);
  uint8_t* dst[4] = {deep ? reinterpret_cast<uint8_t*>(wide.data()) : img.rgb.data(), nullptr, nullptr, nullptr};
  int dst_stride[4] = {W * 3 * (deep ? 2 : 1), 0, 0, 0};
  ret = sws_scale(s, fr->data, fr->linesize, 0, H, dst, dst_stride);
  WAN_CHECK(ret == H, shown(name), ": converting ", desc->name, " to RGB failed");
  for (size_t i = 0; i < wide.size(); ++i) img.rgb[i] = static_cast<uint8_t>(wide[i] >> 8);  // the high byte
  return img;
}

// Opens `data` as an image through libavformat's demuxers; throws unless it is an image format.
std::unique_ptr<AVFormatContext, FormatCloser> open_image(MemoryInput& in, const std::string& name,
                                                           std::unique_ptr<AVIOContext, IoCloser>& io) {
  constexpr int kIoBuffer = 1 << 16;
  auto* buf = static_cast<uint8_t*>(av_malloc(kIoBuffer));
  WAN_CHECK(buf != nullptr, shown(name), ": out of memory");
  io.reset(avio_alloc_context(buf, kIoBuffer, 0, &in, read_memory, nullptr, seek_memory));
  if (!io) av_free(buf);
  WAN_CHECK(io != nullptr, shown(name), ": out of memory");
  const AVInputFormat* ifmt = nullptr;
  int ret = av_probe_input_buffer2(io.get(), &ifmt, "", nullptr, 0, 0);
  WAN_CHECK(ret >= 0 && ifmt != nullptr, shown(name), ": not an image file (no format recognised)");
  WAN_CHECK(is_image_demuxer(ifmt), shown(name), ": not an image file (FFmpeg reads it as ",
            ifmt->long_name ? ifmt->long_name : ifmt->name, ")");
  AVFormatContext* raw = avformat_alloc_context();
  WAN_CHECK(raw != nullptr, shown(name), ": out of memory");
  raw->pb = io.get();
  raw->io_open = refuse_io_open;
  ret = avformat_open_input(&raw, "", ifmt, nullptr);  // frees `raw` on failure
  WAN_CHECK(ret >= 0, shown(name), ": cannot read the ", ifmt->name, " image: ", av_err(ret));
  return std::unique_ptr<AVFormatContext, FormatCloser>(raw);
}

// Sends packets of stream `idx` until the decoder gives one frame (then flushes at the end of input).
void decode_first_frame(AVFormatContext* fmt, AVCodecContext* c, int idx, AVFrame* frame, const std::string& name,
                        const BufferGuard& guard) {
  std::unique_ptr<AVPacket, PacketCloser> pkt(av_packet_alloc());
  WAN_CHECK(pkt != nullptr, shown(name), ": out of memory");
  auto fail = [&](int ret) {
    if (guard.refused_w > 0) check_size(name, guard.refused_w, guard.refused_h, guard.limits);
    const bool bad = ret == AVERROR_INVALIDDATA || ret == AVERROR_EOF || ret == AVERROR(EIO);
    WAN_THROW(shown(name), ": cannot decode the ", c->codec->name, " image", bad ? ", it is truncated or corrupt" : "",
              " (FFmpeg: ", av_err(ret), ")");
  };
  bool flushing = false;
  for (int packets = 0; packets < 4096; ++packets) {  // images are one packet; the cap only bounds the loop
    int ret = avcodec_receive_frame(c, frame);
    if (ret == 0) return;
    if (ret != AVERROR(EAGAIN)) fail(ret);
    if (flushing) fail(AVERROR_EOF);
    ret = av_read_frame(fmt, pkt.get());
    if (ret == AVERROR_EOF) {
      flushing = true;
      ret = avcodec_send_packet(c, nullptr);
    } else if (ret < 0) {
      fail(ret);
    } else if (pkt->stream_index != idx) {
      av_packet_unref(pkt.get());
      continue;
    } else {
      ret = avcodec_send_packet(c, pkt.get());
      av_packet_unref(pkt.get());
    }
    if (ret < 0 && ret != AVERROR(EAGAIN) && ret != AVERROR_EOF) fail(ret);
  }
  WAN_THROW(shown(name), ": no image in the first 4096 packets");
}

RgbImage decode_ffmpeg(const uint8_t* d, size_t n, const std::string& name, const ImageLimits& limits) {
  quiet_libav_once();
  MemoryInput in{d, n};
  std::unique_ptr<AVIOContext, IoCloser> io;
  auto fmt = open_image(in, name, io);
  const AVCodec* codec = nullptr;
  const int idx = av_find_best_stream(fmt.get(), AVMEDIA_TYPE_VIDEO, -1, -1, &codec, 0);
  WAN_CHECK(idx >= 0 && codec != nullptr, shown(name), ": no decodable image in the ", fmt->iformat->name,
            " file: ", av_err(idx));
  const AVCodecParameters* par = fmt->streams[idx]->codecpar;
  if (par->width > 0 && par->height > 0) check_size(name, par->width, par->height, limits);

  std::unique_ptr<AVCodecContext, CodecCloser> ctx(avcodec_alloc_context3(codec));
  WAN_CHECK(ctx != nullptr, shown(name), ": out of memory");
  AVCodecContext* c = ctx.get();
  int ret = avcodec_parameters_to_context(c, par);
  WAN_CHECK(ret >= 0, shown(name), ": cannot set up the ", codec->name, " decoder: ", av_err(ret));
  BufferGuard guard{limits};
  c->opaque = &guard;
  c->get_buffer2 = guarded_get_buffer;
  c->thread_count = 1;
  c->flags |= AV_CODEC_FLAG_BITEXACT;
  c->idct_algo = FF_IDCT_INT;  // libjpeg's integer IDCT (jidctint), the one Pillow's JPEG decode uses
  c->err_recognition |= AV_EF_EXPLODE | AV_EF_CRCCHECK;  // corrupt data is an error, not a concealed picture
  c->log_level_offset = log_offset();
  ret = avcodec_open2(c, codec, nullptr);
  WAN_CHECK(ret >= 0, shown(name), ": cannot open the ", codec->name, " decoder: ", av_err(ret));

  std::unique_ptr<AVFrame, FrameCloser> frame(av_frame_alloc());
  WAN_CHECK(frame != nullptr, shown(name), ": out of memory");
  decode_first_frame(fmt.get(), c, idx, frame.get(), name, guard);
  WAN_CHECK(!(frame->flags & AV_FRAME_FLAG_CORRUPT) && frame->decode_error_flags == 0, shown(name),
            ": truncated or corrupt image (", codec->name, " decoder)");
  check_size(name, frame->width, frame->height, limits);
  return frame_to_rgb(frame.get(), name);
}
#endif  // WAN_HAVE_FFMPEG

}  // namespace

bool image_have_ffmpeg() {
#if defined(WAN_HAVE_FFMPEG) && WAN_HAVE_FFMPEG
  return true;
#else
  return false;
#endif
}

RgbImage decode_image(const uint8_t* data, size_t size, const std::string& name, const ImageReadOptions& opt) {
  WAN_CHECK(size > 0, shown(name), ": empty file");
  WAN_CHECK(int64_t(size) <= opt.limits.max_file_bytes, shown(name), ": file of ", size,
            " bytes is over the limit of ", opt.limits.max_file_bytes, " bytes for an image");
  if (is_binary_pnm(data, size)) return read_ppm(data, size, name, opt.limits);
  const Header h = sniff(data, size);
  if (h.width >= 0 && h.height >= 0) check_size(name, h.width, h.height, opt.limits);
  RgbImage img;
#if defined(WAN_HAVE_FFMPEG) && WAN_HAVE_FFMPEG
  if (!opt.disable_ffmpeg) img = decode_ffmpeg(data, size, name, opt.limits);
#endif
  if (img.rgb.empty()) {
    if (h.format != nullptr)
      WAN_THROW(shown(name), ": a ", h.format, " image, but this build has no FFmpeg and reads only binary "
                "PPM/PGM (P6/P5)");
    WAN_THROW(shown(name), ": not an image this build can read (it has no FFmpeg: binary PPM/PGM, P6/P5, only)");
  }
  if (opt.exif_orientation) img = apply_orientation(std::move(img), exif_orientation(h.exif, h.exif_size));
  return img;
}

RgbImage read_image(const std::string& path, const ImageReadOptions& opt) {
  const std::vector<uint8_t> data = read_file(path, opt.limits);
  return decode_image(data.data(), data.size(), path, opt);
}

}  // namespace wan
