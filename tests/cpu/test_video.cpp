// Tests of the video writers on fresh random videos (smooth gradients plus noise, never constant):
//  - the uint8 quantisation against hand-computed boundary values and against torch itself
//    (the official save_video arithmetic run by WAN_PYTHON);
//  - CRC-32 / Adler-32 known vectors, our zlib streams inflated by Python's zlib;
//  - PNG files checked by Python (chunk CRCs, zlib, unfiltering) and decoded by ffmpeg, both exactly;
//  - .y4m parsed back here exactly, and decoded by ffmpeg close to the RGB input;
//  - .mp4 probed by ffprobe (h264, yuv420p, colour tags, frame count, size, fps, moov before mdat) and
//    decoded back by ffmpeg close to the input and to the official writer's ffmpeg command; the same
//    frames give the same bytes every time, with every core busy and the heap full of changing garbage;
//  - errors (extension, folders, sizes, no FFmpeg, a full disk) name the path and leave no file behind;
//  - outputs: unique temporary names, permissions kept, symlinks written through, PNG frames folders.
// ffmpeg, ffprobe and WAN_PYTHON are always installed by the setup script: a missing one FAILS a test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#include "core/error.h"
#include "formats/video.h"

namespace fs = std::filesystem;
using namespace wan;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void spit(const std::string& path, const void* data, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
}

uint64_t fresh_seed() {
  static const uint64_t s = std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
  return s;
}

// One scratch folder per test process, removed at exit.
const fs::path& scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("wan_test_video_" + std::to_string(getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    std::atexit([] { std::error_code ec; fs::remove_all(fs::temp_directory_path() /
                                                        ("wan_test_video_" + std::to_string(getpid())), ec); });
    return d;
  }();
  return dir;
}
std::string sp(const std::string& name) { return (scratch() / name).string(); }

// Runs a shell command; returns its exit status and stdout.
int run(const std::string& cmd, std::string* out = nullptr) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) s.append(buf, n);
  const int st = pclose(p);
  if (out) *out = s;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
void require_tool(const char* tool) {
  ASSERT_EQ(run(std::string("command -v ") + tool + " >/dev/null 2>&1"), 0)
      << tool << " is missing (the setup script installs it)";
}

// [3, F, H, W] in about [-1.1, 1.1]: per-channel moving gradients plus small noise, so content differs
// per pixel, per channel and per frame, and a few values fall outside [-1, 1] to exercise the clamp.
std::vector<float> make_video(int F, int H, int W, uint64_t seed, float noise = 0.03f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const float phase = u(rng) * 3.0f;
  std::vector<float> v(size_t(3) * F * H * W);
  for (int c = 0; c < 3; ++c)
    for (int f = 0; f < F; ++f)
      for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x) {
          const float g = std::sin(phase + 0.9f * c + 0.15f * f + 3.0f * x / W) * std::cos(2.0f * y / H - 0.4f * c);
          v[((size_t(c) * F + f) * H + y) * W + x] = 1.08f * g + noise * u(rng);
        }
  return v;
}

// Mean |a - b| over equal-size byte buffers.
double mean_abs_diff(const std::string& a, const std::vector<uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  if (a.size() != b.size()) return 1e9;
  double s = 0;
  for (size_t i = 0; i < b.size(); ++i) s += std::abs(int(uint8_t(a[i])) - int(b[i]));
  return s / double(b.size());
}

// ffmpeg-decoded frames of `file` as raw rgb24 bytes.
std::string decode_rgb24(const std::string& file) {
  const std::string raw = file + ".decoded.rgb";
  EXPECT_EQ(run("ffmpeg -v error -y -i '" + file + "' -f rawvideo -pix_fmt rgb24 '" + raw + "'"), 0) << file;
  return slurp(raw);
}

nlohmann::json ffprobe_stream(const std::string& file) {
  std::string out;
  const int rc = run("ffprobe -v error -count_frames -select_streams v:0 -show_entries "
                     "stream=codec_name,pix_fmt,color_range,color_space,color_transfer,color_primaries,width,height,"
                     "nb_read_frames,avg_frame_rate,r_frame_rate "
                     "-of json '" + file + "'", &out);
  EXPECT_EQ(rc, 0) << out;
  const auto j = nlohmann::json::parse(out, nullptr, false);
  if (j.is_discarded() || !j.contains("streams") || j["streams"].empty()) {
    ADD_FAILURE() << "ffprobe output: " << out;
    return nlohmann::json::object();
  }
  return j["streams"][0];
}

// Expects `fn` to throw a wan::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const wan::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

// No temporary file (".<name>.XXXXXX.tmp", or the old "<stem>.tmp.<ext>") anywhere in the scratch folder.
void expect_no_temp_files() {
  for (const auto& e : fs::recursive_directory_iterator(scratch())) {
    const std::string n = e.path().filename().string();
    EXPECT_FALSE(n.find(".tmp.") != std::string::npos || (n[0] == '.' && n.ends_with(".tmp"))) << e.path();
  }
}

float bits(uint32_t b) { return std::bit_cast<float>(b); }

}  // namespace

// ---- quantisation -----------------------------------------------------------------------------------

