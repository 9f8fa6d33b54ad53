// Image input (formats/image.h) and preprocessing ops (ops/image_ops.h) against the reference stack.
// Fixtures: tests/fixtures/image, written by tools/make_image_fixtures.py (Pillow, torch CPU); see its
// README. Criteria:
//  - lossless formats (PNG variants, 16-bit PNG, lossless WebP, PPM/PGM) equal Pillow's decode exactly;
//  - JPEG (4:2:0, 4:2:2, 4:4:4, progressive, grey, CMYK, EXIF orientations 1..8 in both byte orders) and
//    lossy WebP are within kJpegMaxDiff levels of Pillow's decode, mean within kJpegMeanDiff (IDCT and
//    colour-matrix rounding; the chroma upsampling is libjpeg's own); the measured values are printed;
//  - bicubic equals torch's F.interpolate (max |diff| <= 1e-6 required, bit-identical measured) and
//    Lanczos equals PIL's resize bit for bit; to_tensor equals TF.to_tensor(...).sub_(0.5).div_(0.5);
//  - every malformed input is one wan::Error line naming the file; size bombs are refused from the header.
// Tests that decode through FFmpeg skip in builds without it (WAN_HAVE_FFMPEG); PPM/PGM, the header
// checks and the errors run everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/image.h"
#include "formats/safetensors.h"
#include "ops/image_ops.h"
#include "test_util.h"

