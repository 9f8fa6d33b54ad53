// The run-level memory plan (runtime/memory_plan.h) on made-up numbers: stage and run peaks, the
// refusal line (request, stage, items, free bytes, what fits) and the table.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "core/error.h"
#include "runtime/memory_plan.h"

namespace wan {
namespace {

constexpr size_t MiB = size_t{1} << 20;
constexpr size_t GiB = size_t{1} << 30;

const StageSet kLoad = stage_bit(RunStage::Load), kText = stage_bit(RunStage::TextEncode),
               kDenoise = stage_bit(RunStage::Denoise), kDecode = stage_bit(RunStage::Decode);

// A one-GPU run with the text encoder streaming in next to the experts (fast start), freed before the
// activations.
RunMemoryPlan sample_plan() {
  RunMemoryPlan p;
  p.request = "1280x720, 81 frames, 2 experts";
  p.add("cuda:0", "text encoder", 11 * GiB, kLoad | kText);
  p.add("cuda:0", "high-noise expert weights", 27 * GiB, kLoad | kText | kDenoise);
  p.add("cuda:0", "low-noise expert weights", 27 * GiB, kLoad | kText | kDenoise);
  p.add("cuda:0", "loader staging", 96 * MiB, kLoad | kText);
  p.add("cuda:0", "DiT activations", 20 * GiB, kDenoise);
  p.add("cuda:0", "sampler state", 64 * MiB, kDenoise);
  p.add("cuda:0", "DiT reserve", 512 * MiB, kLoad | kText | kDenoise);
  p.add("cuda:0", "VAE weights", 250 * MiB, kDecode);
  return p;
}

TEST(MemoryPlan, StagePeaksAreSumsOfResidentItems) {
  const RunMemoryPlan p = sample_plan();
  ASSERT_EQ(p.devices().size(), 1u);
  EXPECT_EQ(p.devices()[0].items.size(), 8u);
  const size_t load = 11 * GiB + 54 * GiB + 96 * MiB + 512 * MiB;
  const size_t denoise = 54 * GiB + 20 * GiB + 64 * MiB + 512 * MiB;
  EXPECT_EQ(p.stage_peak("cuda:0", RunStage::Load), load);
  EXPECT_EQ(p.stage_peak("cuda:0", RunStage::TextEncode), load);
  EXPECT_EQ(p.stage_peak("cuda:0", RunStage::Denoise), denoise);
  EXPECT_EQ(p.stage_peak("cuda:0", RunStage::Decode), 250 * MiB);
  EXPECT_EQ(p.peak_stage("cuda:0"), RunStage::Denoise);
  EXPECT_EQ(p.peak("cuda:0"), denoise);
  EXPECT_TRUE(p.uses("cuda:0", RunStage::Decode));
}

TEST(MemoryPlan, PeakStageFollowsTheLargestSum) {
  RunMemoryPlan p = sample_plan();
  p.add("cuda:0", "big text arena", 30 * GiB, kText);  // text encode now exceeds the denoise stage
  EXPECT_EQ(p.peak_stage("cuda:0"), RunStage::TextEncode);
  EXPECT_EQ(p.peak("cuda:0"), 11 * GiB + 54 * GiB + 96 * MiB + 512 * MiB + 30 * GiB);
}

TEST(MemoryPlan, DevicesAreSeparate) {
  RunMemoryPlan p;
  p.add("cuda:0", "a", 3 * GiB, kDenoise);
  p.add("cuda:1", "b", 5 * GiB, kDenoise);
  p.add("cuda:0", "c", 1 * GiB, kDenoise | kDecode);
  ASSERT_EQ(p.devices().size(), 2u);
  EXPECT_EQ(p.peak("cuda:0"), 4 * GiB);
  EXPECT_EQ(p.peak("cuda:1"), 5 * GiB);
  EXPECT_EQ(p.stage_peak("cuda:0", RunStage::Decode), 1 * GiB);
  EXPECT_FALSE(p.uses("cuda:1", RunStage::Load));
  EXPECT_EQ(p.stage_peak("cuda:1", RunStage::Load), 0u);
  EXPECT_NO_THROW(p.check("cuda:0", 4 * GiB));
  EXPECT_THROW(p.check("cuda:1", 4 * GiB), Error);
  EXPECT_THROW(p.check(8 * GiB), Error) << "check(free) needs a plan of one device";
}

TEST(MemoryPlan, ChecksAtTheBoundary) {
  const RunMemoryPlan p = sample_plan();
  const size_t peak = p.peak("cuda:0");
  EXPECT_EQ(p.refusal("cuda:0", peak), "");
  EXPECT_NO_THROW(p.check(peak));
  EXPECT_NE(p.refusal("cuda:0", peak - 1), "");
  EXPECT_THROW(p.check(peak - 1), Error);
}

TEST(MemoryPlan, RefusalIsOneLineNamingRequestNeedFreeAndWhatFits) {
  RunMemoryPlan p = sample_plan();
  RunStage seen = RunStage::Load;
  size_t seen_free = 0;
  p.what_fits = [&](const std::string& device, RunStage st, size_t free_bytes) {
    EXPECT_EQ(device, "cuda:0");
    seen = st;
    seen_free = free_bytes;
    return std::string("at most 41 frames fit at 1280x720");
  };
  std::string msg;
  try {
    p.check(60 * GiB);
  } catch (const Error& e) {
    msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::BadInput);
  }
  EXPECT_EQ(seen, RunStage::Denoise);
  EXPECT_EQ(seen_free, 60 * GiB);
  EXPECT_EQ(msg,
            "device cuda:0: the run (1280x720, 81 frames, 2 experts) does not fit: its denoise stage needs 74.56 GiB "
            "(high-noise expert weights 27.00 GiB + low-noise expert weights 27.00 GiB + DiT activations 20.00 GiB + "
            "sampler state 64 MiB + DiT reserve 512 MiB) but only 60.00 GiB is free; at most 41 frames fit at "
            "1280x720");
  EXPECT_EQ(msg.find('\n'), std::string::npos);
}

TEST(MemoryPlan, RefusalWithoutWhatFitsOrRequest) {
  RunMemoryPlan p;
  p.add("cuda:1", "weights", 2 * GiB, kDenoise);
  p.add("cuda:1", "unused", 0, kDenoise);
  EXPECT_EQ(p.refusal("cuda:1", 1 * GiB),
            "device cuda:1: the run does not fit: its denoise stage needs 2.00 GiB (weights 2.00 GiB) but only "
            "1.00 GiB is free");
}

TEST(MemoryPlan, TableListsItemsStagesAndPeaks) {
  const std::string s = sample_plan().str();
  EXPECT_EQ(s.rfind("run memory plan (1280x720, 81 frames, 2 experts):\n", 0), 0u) << s;
  for (const char* col : {"load", "text encode", "denoise", "decode"}) EXPECT_NE(s.find(col), std::string::npos) << col;
  EXPECT_NE(s.find("text encoder"), std::string::npos);
  EXPECT_NE(s.find("11.00 GiB"), std::string::npos) << s;
  EXPECT_NE(s.find("loader staging"), std::string::npos);
  EXPECT_NE(s.find("96 MiB"), std::string::npos) << s;
  EXPECT_NE(s.find("74.56 GiB"), std::string::npos) << "the denoise peak\n" << s;
  EXPECT_NE(s.find("65.59 GiB"), std::string::npos) << "the load peak\n" << s;
  EXPECT_NE(s.find("peak on cuda:0: 74.56 GiB (denoise)"), std::string::npos) << s;
  // The VAE row is marked in the decode column only: its line has exactly one mark.
  const size_t vae = s.find("VAE weights");
  ASSERT_NE(vae, std::string::npos);
  const std::string row = s.substr(vae, s.find('\n', vae) - vae);
  EXPECT_EQ(std::count(row.begin(), row.end(), 'x'), 1) << row;
  EXPECT_EQ(row.back(), 'x') << row;
}

TEST(MemoryPlan, EmptyStageShowsADash) {
  RunMemoryPlan p;
  p.add("cuda:0", "weights", 3 * GiB, kDenoise);
  const std::string s = p.str();
  const size_t peak = s.find("stage peak");
  ASSERT_NE(peak, std::string::npos);
  const std::string row = s.substr(peak, s.find('\n', peak) - peak);
  EXPECT_EQ(std::count(row.begin(), row.end(), '-'), kRunStages - 1) << row;
  EXPECT_NE(row.find("3.00 GiB"), std::string::npos) << row;
}

TEST(MemoryPlan, MemoryStrUnits) {
  EXPECT_EQ(memory_str(0), "0 MiB");
  EXPECT_EQ(memory_str(512 * MiB), "512 MiB");
  EXPECT_EQ(memory_str(GiB - 1), "1024 MiB");
  EXPECT_EQ(memory_str(GiB), "1.00 GiB");
  EXPECT_EQ(memory_str(80 * GiB + 512 * MiB), "80.50 GiB");
}

TEST(MemoryPlan, LargestFittingFindsTheLastFit) {
  int calls = 0;
  auto below = [&](int64_t limit) {
    return [&calls, limit](int64_t n) {
      ++calls;
      return n <= limit;
    };
  };
  EXPECT_EQ(largest_fitting(100, below(37)), 37);
  EXPECT_LE(calls, 10);
  EXPECT_EQ(largest_fitting(100, below(1)), 1);
  EXPECT_EQ(largest_fitting(100, below(0)), 0);
  EXPECT_EQ(largest_fitting(100, below(100)), 100);
  EXPECT_EQ(largest_fitting(100, below(500)), 100);
  EXPECT_EQ(largest_fitting(0, below(5)), 0);
  EXPECT_EQ(largest_fitting(1, below(5)), 1);
  EXPECT_EQ(largest_fitting(2, below(1)), 1);
  // Frames of a growing plan: bytes = 2 GiB + n * 300 MiB against 10 GiB free.
  auto fits = [](int64_t n) { return 2 * GiB + static_cast<size_t>(n) * 300 * MiB <= 10 * GiB; };
  EXPECT_EQ(largest_fitting(20, fits), 27 < 20 ? 27 : 20);
  EXPECT_EQ(largest_fitting(40, fits), 27);  // 8192 / 300 = 27.3
}

TEST(MemoryPlan, RejectsUnknownStages) { EXPECT_THROW(RunMemoryPlan().add("d", "x", 1, 1u << 7), Error); }

}  // namespace
}  // namespace wan