TEST(VideoQuantize, HandComputedValues) {
  // Expected values worked out by hand in float32: (x + 1) / 2 * 255, truncated.
  EXPECT_EQ(quantize_unit_to_u8(1.0f), 255);
  EXPECT_EQ(quantize_unit_to_u8(-1.0f), 0);
  EXPECT_EQ(quantize_unit_to_u8(0.0f), 127);    // 127.5
  EXPECT_EQ(quantize_unit_to_u8(0.5f), 191);    // 191.25
  EXPECT_EQ(quantize_unit_to_u8(-0.5f), 63);    // 63.75
  EXPECT_EQ(quantize_unit_to_u8(0.99f), 253);   // 253.725
  EXPECT_EQ(quantize_unit_to_u8(1.5f), 255);    // clamped, not 318
  EXPECT_EQ(quantize_unit_to_u8(-3.0f), 0);     // clamped, not -255
  EXPECT_EQ(quantize_unit_to_u8(INFINITY), 255);
  EXPECT_EQ(quantize_unit_to_u8(-INFINITY), 0);
  EXPECT_EQ(quantize_unit_to_u8(NAN), 0);
  // x = float(1/255) = 0x3B808081: (1 + x) rounds to 1.00392163, /2 * 255 = exactly 128.0 -> 128;
  // two ulps lower, 0x3B80807F, gives 127.99999237 -> 127 (truncation, not rounding).
  EXPECT_EQ(quantize_unit_to_u8(bits(0x3B808081u)), 128);
  EXPECT_EQ(quantize_unit_to_u8(bits(0x3B80807Fu)), 127);
  // x = float(2/255 - 1) = -0.99215686 (0xBF7EFEFE): 0.99999994 -> 0, not 1.
  EXPECT_EQ(quantize_unit_to_u8(bits(0xBF7EFEFEu)), 0);
  // Largest float below 1 (0x3F7FFFFE after the sum rounds): 254.99998 -> 254.
  EXPECT_EQ(quantize_unit_to_u8(bits(0x3F7FFFFEu)), 254);
  EXPECT_EQ(quantize_unit_to_u8(0.996078372f), 254);  // 254.5
}

TEST(VideoQuantize, MatchesTorchAndLayout) {
  ASSERT_TRUE(fs::exists(WAN_PYTHON)) << "WAN_PYTHON missing: " << WAN_PYTHON;
  const int F = 3, H = 9, W = 31;
  std::vector<float> v = make_video(F, H, W, fresh_seed(), 0.3f);
  // Overwrite a stretch with every quantisation boundary 2k/255 - 1 and its float neighbours.
  std::vector<float> extra;
  for (int k = 0; k <= 255; ++k) {
    const float b = 2.0f * float(k) / 255.0f - 1.0f;
    extra.insert(extra.end(), {std::nextafter(b, -2.0f), b, std::nextafter(b, 2.0f)});
  }
  extra.insert(extra.end(), {1.0f, -1.0f, 0.0f, -0.0f, 1e-30f, INFINITY, -INFINITY, 7.0f, -7.0f});
  ASSERT_LE(extra.size(), v.size());
  std::copy(extra.begin(), extra.end(), v.begin() + 5);

  const std::string fin = sp("q_in.f32"), fout = sp("q_out.u8"), script = sp("quant.py");
  spit(fin, v.data(), v.size() * 4);
  // The official arithmetic: save_video's clamp, make_grid(normalize=True, value_range=(-1, 1)), * 255, uint8.
  const std::string py =
      "import sys, numpy as np, torch\n"
      "t = torch.from_numpy(np.fromfile(sys.argv[1], dtype=np.float32))\n"
      "t = t.clamp(-1, 1)\n"
      "low, high = -1, 1\n"
      "t = t.clone().clamp_(min=low, max=high).sub_(low).div_(max(high - low, 1e-5))\n"
      "(t * 255).type(torch.uint8).numpy().tofile(sys.argv[2])\n";
  spit(script, py.data(), py.size());
  ASSERT_EQ(run(std::string(WAN_PYTHON) + " " + script + " " + fin + " " + fout), 0);
  const std::string ref = slurp(fout);
  ASSERT_EQ(ref.size(), v.size());

  const std::vector<uint8_t> rgb = video_to_rgb8(v.data(), F, H, W);
  ASSERT_EQ(rgb.size(), v.size());
  int mismatches = 0;
  for (int c = 0; c < 3; ++c)
    for (int f = 0; f < F; ++f)
      for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x) {
          const size_t src = ((size_t(c) * F + f) * H + y) * W + x;
          const size_t dst = ((size_t(f) * H + y) * W + x) * 3 + c;  // [F, H, W, 3]
          const uint8_t want = uint8_t(ref[src]);
          if (rgb[dst] != want && ++mismatches <= 5)
            ADD_FAILURE() << "value " << v[src] << ": torch " << int(want) << ", ours " << int(rgb[dst]);
          EXPECT_EQ(quantize_unit_to_u8(v[src]), rgb[dst]);
        }
  EXPECT_EQ(mismatches, 0);
}

// ---- checksums and deflate --------------------------------------------------------------------------

TEST(VideoPng, ChecksumKnownVectors) {
  const std::string a = "123456789", w = "Wikipedia";
  EXPECT_EQ(video_detail::crc32(reinterpret_cast<const uint8_t*>(a.data()), a.size()), 0xCBF43926u);
  EXPECT_EQ(video_detail::adler32(reinterpret_cast<const uint8_t*>(w.data()), w.size()), 0x11E60398u);
  EXPECT_EQ(video_detail::crc32(nullptr, 0), 0u);
  EXPECT_EQ(video_detail::adler32(nullptr, 0), 1u);
  // Incremental use equals one pass (PNG chunks are checksummed in pieces).
  const auto* p = reinterpret_cast<const uint8_t*>(a.data());
  EXPECT_EQ(video_detail::crc32(p + 4, 5, video_detail::crc32(p, 4)), 0xCBF43926u);
  // Adler-32 over more than 5552 bytes of 0xFF exercises the deferred modulo.
  std::vector<uint8_t> ff(100000, 0xFF);
  uint32_t aa = 1, bb = 0;
  for (uint8_t byte : ff) aa = (aa + byte) % 65521, bb = (bb + aa) % 65521;
  EXPECT_EQ(video_detail::adler32(ff.data(), ff.size()), (bb << 16) | aa);
}