namespace wan {
namespace {

const std::string kDir = std::string(WAN_FIXTURES) + "/image/";
// Lossy decodes vs Pillow, levels of 255: max over all samples and mean. Measured (FFmpeg 5.1, Pillow
// 13.0 / libjpeg-turbo): YCbCr JPEG max 3, mean <= 0.06 (IDCT and colour-matrix rounding); CMYK max 2,
// mean 1.0 (FFmpeg rounds its CMYK -> RGB one level differently from Pillow); lossy WebP max 2, mean 0.08.
constexpr int kJpegMaxDiff = 4;
constexpr double kJpegMeanDiff = 0.15;
constexpr double kCmykMeanDiff = 1.2;

#define SKIP_WITHOUT_FFMPEG() \
  if (!image_have_ffmpeg()) GTEST_SKIP() << "this build has no FFmpeg (WAN_HAVE_FFMPEG): only PPM/PGM decode"

const SafetensorsFile& expected() {
  static const std::shared_ptr<SafetensorsFile> f = SafetensorsFile::open(kDir + "expected.safetensors");
  return *f;
}

RgbImage expected_image(const std::string& key) {
  const Tensor t = expected().get(key);
  EXPECT_EQ(t.dtype(), DType::U8) << key;
  EXPECT_EQ(t.ndim(), 3) << key;
  RgbImage im;
  im.height = static_cast<int>(t.dim(0));
  im.width = static_cast<int>(t.dim(1));
  const auto* p = static_cast<const uint8_t*>(t.data());
  im.rgb.assign(p, p + t.numel());
  return im;
}

struct Diff {
  int max = 0;
  double mean = 0;
};

Diff diff(const RgbImage& a, const RgbImage& b) {
  Diff d;
  if (a.width != b.width || a.height != b.height || a.rgb.size() != b.rgb.size()) return {1 << 20, 1e9};
  double sum = 0;
  for (size_t i = 0; i < a.rgb.size(); ++i) {
    const int e = std::abs(int(a.rgb[i]) - int(b.rgb[i]));
    d.max = std::max(d.max, e);
    sum += e;
  }
  d.mean = sum / static_cast<double>(a.rgb.size());
  return d;
}

void expect_exact(const std::string& file, const ImageReadOptions& opt = {}) {
  const RgbImage got = read_image(kDir + file, opt);
  const RgbImage want = expected_image("decode/" + file);
  ASSERT_EQ(got.width, want.width) << file;
  ASSERT_EQ(got.height, want.height) << file;
  ASSERT_EQ(got.rgb.size(), size_t(got.width) * got.height * 3) << file;
  const Diff d = diff(got, want);
  EXPECT_EQ(d.max, 0) << file << ": max |diff| " << d.max << ", mean " << d.mean;
}

Diff expect_lossy_close(const std::string& file, double mean_limit = kJpegMeanDiff) {
  const RgbImage got = read_image(kDir + file);
  const RgbImage want = expected_image("decode/" + file);
  EXPECT_EQ(got.width, want.width) << file;
  EXPECT_EQ(got.height, want.height) << file;
  const Diff d = diff(got, want);
  EXPECT_LE(d.max, kJpegMaxDiff) << file;
  EXPECT_LE(d.mean, mean_limit) << file;
  return d;
}

std::string error_reading(const std::string& path, const ImageReadOptions& opt = {}) {
  return test::error_of([&] { read_image(path, opt); });
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// ---- lossless decodes -------------------------------------------------------------------------------

TEST(ImageDecode, PpmPgmEqualPillow) {
  for (const char* f : {"rgb.ppm", "grey.pgm", "rgb16.ppm", "rgb15.ppm", "grey1000.pgm"}) expect_exact(f);
  // The same pixels as the PNG they were written from.
  EXPECT_EQ(read_image(kDir + "rgb.ppm").rgb, expected_image("decode/rgb.png").rgb);
}

TEST(ImageDecode, PpmWorksWithoutFfmpeg) {
  ImageReadOptions opt;
  opt.disable_ffmpeg = true;
  expect_exact("rgb.ppm", opt);
  expect_exact("rgb16.ppm", opt);
}

TEST(ImageDecode, PngVariantsEqualPillow) {
  SKIP_WITHOUT_FFMPEG();
  for (const char* f : {"rgb.png", "rgba.png", "grey.png", "grey_alpha.png", "palette.png", "bilevel.png",
                        "rgb16.png", "grey16.png"})
    expect_exact(f);
}

// 16 -> 8 bits keeps the high byte (v >> 8), as Pillow's "RGB;16B" unpacker does.
TEST(ImageDecode, SixteenBitKeepsHighByte) {
  SKIP_WITHOUT_FFMPEG();
  const RgbImage im = read_image(kDir + "rgb16.png");
  const int want[6] = {0, 0, 0, 0, 128, 255};  // from 0, 127, 128, 255, 32895, 65535 (tools/make_image_fixtures.py)
  for (int x = 0; x < 6; ++x) EXPECT_EQ(im.rgb[x * 3], want[x]) << "x = " << x;
}

TEST(ImageDecode, WebpLosslessEqualsPillow) {
  SKIP_WITHOUT_FFMPEG();
  expect_exact("lossless.webp");
  expect_exact("orient3.webp");  // EXIF chunk, orientation 3
}

TEST(ImageDecode, PngExifOrientation) {
  SKIP_WITHOUT_FFMPEG();
  expect_exact("orient6.png");
  ImageReadOptions raw;
  raw.exif_orientation = false;
  const RgbImage stored = read_image(kDir + "orient6.png", raw);
  EXPECT_EQ(stored.width, 23);  // stored rotated; shown 37x23 after the transpose
  EXPECT_EQ(stored.height, 37);
}

TEST(ImageDecode, MemoryEqualsFile) {
  const std::string bytes = slurp(kDir + "rgb.ppm");
  const RgbImage a = decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "mem");
  EXPECT_EQ(a.rgb, read_image(kDir + "rgb.ppm").rgb);
}

// ---- JPEG ---------------------------------------------------------------------------------------------

TEST(ImageDecode, JpegAndLossyWebpCloseToPillow) {
  SKIP_WITHOUT_FFMPEG();
  // 37x23: odd sizes, so the chroma of 4:2:0 / 4:2:2 ends in half-covered samples.
  for (const char* f : {"q90_420.jpg", "q90_422.jpg", "q90_444.jpg", "progressive.jpg", "grey.jpg", "cmyk.jpg",
                        "lossy.webp"}) {
    const Diff d = expect_lossy_close(f, std::string(f) == "cmyk.jpg" ? kCmykMeanDiff : kJpegMeanDiff);
    std::printf("  %-16s vs Pillow: max |diff| %d, mean %.4f\n", f, d.max, d.mean);
  }
}

TEST(ImageDecode, JpegExifOrientationsMatchExifTranspose) {
  SKIP_WITHOUT_FFMPEG();
  int worst = 0;
  for (int o = 1; o <= 8; ++o) {
    for (const char* order : {"ii", "mm"}) {
      const std::string f = "orient" + std::to_string(o) + "_" + order + ".jpg";
      const Diff d = expect_lossy_close(f);
      worst = std::max(worst, d.max);
      // Every file shows the same upright 37x23 picture; the stored pixels are turned for o >= 5.
      const RgbImage shown = read_image(kDir + f);
      EXPECT_EQ(shown.width, 37) << f;
      ImageReadOptions raw;
      raw.exif_orientation = false;
      const RgbImage stored = read_image(kDir + f, raw);
      EXPECT_EQ(stored.width, o >= 5 ? 23 : 37) << f;
      if (o > 1) {
        EXPECT_GT(diff(stored, shown).mean, 10.0) << f << ": orientation not applied";
      }
    }
  }
  std::printf("  orientations 1..8 (II and MM): worst max |diff| %d\n", worst);
}

// ---- limits and errors --------------------------------------------------------------------------------

TEST(ImageErrors, BombRefusedFromHeaderQuickly) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_reading(kDir + "bomb.png");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(e.find("bomb.png: image is 100000x100000 pixels, over the limit of 16384 pixels a side"),
            std::string::npos) << e;
  EXPECT_LT(s, 1.0);
  const std::string ppm = test::error_of([] {
    const std::string b = "P6 100000 100000 255\n";
    decode_image(reinterpret_cast<const uint8_t*>(b.data()), b.size(), "bomb.ppm");
  });
  EXPECT_NE(ppm.find("bomb.ppm: image is 100000x100000"), std::string::npos) << ppm;
}

TEST(ImageErrors, CustomLimitsNameSizeAndLimit) {
  ImageReadOptions opt;
  opt.limits.max_side = 30;
  EXPECT_NE(error_reading(kDir + "rgb.ppm", opt).find("image is 37x23 pixels, over the limit of 30 pixels a side"),
            std::string::npos);
  opt.limits = {};
  opt.limits.max_pixels = 800;
  EXPECT_NE(error_reading(kDir + "rgb.ppm", opt).find("37x23 = 851 pixels, over the limit of 800 pixels"),
            std::string::npos);
  // From the PNG / JPEG / WebP headers, in every build.
  for (const char* f : {"rgb.png", "q90_420.jpg", "lossless.webp"})
    EXPECT_NE(error_reading(kDir + f, opt).find("over the limit of 800 pixels"), std::string::npos) << f;
  opt.limits = {};
  opt.limits.max_file_bytes = 100;
  EXPECT_NE(error_reading(kDir + "rgb.ppm", opt).find("over the limit of 100 bytes"), std::string::npos);
}

TEST(ImageErrors, ZeroSized) {
  EXPECT_NE(error_reading(kDir + "zero.png").find("zero.png: image has no pixels (0x5)"), std::string::npos);
  const std::string e = test::error_of([] {
    const std::string b = "P5 0 7 255\n";
    decode_image(reinterpret_cast<const uint8_t*>(b.data()), b.size(), "z.pgm");
  });
  EXPECT_NE(e.find("z.pgm: image has no pixels (0x7)"), std::string::npos) << e;
}

TEST(ImageErrors, FilesThatAreNotImages) {
  test::TempDir t("image");
  write_file(t / "empty.png", "");
  EXPECT_NE(error_reading(t / "empty.png").find("empty.png: empty file"), std::string::npos);
  EXPECT_NE(error_reading(t / "missing.png").find("missing.png: cannot open: No such file"), std::string::npos);
  EXPECT_NE(error_reading(t.str()).find(": is a directory, not an image file"), std::string::npos);
  const std::vector<uint8_t> noise = test::random_blob(4096);
  write_file(t / "noise.bin", std::string(noise.begin(), noise.end()));
  const std::string want_noise = image_have_ffmpeg() ? "noise.bin: not an image file" : "noise.bin: not an image";
  EXPECT_NE(error_reading(t / "noise.bin").find(want_noise), std::string::npos) << error_reading(t / "noise.bin");
  EXPECT_NE(error_reading(kDir + "not_an_image.txt").find("not_an_image.txt: not an image"), std::string::npos);
  // A user's path comes back escaped: the message stays one line.
  write_file(t / "a\nb.png", "");
  const std::string e = error_reading(t / "a\nb.png");
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  EXPECT_NE(e.find("a\\nb.png: empty file"), std::string::npos) << e;
}

TEST(ImageErrors, TruncatedAndMalformed) {
  EXPECT_NE(error_reading(kDir + "truncated.ppm").find("truncated.ppm: truncated PPM (P6): its 37x23 pixels need "
                                                        "2553 bytes, the file has 100"),
            std::string::npos)
      << error_reading(kDir + "truncated.ppm");
  for (const std::string b : {"P6 37 x 255\n", "P6 37 23\n", "P6 37 23 255", "P6 37 23 0\n", "P6 37 23 70000\n",
                              "P5 1234567890 1 255\n"}) {
    const std::string e = test::error_of([&] {
      decode_image(reinterpret_cast<const uint8_t*>(b.data()), b.size(), "bad.ppm");
    });
    EXPECT_EQ(e.rfind("bad.ppm: ", 0), 0u) << b << " -> " << e;
  }
  if (!image_have_ffmpeg()) {
    EXPECT_NE(error_reading(kDir + "truncated.png").find("a PNG image, but this build has no FFmpeg"),
              std::string::npos);
    return;
  }
  for (const char* f : {"truncated.png", "truncated.jpg"}) {
    const std::string e = error_reading(kDir + f);
    EXPECT_NE(e.find(std::string(f) + ": cannot decode the "), std::string::npos) << e;
    EXPECT_NE(e.find(" image, it is truncated or corrupt (FFmpeg: "), std::string::npos) << e;
  }
  // A video is not an image, even though FFmpeg could decode a frame of it.
  test::TempDir t("image");
  write_file(t / "clip.mp4", std::string("\0\0\0\x18" "ftypisom\0\0\x02\0isomiso2", 24) + std::string(64, '\0'));
  const std::string v = error_reading(t / "clip.mp4");
  EXPECT_NE(v.find("clip.mp4: not an image file (FFmpeg reads it as QuickTime / MOV)"), std::string::npos) << v;
}

TEST(ImageErrors, NoFfmpegBranchNamesTheFormat) {
  ImageReadOptions opt;
  opt.disable_ffmpeg = true;
  EXPECT_NE(error_reading(kDir + "rgb.png", opt).find("rgb.png: a PNG image, but this build has no FFmpeg and reads "
                                                      "only binary PPM/PGM (P6/P5)"),
            std::string::npos);
  EXPECT_NE(error_reading(kDir + "q90_420.jpg", opt).find("a JPEG image"), std::string::npos);
  EXPECT_NE(error_reading(kDir + "not_an_image.txt", opt).find("it has no FFmpeg"), std::string::npos);
}

// Cut-down and bit-flipped files: an error or an image, never a crash, hang or out-of-bounds read.
TEST(ImageErrors, DamagedFilesNeverCrash) {
  std::mt19937 rng(5);
  for (const char* f : {"rgb.png", "q90_420.jpg", "lossless.webp", "orient6_mm.jpg", "orient6.png", "rgb16.ppm"}) {
    const std::string good = slurp(kDir + f);
    for (int i = 0; i < 60; ++i) {
      std::string b = good;
      if (i % 2 == 0) b.resize(rng() % b.size());
      for (int k = 0; k < 1 + i % 4; ++k)
        if (!b.empty()) b[rng() % b.size()] ^= static_cast<char>(1 + rng() % 255);
      try {
        const RgbImage im = decode_image(reinterpret_cast<const uint8_t*>(b.data()), b.size(), f);
        EXPECT_EQ(im.rgb.size(), size_t(im.width) * im.height * 3);
      } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()).rfind(std::string(f) + ": ", 0), 0u) << e.what();
      }
    }
  }
}

