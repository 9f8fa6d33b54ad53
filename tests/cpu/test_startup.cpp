// The host part of the GPU fast start (pipeline/startup.h): the start-up trace's JSON (version 2:
// every duration and milestone written with its value, nothing else; version 1's warm-up order
// fields are gone). The fast start itself is tested on the GPU (tests/gpu/test_load_gpu.cu (g),
// tests/gpu/test_pipeline_gpu.cu).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>

#include "core/error.h"
#include "pipeline/startup.h"

using namespace wan;

TEST(Startup, TraceJsonHasEveryFieldAndMark) {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> u(0.001, 5.0);
  for (int round = 0; round < 3; ++round) {
    FastStart fs;
    fs.setup = u(rng), fs.loader_setup = u(rng), fs.load_text_encoder = u(rng), fs.text_encode = u(rng);
    fs.warm_up = u(rng), fs.staging_free = u(rng);
    fs.load_wall = u(rng), fs.gb_per_s = u(rng);
    fs.bytes = rng() >> 16;
    StartupMarks& m = fs.marks;
    m.libraries_loaded = u(rng), m.entered = u(rng), m.loader_started = u(rng), m.streaming = u(rng);
    m.text_resident = u(rng);
    m.text_encoded = u(rng), m.warm_up_done = u(rng), m.weights_resident = u(rng), m.returned = u(rng);

    const nlohmann::json j = nlohmann::json::parse(startup_trace_json(fs));
    EXPECT_EQ(kStartupTraceVersion, 2);
    EXPECT_EQ(j.at("version").get<int>(), kStartupTraceVersion);
    EXPECT_EQ(j.at("bytes").get<uint64_t>(), fs.bytes);
    // Doubles survive the round trip exactly (nlohmann writes the shortest exact form).
    EXPECT_EQ(j.at("setup_s").get<double>(), fs.setup);
    EXPECT_EQ(j.at("loader_setup_s").get<double>(), fs.loader_setup);
    EXPECT_EQ(j.at("load_text_encoder_s").get<double>(), fs.load_text_encoder);
    EXPECT_EQ(j.at("text_encode_s").get<double>(), fs.text_encode);
    EXPECT_EQ(j.at("warm_up_s").get<double>(), fs.warm_up);
    EXPECT_EQ(j.at("load_wall_s").get<double>(), fs.load_wall);
    EXPECT_EQ(j.at("staging_free_s").get<double>(), fs.staging_free);
    EXPECT_EQ(j.at("gb_per_s").get<double>(), fs.gb_per_s);
    // Exactly these keys: the warm-up order fields of version 1 are gone.
    std::set<std::string> keys;
    for (auto it = j.begin(); it != j.end(); ++it) keys.insert(it.key());
    const std::set<std::string> want{"version",     "setup_s",     "loader_setup_s", "load_text_encoder_s",
                                     "text_encode_s", "warm_up_s", "load_wall_s",    "staging_free_s",
                                     "bytes",       "gb_per_s",    "marks"};
    EXPECT_EQ(keys, want);
    for (const char* gone : {"warm_up_order", "reason", "free_bytes", "need_bytes"})
      EXPECT_FALSE(j.contains(gone)) << gone;
    const nlohmann::json& mk = j.at("marks");
    EXPECT_EQ(mk.size(), 9u);
    EXPECT_EQ(mk.at("libraries_loaded").get<double>(), m.libraries_loaded);
    EXPECT_EQ(mk.at("entered").get<double>(), m.entered);
    EXPECT_EQ(mk.at("loader_started").get<double>(), m.loader_started);
    EXPECT_EQ(mk.at("streaming").get<double>(), m.streaming);
    EXPECT_EQ(mk.at("text_resident").get<double>(), m.text_resident);
    EXPECT_EQ(mk.at("text_encoded").get<double>(), m.text_encoded);
    EXPECT_EQ(mk.at("warm_up_done").get<double>(), m.warm_up_done);
    EXPECT_EQ(mk.at("weights_resident").get<double>(), m.weights_resident);
    EXPECT_EQ(mk.at("returned").get<double>(), m.returned);
  }
}

// A fast start that did not happen in part (no text encoder: prompts given as embeddings) writes its
// zero milestones as 0, not as missing keys.
TEST(Startup, TraceJsonKeepsZeroMarks) {
  FastStart fs;
  fs.marks.entered = 0.25;
  fs.marks.returned = 1.5;
  const nlohmann::json j = nlohmann::json::parse(startup_trace_json(fs));
  const nlohmann::json& mk = j.at("marks");
  EXPECT_EQ(mk.size(), 9u);
  EXPECT_EQ(mk.at("text_resident").get<double>(), 0.0);
  EXPECT_EQ(mk.at("text_encoded").get<double>(), 0.0);
  EXPECT_EQ(mk.at("entered").get<double>(), 0.25);
  EXPECT_EQ(mk.at("returned").get<double>(), 1.5);
  EXPECT_EQ(j.at("load_text_encoder_s").get<double>(), 0.0);
}