TEST(VideoPng, ZlibStreamsInflateInPython) {
  ASSERT_TRUE(fs::exists(WAN_PYTHON)) << "WAN_PYTHON missing: " << WAN_PYTHON;
  std::mt19937_64 rng(fresh_seed());
  // Random bytes, a long run, repeats at distances up to the 32 KiB window; > 64 KiB so several
  // segments (and stored/fixed switches) occur.
  std::vector<uint8_t> data;
  for (int i = 0; i < 30000; ++i) data.push_back(uint8_t(rng()));
  data.insert(data.end(), 5000, uint8_t(7));
  while (data.size() < 75000) {  // runs of 3..300 bytes copied from up to 32 KiB back (overlapping too)
    const size_t dist = 1 + size_t(rng() % 32768), len = 3 + size_t(rng() % 298);
    for (size_t k = 0; k < len; ++k) data.push_back(data[data.size() - dist]);
  }
  for (int i = 0; i < 20000; ++i) data.push_back(uint8_t(i % 251));
  const std::vector<std::vector<uint8_t>> inputs = {data, {}, {42}, {1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3}};
  const std::string script = sp("inflate.py");
  const std::string py =
      "import sys, zlib\n"
      "z = open(sys.argv[1], 'rb').read(); raw = open(sys.argv[2], 'rb').read()\n"
      "sys.exit(0 if zlib.decompress(z) == raw else 3)\n";
  spit(script, py.data(), py.size());
  int idx = 0;
  for (const auto& in : inputs)
    for (bool stored : {false, true}) {
      const std::vector<uint8_t> z = video_detail::zlib_compress(in.data(), in.size(), stored);
      const std::string zf = sp(cat("z", idx, ".zlib")), rf = sp(cat("z", idx, ".raw"));
      ++idx;
      spit(zf, z.data(), z.size());
      spit(rf, in.data(), in.size());
      EXPECT_EQ(run(std::string(WAN_PYTHON) + " " + script + " " + zf + " " + rf), 0)
          << "input " << in.size() << " bytes, stored " << stored;
      if (!stored && in.size() == data.size()) {
        EXPECT_LT(z.size(), in.size() * 3 / 4) << "LZ77 found too few matches";
      }
    }
}

// ---- PNG ----------------------------------------------------------------------------------------------

TEST(VideoPng, SequenceNamesAndExactDecode) {
  ASSERT_TRUE(fs::exists(WAN_PYTHON)) << "WAN_PYTHON missing: " << WAN_PYTHON;
  require_tool("ffmpeg");
  const int F = 3, H = 37, W = 50;  // odd sizes are fine for PNG
  const std::vector<float> v = make_video(F, H, W, fresh_seed() + 1);
  const std::vector<uint8_t> rgb = video_to_rgb8(v.data(), F, H, W);
  fs::create_directories(sp("png"));
  const std::string out = sp("png/clip.png");
  write_video(out, v.data(), F, H, W, 16);
  const std::vector<std::string> names = png_sequence_paths(out, F);
  ASSERT_EQ(names.size(), size_t(F));
  EXPECT_EQ(names[0], sp("png/clip_00000.png"));
  EXPECT_EQ(names[2], sp("png/clip_00002.png"));
  EXPECT_FALSE(fs::exists(out));  // several frames: only the numbered files
  EXPECT_EQ(std::distance(fs::directory_iterator(sp("png")), fs::directory_iterator()), F);

  // Python's zlib checks every chunk CRC, the zlib stream and its Adler-32, then undoes the filters.
  const std::string script = sp("png_decode.py");
  const std::string py =
      "import sys, zlib, struct\n"
      "d = open(sys.argv[1], 'rb').read()\n"
      "assert d[:8] == b'\\x89PNG\\r\\n\\x1a\\n'\n"
      "p, idat, ihdr, end = 8, b'', None, False\n"
      "while p < len(d):\n"
      "  n, = struct.unpack('>I', d[p:p+4]); t = d[p+4:p+8]; body = d[p+8:p+8+n]\n"
      "  crc, = struct.unpack('>I', d[p+8+n:p+12+n])\n"
      "  assert zlib.crc32(t + body) == crc, t\n"
      "  if t == b'IHDR': ihdr = struct.unpack('>IIBBBBB', body)\n"
      "  if t == b'IDAT': idat += body\n"
      "  if t == b'IEND': end = True\n"
      "  p += 12 + n\n"
      "assert end and p == len(d)\n"
      "w, h, depth, ctype, comp, filt, inter = ihdr\n"
      "assert (depth, ctype, comp, filt, inter) == (8, 2, 0, 0, 0)\n"
      "raw = zlib.decompress(idat); s = w * 3; out = bytearray(); prev = bytearray(s)\n"
      "assert len(raw) == h * (s + 1)\n"
      "for y in range(h):\n"
      "  f = raw[y*(s+1)]; r = bytearray(raw[y*(s+1)+1:(y+1)*(s+1)])\n"
      "  for i in range(s):\n"
      "    a = r[i-3] if i >= 3 else 0; b = prev[i]; c = prev[i-3] if i >= 3 else 0\n"
      "    if f == 0: pr = 0\n"
      "    elif f == 1: pr = a\n"
      "    elif f == 2: pr = b\n"
      "    elif f == 3: pr = (a + b) // 2\n"
      "    elif f == 4:\n"
      "      q = a + b - c; pa, pb, pc = abs(q-a), abs(q-b), abs(q-c)\n"
      "      pr = a if pa <= pb and pa <= pc else (b if pb <= pc else c)\n"
      "    else: raise SystemExit('bad filter')\n"
      "    r[i] = (r[i] + pr) & 255\n"
      "  out += r; prev = r\n"
      "open(sys.argv[2], 'wb').write(bytes(out))\n";
  spit(script, py.data(), py.size());
  const size_t frame_bytes = size_t(H) * W * 3;
  for (int f = 0; f < F; ++f) {
    const std::vector<uint8_t> want(rgb.begin() + f * frame_bytes, rgb.begin() + (f + 1) * frame_bytes);
    const std::string dec = sp("png_frame.rgb");
    ASSERT_EQ(run(std::string(WAN_PYTHON) + " " + script + " " + names[f] + " " + dec), 0) << names[f];
    EXPECT_TRUE(slurp(dec) == std::string(want.begin(), want.end())) << "python decode of " << names[f];
    EXPECT_TRUE(decode_rgb24(names[f]) == std::string(want.begin(), want.end())) << "ffmpeg decode of " << names[f];
  }
  // Filtering + deflate must actually compress a smooth image (stored blocks would be > 100%).
  EXPECT_LT(fs::file_size(names[0]), frame_bytes * 9 / 10);
  expect_no_temp_files();
}