// ---- ops ----------------------------------------------------------------------------------------------

Tensor fixture(const std::string& key) { return expected().get(key).clone(); }

TEST(ImageOps, ToTensorEqualsTorch) {
  const RgbImage in = expected_image("to_tensor/in");
  const Tensor want = fixture("to_tensor/out");
  const Tensor got = image_to_tensor(in);
  ASSERT_EQ(got.shape().str(), want.shape().str());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.nbytes()), 0);
  EXPECT_EQ(got.f32()[0], (float(in.rgb[0]) / 255.0f - 0.5f) / 0.5f);
}

TEST(ImageOps, BicubicEqualsTorch) {
  double worst = 0;
  for (int i = 0;; ++i) {
    const std::string key = "bicubic/" + std::to_string(i);
    if (!expected().find(key + "/in")) break;
    const Tensor x = fixture(key + "/in"), want = fixture(key + "/out");
    const Tensor got = resize_bicubic(x, want.dim(1), want.dim(2));
    ASSERT_EQ(got.shape().str(), want.shape().str()) << key;
    double m = 0;
    int64_t differing = 0;
    for (int64_t k = 0; k < got.numel(); ++k) {
      m = std::max(m, double(std::fabs(got.f32()[k] - want.f32()[k])));
      differing += got.f32()[k] != want.f32()[k];
    }
    EXPECT_LE(m, 1e-6) << key;
    // Bit-identical with torch's AVX2 / AVX-512 kernels (the fixtures came from those, see image_ops.h).
    EXPECT_EQ(differing, 0) << key << " (" << x.shape().str() << " -> " << got.shape().str() << ")";
    worst = std::max(worst, m);
    // The same with a leading batch dimension.
    const Tensor batched = resize_bicubic(x.reshape({1, x.dim(0), x.dim(1), x.dim(2)}), want.dim(1), want.dim(2));
    EXPECT_EQ(std::memcmp(batched.data(), got.data(), got.nbytes()), 0) << key;
  }
  std::printf("  bicubic vs torch: max |diff| %g\n", worst);
  EXPECT_NE(test::error_of([] { resize_bicubic(Tensor::f32({3, 4, 4}), 0, 5); }).find("output size 0x5"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { resize_bicubic(Tensor(DType::U8, {3, 4, 4}), 2, 2); }).find("must be float32"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { resize_bicubic(Tensor::f32({4}), 2, 2); }).find("[..., h, w]"), std::string::npos);
}

