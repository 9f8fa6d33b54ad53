// VideoStreamWriter (formats/video_stream.h): frames handed over in pieces from another thread give the
// bytes of a whole-video write; an abort before the last frame leaves no file and an existing target
// untouched; misuse and bad targets are errors at begin() or finish().
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "formats/video.h"
#include "formats/video_stream.h"
#include "run_util.h"

namespace fs = std::filesystem;
using namespace wan;

using wan::test::slurp;

namespace {

const fs::path& scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("wan_test_video_stream_" + std::to_string(getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(fs::temp_directory_path() / ("wan_test_video_stream_" + std::to_string(getpid())), ec);
    });
    return d;
  }();
  return dir;
}
std::string sp(const std::string& name) { return (scratch() / name).string(); }

std::vector<uint8_t> random_frames(int F, int H, int W, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(size_t(F) * H * W * 3);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Hands `frames` to the writer from another thread in pieces of `piece` frames, with pauses, as a
// decoder does; stops after `stop_at` frames when given.
void produce(VideoStreamWriter& w, const std::vector<uint8_t>& frames, int F, int H, int W, int piece,
             int stop_at = -1) {
  uint8_t* dst = w.begin(F, H, W, 16);
  std::thread t([&] {
    const size_t fb = size_t(H) * W * 3;
    for (int f0 = 0; f0 < F; f0 += piece) {
      const int f1 = std::min(F, f0 + piece);
      if (stop_at >= 0 && f1 > stop_at) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
      std::copy(frames.begin() + long(f0 * fb), frames.begin() + long(f1 * fb), dst + f0 * fb);
      w.ready(f1);
    }
  });
  t.join();
}

}  // namespace

TEST(VideoStream, PiecesFromAnotherThreadGiveTheWholeWritesBytes) {
  const int F = 9, H = 24, W = 40;
  const std::vector<uint8_t> frames = random_frames(F, H, W, std::random_device{}());
  for (const char* ext : {".y4m", ".png", ".mp4"}) {
    if (std::string(ext) == ".mp4" && !video_have_ffmpeg()) continue;  // the .y4m and .png cases still ran
    const std::string whole = sp(std::string("whole") + ext), streamed = sp(std::string("streamed") + ext);
    write_video_rgb8(whole, frames.data(), F, H, W, 16);
    VideoStreamWriter w(streamed);
    produce(w, frames, F, H, W, 4);
    w.finish();
    EXPECT_EQ(w.frames(), F);
    EXPECT_EQ(w.height(), H);
    EXPECT_EQ(w.width(), W);
    if (std::string(ext) == ".png") {
      const auto a = png_sequence_paths(whole, F), b = png_sequence_paths(streamed, F);
      for (int f = 0; f < F; ++f) EXPECT_EQ(slurp(a[size_t(f)]), slurp(b[size_t(f)])) << ext << " frame " << f;
    } else {
      const std::string a = slurp(whole);
      ASSERT_GT(a.size(), size_t(1000)) << ext;
      EXPECT_EQ(a, slurp(streamed)) << ext;
    }
  }
}

TEST(VideoStream, AbortBeforeTheLastFrameLeavesTheTargetAsItWas) {
  const int F = 9, H = 16, W = 16;
  const std::vector<uint8_t> frames = random_frames(F, H, W, 7);
  const std::string fresh = sp("fresh.y4m"), existing = sp("existing.y4m");
  {
    VideoStreamWriter w(fresh);
    produce(w, frames, F, H, W, 4, /*stop_at=*/8);
    w.abort();
  }
  EXPECT_FALSE(fs::exists(fresh));
  {
    std::ofstream(existing) << "an earlier video";
    VideoStreamWriter w(existing);
    produce(w, frames, F, H, W, 4, /*stop_at=*/4);
  }  // the destructor aborts
  EXPECT_EQ(slurp(existing), "an earlier video");
  for (const auto& e : fs::directory_iterator(scratch()))  // no temporary file stays behind
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST(VideoStream, MisuseAndBadTargetsAreErrors) {
  const int F = 5, H = 8, W = 8;
  {
    VideoStreamWriter w(sp("bad.avi"));
    EXPECT_THROW(w.begin(F, H, W, 16), Error);  // unknown extension, before any thread starts
    EXPECT_FALSE(w.started());
  }
  {
    VideoStreamWriter w(sp("short.y4m"));
    w.begin(F, H, W, 16);
    w.ready(3);
    EXPECT_THROW(w.ready(F + 1), Error);
    EXPECT_THROW(w.finish(), Error);  // 3 of 5 frames
    w.abort();
    EXPECT_FALSE(fs::exists(sp("short.y4m")));
  }
  {
    VideoStreamWriter w(sp("twice.y4m"));
    EXPECT_THROW(w.ready(1), Error);  // before begin()
    w.begin(F, H, W, 16);
    EXPECT_THROW(w.begin(F, H, W, 16), Error);
  }
  {
    VideoStreamWriter w(sp("nodir/x.y4m"));
    EXPECT_THROW(w.begin(F, H, W, 16), Error);  // the folder does not exist: refused at begin()
  }
}