TEST(VideoPng, SingleFrameUsesTheGivenName) {
  require_tool("ffmpeg");
  const int H = 16, W = 24;
  const std::vector<float> v = make_video(1, H, W, fresh_seed() + 2);
  const std::string out = sp("single.png");
  write_video(out, v.data(), 1, H, W, 24);
  ASSERT_TRUE(fs::exists(out));
  EXPECT_FALSE(fs::exists(sp("single_00000.png")));
  const std::vector<uint8_t> rgb = video_to_rgb8(v.data(), 1, H, W);
  EXPECT_TRUE(decode_rgb24(out) == std::string(rgb.begin(), rgb.end()));
  // Overwriting an existing output is allowed and replaces it.
  const std::vector<float> v2 = make_video(1, H, W, fresh_seed() + 3);
  write_video(out, v2.data(), 1, H, W, 24);
  const std::vector<uint8_t> rgb2 = video_to_rgb8(v2.data(), 1, H, W);
  EXPECT_TRUE(decode_rgb24(out) == std::string(rgb2.begin(), rgb2.end()));
}

// ---- Y4M ----------------------------------------------------------------------------------------------

TEST(VideoY4m, YCbCrHandValues) {
  uint8_t y, cb, cr;
  rgb_to_ycbcr_full(0, 0, 0, &y, &cb, &cr);
  EXPECT_EQ(y, 0);
  EXPECT_EQ(cb, 128);
  EXPECT_EQ(cr, 128);
  rgb_to_ycbcr_full(255, 255, 255, &y, &cb, &cr);
  EXPECT_EQ(y, 255);
  EXPECT_EQ(cb, 128);
  EXPECT_EQ(cr, 128);
  rgb_to_ycbcr_full(77, 77, 77, &y, &cb, &cr);  // any grey stays grey
  EXPECT_EQ(y, 77);
  EXPECT_EQ(cb, 128);
  EXPECT_EQ(cr, 128);
  rgb_to_ycbcr_full(255, 0, 0, &y, &cb, &cr);  // Y 76.245, Cb 84.97, Cr 255.5 -> clamped
  EXPECT_EQ(y, 76);
  EXPECT_EQ(cb, 85);
  EXPECT_EQ(cr, 255);
  rgb_to_ycbcr_full(0, 255, 0, &y, &cb, &cr);  // Y 149.685, Cb 43.53, Cr 21.23
  EXPECT_EQ(y, 150);
  EXPECT_EQ(cb, 44);
  EXPECT_EQ(cr, 21);
  rgb_to_ycbcr_full(0, 0, 255, &y, &cb, &cr);  // Y 29.07, Cb 255.5 -> clamped, Cr 107.27
  EXPECT_EQ(y, 29);
  EXPECT_EQ(cb, 255);
  EXPECT_EQ(cr, 107);
  // Over all colours on a lattice: within rounding of the real-valued JFIF formula, and invertible to
  // within 2 levels (the 4:4:4 full-range claim).
  for (int r = 0; r < 256; r += 15)
    for (int g = 0; g < 256; g += 17)
      for (int b = 0; b < 256; b += 5) {
        rgb_to_ycbcr_full(uint8_t(r), uint8_t(g), uint8_t(b), &y, &cb, &cr);
        const double Y = 0.299 * r + 0.587 * g + 0.114 * b;
        const double U = std::clamp(128 + (b - Y) / 1.772, 0.0, 255.0), V = std::clamp(128 + (r - Y) / 1.402, 0.0, 255.0);
        EXPECT_LE(std::abs(y - Y), 0.5 + 1e-3);
        EXPECT_LE(std::abs(cb - U), 0.5 + 1e-3);
        EXPECT_LE(std::abs(cr - V), 0.5 + 1e-3);
        if (U > 0.5 && U < 254.5 && V > 0.5 && V < 254.5) {  // not clipped: the inverse recovers RGB
          const double R = y + 1.402 * (cr - 128), B = y + 1.772 * (cb - 128), G = (y - 0.299 * R - 0.114 * B) / 0.587;
          EXPECT_LE(std::abs(R - r), 2.0);
          EXPECT_LE(std::abs(G - g), 2.0);
          EXPECT_LE(std::abs(B - b), 2.0);
        }
      }
}