TEST(ImageOps, LanczosEqualsPillow) {
  int cases = 0;
  for (int i = 0;; ++i) {
    const std::string key = "lanczos/" + std::to_string(i);
    if (!expected().find(key + "/in")) break;
    const RgbImage in = expected_image(key + "/in"), want = expected_image(key + "/out");
    const RgbImage got = resize_lanczos(in, want.width, want.height);
    ASSERT_EQ(got.width, want.width) << key;
    ASSERT_EQ(got.height, want.height) << key;
    const Diff d = diff(got, want);
    EXPECT_EQ(d.max, 0) << key << ": " << in.width << "x" << in.height << " -> " << want.width << "x" << want.height
                        << ", mean |diff| " << d.mean;
    ++cases;
  }
  EXPECT_GE(cases, 30);
  const RgbImage one = expected_image("lanczos/0/in");
  EXPECT_NE(test::error_of([&] { resize_lanczos(one, 0, 3); }).find("output size 0x3"), std::string::npos);
}

TEST(ImageOps, CropIsBoundsChecked) {
  const RgbImage im = expected_image("decode/rgb.png");
  const RgbImage c = crop(im, 5, 3, 10, 7);
  ASSERT_EQ(c.width, 10);
  ASSERT_EQ(c.height, 7);
  for (int y = 0; y < 7; ++y)
    for (int x = 0; x < 10; ++x)
      for (int ch = 0; ch < 3; ++ch)
        ASSERT_EQ(c.rgb[(y * 10 + x) * 3 + ch], im.rgb[((y + 3) * im.width + x + 5) * 3 + ch]);
  EXPECT_EQ(crop(im, 0, 0, im.width, im.height).rgb, im.rgb);
  for (auto [x, y, w, h] : {std::array{-1, 0, 5, 5}, std::array{0, 0, 38, 5}, std::array{30, 20, 8, 3},
                            std::array{0, 0, 0, 5}, std::array{2147483647, 0, 1, 1}})
    EXPECT_NE(test::error_of([&] { crop(im, x, y, w, h); }).find("is not inside the 37x23 image"), std::string::npos)
        << x << "," << y << " " << w << "x" << h;
  RgbImage bad = im;
  bad.rgb.pop_back();
  EXPECT_NE(test::error_of([&] { image_to_tensor(bad); }).find("bytes of RGB"), std::string::npos);
}

}  // namespace
}  // namespace wan