TEST(VideoY4m, ParsesBackExactly) {
  require_tool("ffmpeg");
  require_tool("ffprobe");
  const int F = 5, H = 20, W = 36, fps = 24;
  const std::vector<float> v = make_video(F, H, W, fresh_seed() + 4);
  const std::vector<uint8_t> rgb = video_to_rgb8(v.data(), F, H, W);
  const std::string out = sp("clip.Y4M");  // the extension is matched case-insensitively
  write_video(out, v.data(), F, H, W, fps);
  const std::string d = slurp(out);
  const std::string header = "YUV4MPEG2 W36 H20 F24:1 Ip A1:1 C444 XCOLORRANGE=FULL\n";
  ASSERT_EQ(d.substr(0, header.size()), header);
  const size_t plane = size_t(H) * W;
  ASSERT_EQ(d.size(), header.size() + F * (6 + 3 * plane));
  size_t p = header.size();
  for (int f = 0; f < F; ++f) {
    ASSERT_EQ(d.substr(p, 6), "FRAME\n") << "frame " << f;
    p += 6;
    for (size_t i = 0; i < plane; ++i) {
      const uint8_t* px = rgb.data() + (f * plane + i) * 3;
      uint8_t y, cb, cr;
      rgb_to_ycbcr_full(px[0], px[1], px[2], &y, &cb, &cr);
      ASSERT_EQ(uint8_t(d[p + i]), y) << "frame " << f << " pixel " << i;
      ASSERT_EQ(uint8_t(d[p + plane + i]), cb) << "frame " << f << " pixel " << i;
      ASSERT_EQ(uint8_t(d[p + 2 * plane + i]), cr) << "frame " << f << " pixel " << i;
    }
    p += 3 * plane;
  }
  // ffmpeg reads it as full-range 4:4:4 and converts back to nearly the same RGB.
  const nlohmann::json s = ffprobe_stream(out);
  EXPECT_EQ(s.value("nb_read_frames", ""), std::to_string(F));
  EXPECT_EQ(s.value("avg_frame_rate", ""), "24/1");
  EXPECT_EQ(s.value("pix_fmt", ""), "yuv444p");
  EXPECT_EQ(s.value("color_range", ""), "pc");  // full range, from XCOLORRANGE=FULL
  EXPECT_LT(mean_abs_diff(decode_rgb24(out), rgb), 1.0);
  expect_no_temp_files();
}

// ---- MP4 ----------------------------------------------------------------------------------------------

// Top-level MP4 box types in file order.
std::vector<std::string> mp4_boxes(const std::string& d) {
  std::vector<std::string> out;
  size_t p = 0;
  while (p + 8 <= d.size()) {
    uint64_t n = (uint64_t(uint8_t(d[p])) << 24) | (uint64_t(uint8_t(d[p + 1])) << 16) |
                 (uint64_t(uint8_t(d[p + 2])) << 8) | uint64_t(uint8_t(d[p + 3]));
    out.push_back(d.substr(p + 4, 4));
    if (n == 1 && p + 16 <= d.size()) {
      n = 0;
      for (int i = 0; i < 8; ++i) n = (n << 8) | uint8_t(d[p + 8 + i]);
    }
    if (n < 8) break;
    p += n;
  }
  return out;
}

TEST(VideoMp4, ProbesAndDecodesBack) {
  if (!video_have_ffmpeg()) GTEST_FAIL() << "this build has no FFmpeg; the setup script installs it";
  require_tool("ffmpeg");
  require_tool("ffprobe");
  struct Case { int F, H, W, fps; };
  // 17 frames at 16 fps (A14B-like), 13 at 24 fps (TI2V-like); sizes not multiples of 16.
  for (const Case c : {Case{17, 48, 72, 16}, Case{13, 38, 58, 24}}) {
    SCOPED_TRACE("F=" + std::to_string(c.F) + " fps=" + std::to_string(c.fps));
    const std::vector<float> v = make_video(c.F, c.H, c.W, fresh_seed() + 5 + c.F);
    const std::vector<uint8_t> rgb = video_to_rgb8(v.data(), c.F, c.H, c.W);
    const std::string out = sp("clip" + std::to_string(c.fps) + ".mp4");
    write_video(out, v.data(), c.F, c.H, c.W, c.fps);
    const nlohmann::json s = ffprobe_stream(out);
    EXPECT_EQ(s.value("codec_name", ""), "h264");
    EXPECT_EQ(s.value("pix_fmt", ""), "yuv420p");
    EXPECT_EQ(s.value("width", 0), c.W);
    EXPECT_EQ(s.value("height", 0), c.H);
    EXPECT_EQ(s.value("nb_read_frames", ""), std::to_string(c.F));
    EXPECT_EQ(s.value("avg_frame_rate", ""), std::to_string(c.fps) + "/1");
    EXPECT_EQ(s.value("r_frame_rate", ""), std::to_string(c.fps) + "/1");
    // Tagged with what swscale's conversion does (BT.601 matrix, limited range) and the RGB's own
    // primaries and transfer, so players need not guess; the decode below honours these tags.
    EXPECT_EQ(s.value("color_space", ""), "smpte170m");
    EXPECT_EQ(s.value("color_range", ""), "tv");
    EXPECT_EQ(s.value("color_primaries", ""), "bt709");
    EXPECT_EQ(s.value("color_transfer", ""), "bt709");
    // faststart: the moov box precedes the media data.
    const std::vector<std::string> boxes = mp4_boxes(slurp(out));
    const auto moov = std::find(boxes.begin(), boxes.end(), "moov"), mdat = std::find(boxes.begin(), boxes.end(), "mdat");
    ASSERT_TRUE(moov != boxes.end() && mdat != boxes.end());
    EXPECT_LT(moov - boxes.begin(), mdat - boxes.begin());

    // The content survives: decoded frames are within a few levels of the input on average.
    const std::string decoded = decode_rgb24(out);
    const double err = mean_abs_diff(decoded, rgb);
    EXPECT_LT(err, 3.0);
    // ... and each frame is itself (not a neighbour, not a duplicate): its error is well below the
    // error against the next frame.
    const size_t fb = size_t(c.H) * c.W * 3;
    for (int f = 0; f + 1 < c.F && decoded.size() == rgb.size(); ++f) {
      const std::vector<uint8_t> same(rgb.begin() + f * fb, rgb.begin() + (f + 1) * fb);
      const std::vector<uint8_t> next(rgb.begin() + (f + 1) * fb, rgb.begin() + (f + 2) * fb);
      const std::string got = decoded.substr(f * fb, fb);
      EXPECT_LT(mean_abs_diff(got, same) * 2, mean_abs_diff(got, next)) << "frame " << f;
    }

    // The official writer's ffmpeg command on the same RGB frames (imageio-ffmpeg, quality=8) gives the
    // same fidelity and nearly the same pixels: same colour conversion, same encoder settings. (Not the
    // same bytes: the CLI runs another thread count and x264's AVX-512 kernels, and writes no colour tags.)
    const std::string raw = sp("ref_in.rgb"), ref = sp("ref" + std::to_string(c.fps) + ".mp4");
    spit(raw, rgb.data(), rgb.size());
    ASSERT_EQ(run("ffmpeg -v error -y -f rawvideo -vcodec rawvideo -s " + std::to_string(c.W) + "x" +
                  std::to_string(c.H) + " -pix_fmt rgb24 -r " + std::to_string(c.fps) + ".00 -i '" + raw +
                  "' -an -vcodec libx264 -pix_fmt yuv420p -crf 10 '" + ref + "'"), 0);
    const std::string ref_dec = decode_rgb24(ref);
    EXPECT_LT(mean_abs_diff(decoded, std::vector<uint8_t>(ref_dec.begin(), ref_dec.end())), 2.0);
    EXPECT_LT(std::abs(err - mean_abs_diff(ref_dec, rgb)), 0.3) << "ours " << err;
  }
  expect_no_temp_files();
}

// ---- errors -------------------------------------------------------------------------------------------

TEST(VideoErrors, ClearMessagesNamingThePath) {
  const int F = 2, H = 8, W = 10;
  const std::vector<float> v = make_video(F, H, W, fresh_seed() + 9);
  expect_error([&] { write_video(sp("a.avi"), v.data(), F, H, W, 16); }, {"a.avi", ".mp4", ".y4m", ".png"});
  expect_error([&] { write_video(sp("noext"), v.data(), F, H, W, 16); }, {"noext", "accepted"});
  expect_error([&] { write_video(sp("missing/dir/a.y4m"), v.data(), F, H, W, 16); },
               {"missing/dir/a.y4m", "does not exist"});
  spit(sp("plainfile"), "x", 1);
  expect_error([&] { write_video(sp("plainfile/a.png"), v.data(), F, H, W, 16); }, {"plainfile/a.png", "not a folder"});
  fs::create_directories(sp("isdir.y4m"));
  expect_error([&] { write_video(sp("isdir.y4m"), v.data(), F, H, W, 16); }, {"isdir.y4m", "folder"});
  // The kernel refuses new files in /proc even for root, so this is "unwritable" everywhere.
  expect_error([&] { write_video("/proc/wan_video_test.y4m", v.data(), F, H, W, 16); },
               {"/proc/wan_video_test.y4m", "cannot create"});
  expect_error([&] { write_video(sp("z.y4m"), v.data(), 0, H, W, 16); }, {"z.y4m", "no frames"});
  expect_error([&] { write_video(sp("z.y4m"), v.data(), F, 0, W, 16); }, {"z.y4m", "frame size"});
  expect_error([&] { write_video(sp("z.y4m"), v.data(), F, H, -4, 16); }, {"z.y4m", "frame size"});
  expect_error([&] { write_video(sp("z.y4m"), v.data(), F, H, W, 0); }, {"z.y4m", "fps"});
  expect_error([&] { write_video(sp("z.y4m"), nullptr, F, H, W, 16); }, {"z.y4m", "null"});
  if (video_have_ffmpeg()) {
    expect_error([&] { write_video(sp("odd.mp4"), v.data(), F, 7, W, 16); }, {"odd.mp4", "even", "10x7"});
  }
  EXPECT_FALSE(fs::exists(sp("z.y4m")));
  EXPECT_FALSE(fs::exists(sp("odd.mp4")));
  EXPECT_THROW(video_to_rgb8(v.data(), 0, H, W), wan::Error);
  EXPECT_THROW(video_to_rgb8(nullptr, F, H, W), wan::Error);
  expect_no_temp_files();
}

TEST(VideoErrors, NoFfmpegBranch) {
  const int F = 2, H = 8, W = 10;
  const std::vector<float> v = make_video(F, H, W, fresh_seed() + 10);
  VideoWriteOptions opt;
  opt.disable_ffmpeg = true;
  expect_error([&] { write_video(sp("noff.mp4"), v.data(), F, H, W, 16, opt); }, {"noff.mp4", "FFmpeg", ".y4m"});
  EXPECT_FALSE(fs::exists(sp("noff.mp4")));
  // The other formats need no FFmpeg.
  write_video(sp("noff.y4m"), v.data(), F, H, W, 16, opt);
  EXPECT_TRUE(fs::exists(sp("noff.y4m")));
#if defined(WAN_HAVE_FFMPEG) && WAN_HAVE_FFMPEG
  EXPECT_TRUE(video_have_ffmpeg());
#else
  EXPECT_FALSE(video_have_ffmpeg());
  expect_error([&] { write_video(sp("noff2.mp4"), v.data(), F, H, W, 16); }, {"noff2.mp4", "FFmpeg"});
#endif
}

// Runs fn with the process's file-size limit at `bytes` (write(2) then fails with EFBIG, the path a full
// disk takes; SIGXFSZ ignored meanwhile).
template <typename Fn>
void with_file_size_limit(rlim_t bytes, Fn&& fn) {
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = bytes;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  fn();
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
}

TEST(VideoErrors, FailuresLeaveNothingBehind) {
  const int F = 6, H = 8, W = 10;
  const std::vector<float> v = make_video(F, H, W, fresh_seed() + 11);
  // A folder where frame 3 of a PNG sequence must go: refused before any frame is written.
  fs::create_directories(sp("seq/s_00003.png/blocker"));
  expect_error([&] { write_video(sp("seq/s.png"), v.data(), F, H, W, 16); }, {"seq/s.png", "already holds 1 frame"});
  VideoWriteOptions over;
  over.overwrite_frames = true;
  expect_error([&] { write_video(sp("seq/s.png"), v.data(), F, H, W, 16, over); }, {"s_00003.png", "is a folder"});
  size_t left = 0;
  for (const auto& e : fs::directory_iterator(sp("seq"))) left += e.path().filename() != "s_00003.png";
  EXPECT_EQ(left, 0u);
  // A write that fails part-way removes its temporary file, and the file it was to replace keeps its bytes.
  const int F2 = 9, H2 = 64, W2 = 96;
  const std::vector<float> big = make_video(F2, H2, W2, fresh_seed() + 12, 0.3f);
  std::vector<std::string> names = {"full.y4m", "full.png"};
  if (video_have_ffmpeg()) names.push_back("full.mp4");
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    spit(sp(name), "old", 3);
    const int frames = name.ends_with(".png") ? 1 : F2;
    with_file_size_limit(4096, [&] {
      expect_error([&] { write_video(sp(name), big.data(), frames, H2, W2, 16); }, {name, std::strerror(EFBIG)});
    });
    EXPECT_EQ(slurp(sp(name)), "old");
  }
  fs::remove_all(sp("seq"));
  expect_no_temp_files();
}

// ---- output files: temporary names, permissions, symlinks, PNG frames ---------------------------------

TEST(VideoOutput, TemporaryNamesAreUniqueAndNeverAUsersFile) {
  const int F = 3, H = 8, W = 10;
  const std::vector<float> v = make_video(F, H, W, fresh_seed() + 20);
  // The old fixed temporary names: a user's own file there is left alone, a folder there is no obstacle.
  spit(sp("mine.tmp.y4m"), "user data", 9);
  fs::create_directories(sp("dir.tmp.y4m/x"));
  write_video(sp("mine.y4m"), v.data(), F, H, W, 16);
  write_video(sp("dir.y4m"), v.data(), F, H, W, 16);
  EXPECT_EQ(slurp(sp("mine.tmp.y4m")), "user data");
  EXPECT_EQ(slurp(sp("mine.y4m")), slurp(sp("dir.y4m")));
  // Four writers of one target at once: each has its own temporary file, and the target ends up as one
  // of the complete videos, never a mix.
  std::vector<std::vector<float>> vids;
  std::vector<std::string> want;
  for (int i = 0; i < 4; ++i) {
    vids.push_back(make_video(F, H, W, fresh_seed() + 21 + i));
    write_video(sp("ref" + std::to_string(i) + ".y4m"), vids.back().data(), F, H, W, 16);
    want.push_back(slurp(sp("ref" + std::to_string(i) + ".y4m")));
  }
  for (int round = 0; round < 5; ++round) {
    std::vector<std::thread> ts;
    std::atomic<int> failures{0};
    for (int i = 0; i < 4; ++i)
      ts.emplace_back([&, i] {
        try {
          write_video(sp("same.y4m"), vids[size_t(i)].data(), F, H, W, 16);
        } catch (const wan::Error&) {
          ++failures;
        }
      });
    for (auto& t : ts) t.join();
    EXPECT_EQ(failures.load(), 0);
    EXPECT_NE(std::find(want.begin(), want.end(), slurp(sp("same.y4m"))), want.end()) << "round " << round;
  }
  fs::remove_all(sp("dir.tmp.y4m"));
  fs::remove(sp("mine.tmp.y4m"));
  expect_no_temp_files();
}

TEST(VideoOutput, KeepsPermissionsAndWritesThroughSymlinks) {
  const int F = 2, H = 8, W = 10;
  const std::vector<float> v = make_video(F, H, W, fresh_seed() + 30);
  // A new file: 0666 minus the umask. A replaced file: its own permission bits.
  const mode_t old_mask = ::umask(027);
  write_video(sp("new.y4m"), v.data(), F, H, W, 16);
  ::umask(old_mask);
  EXPECT_EQ(fs::status(sp("new.y4m")).permissions(), fs::perms(0640));
  spit(sp("kept.y4m"), "old", 3);
  fs::permissions(sp("kept.y4m"), fs::perms(0604));
  write_video(sp("kept.y4m"), v.data(), F, H, W, 16);
  EXPECT_EQ(fs::status(sp("kept.y4m")).permissions(), fs::perms(0604));
  EXPECT_EQ(slurp(sp("kept.y4m")), slurp(sp("new.y4m")));
  // A symlink is written through: the file it points to (in another folder) is replaced, the link stays.
  fs::create_directories(sp("real"));
  spit(sp("real/target.y4m"), "old", 3);
  fs::create_symlink(sp("real/target.y4m"), sp("link.y4m"));
  write_video(sp("link.y4m"), v.data(), F, H, W, 16);
  EXPECT_TRUE(fs::is_symlink(sp("link.y4m")));
  EXPECT_EQ(slurp(sp("real/target.y4m")), slurp(sp("new.y4m")));
  // Refused: a dangling link (nothing is created at its target), a link to a folder, a device.
  fs::create_symlink(sp("real/missing.y4m"), sp("dangling.y4m"));
  expect_error([&] { write_video(sp("dangling.y4m"), v.data(), F, H, W, 16); }, {"dangling.y4m", "does not exist"});
  EXPECT_FALSE(fs::exists(sp("real/missing.y4m")));
  fs::create_symlink(sp("real"), sp("dirlink.y4m"));
  expect_error([&] { write_video(sp("dirlink.y4m"), v.data(), F, H, W, 16); }, {"dirlink.y4m", "folder"});
  fs::create_symlink("/dev/null", sp("null.y4m"));
  expect_error([&] { write_video(sp("null.y4m"), v.data(), F, H, W, 16); }, {"null.y4m", "not a regular file"});
  expect_no_temp_files();
}

TEST(VideoPng, FramesOfAnEarlierSequenceAreRefusedOrReplaced) {
  const int H = 8, W = 10;
  const std::vector<float> six = make_video(6, H, W, fresh_seed() + 40), three = make_video(3, H, W, fresh_seed() + 41);
  fs::create_directories(sp("frames"));
  write_video(sp("frames/f.png"), six.data(), 6, H, W, 16);
  for (const char* other : {"g_00001.png", "f_1.png", "f_00001.txt", "f.png"})
    spit(sp(std::string("frames/") + other), "x", 1);
  std::map<std::string, std::string> before;
  for (const auto& e : fs::directory_iterator(sp("frames"))) before[e.path().filename().string()] = slurp(e.path());
  auto now = [&] {
    std::map<std::string, std::string> m;
    for (const auto& e : fs::directory_iterator(sp("frames"))) m[e.path().filename().string()] = slurp(e.path());
    return m;
  };
  // Not asked: refused, nothing changes (the pattern's extension is matched without regard to case).
  expect_error([&] { write_video(sp("frames/f.png"), three.data(), 3, H, W, 16); },
               {"frames/f.png", "already holds 6 frame(s)", "f_00000.png"});
  expect_error([&] { write_video(sp("frames/f.PNG"), three.data(), 3, H, W, 16); }, {"already holds 6"});
  EXPECT_EQ(now(), before);
  // Asked: the three new frames replace the first three, the three the new sequence does not reach go.
  VideoWriteOptions over;
  over.overwrite_frames = true;
  write_video(sp("frames/f.png"), three.data(), 3, H, W, 16, over);
  const std::vector<uint8_t> rgb = video_to_rgb8(three.data(), 3, H, W);
  std::map<std::string, std::string> after = now();
  for (int f = 0; f < 3; ++f) {
    const std::string name = "f_0000" + std::to_string(f) + ".png";
    const std::vector<uint8_t> png = video_detail::encode_png_rgb8(rgb.data() + size_t(f) * H * W * 3, H, W);
    EXPECT_EQ(after[name], std::string(png.begin(), png.end()));
    EXPECT_NE(after[name], before[name]);
  }
  for (const char* gone : {"f_00003.png", "f_00004.png", "f_00005.png"}) EXPECT_EQ(after.count(gone), 0u) << gone;
  for (const char* other : {"g_00001.png", "f_1.png", "f_00001.txt", "f.png"}) EXPECT_EQ(after[other], "x") << other;
  EXPECT_EQ(existing_png_frames(sp("frames/f.png")).size(), 3u);
  // One frame is written under the given name; with the option, the earlier sequence's frames go.
  write_video(sp("frames/f.png"), three.data(), 1, H, W, 16, over);
  EXPECT_TRUE(existing_png_frames(sp("frames/f.png")).empty());
  EXPECT_NE(slurp(sp("frames/f.png")), "x");
  fs::remove_all(sp("frames"));
  expect_no_temp_files();
}

// ---- MP4 determinism --------------------------------------------------------------------------------

TEST(VideoMp4, SameFramesGiveTheSameBytesUnderLoad) {
  if (!video_have_ffmpeg()) GTEST_FAIL() << "this build has no FFmpeg; the setup script installs it";
  // Frames tall enough for several x264 threads. Meanwhile other threads keep every core busy and churn
  // the heap with ever-different bytes, as a busy run leaves freed memory behind: the bytes must not
  // move (x264's AVX-512 MB-tree kernels made them depend on such leftovers).
  const int F = 17, H = 240, W = 416;
  // Noise over moving ramps: content on which x264's motion search and MB-tree have work to do.
  std::mt19937_64 gen(fresh_seed() + 50);
  std::vector<uint8_t> rgb(size_t(F) * H * W * 3);
  for (int f = 0; f < F; ++f)
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x) {
        uint8_t* p = &rgb[((size_t(f) * H + y) * W + x) * 3];
        p[0] = uint8_t(x * 4 + f * 3);
        p[1] = uint8_t((gen() & 15) + y * 2);
        p[2] = uint8_t(gen());
      }
  std::atomic<bool> stop{false};
  std::vector<std::thread> load;
  const unsigned n = std::clamp(std::thread::hardware_concurrency(), 2u, 16u);
  for (unsigned i = 0; i < n; ++i)
    load.emplace_back([&stop, i] {
      std::mt19937_64 rng(fresh_seed() + i);
      while (!stop.load()) {
        const size_t bytes = 1024 + rng() % (size_t(4) << 20);
        void* p = std::malloc(bytes);
        if (p) std::memset(p, int(rng() & 255), bytes);
        std::free(p);
      }
    });
  std::string first;
  for (int rep = 0; rep < 6; ++rep) {
    {  // leave fresh garbage in freed memory right before each encode, as well
      std::mt19937_64 rng(fresh_seed() + 100 + rep);
      std::vector<std::vector<uint8_t>> junk;
      for (int k = 0; k < 64; ++k) junk.emplace_back(4096 + rng() % 262144, uint8_t(rng()));
    }
    const std::string out = sp("det" + std::to_string(rep) + ".mp4");
    write_video_rgb8(out, rgb.data(), F, H, W, 16);
    const std::string bytes = slurp(out);
    if (rep == 0) first = bytes;
    else EXPECT_TRUE(bytes == first) << "encode " << rep << " differs from encode 0 (" << bytes.size() << " vs "
                                     << first.size() << " bytes)";
  }
  stop = true;
  for (auto& t : load) t.join();
  EXPECT_GT(first.size(), 1000u);
  // No version string or date of the libraries in the container.
  EXPECT_EQ(first.find("Lavf"), std::string::npos);
  expect_no_temp_files();
}
