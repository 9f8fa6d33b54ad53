// The host parts of the GPU fast start (pipeline/startup.h): the WAN_FAST_START_SEQUENTIAL switch
// (unset / "0" / "1", anything else one clear error) and the start-up trace's JSON (every field and
// milestone written with its value). The fast start itself is tested on the GPU
// (tests/gpu/test_load_gpu.cu (g), tests/gpu/test_pipeline_gpu.cu).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>

#include "core/error.h"
#include "pipeline/startup.h"

using namespace wan;

namespace {

// Sets (or unsets, with nullopt) an environment variable for one scope.
struct EnvGuard {
  std::string name;
  std::optional<std::string> old;
  EnvGuard(std::string n, const std::optional<std::string>& v) : name(std::move(n)) {
    if (const char* o = std::getenv(name.c_str())) old = o;
    if (v) ::setenv(name.c_str(), v->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
  ~EnvGuard() {
    if (old) ::setenv(name.c_str(), old->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

}  // namespace

TEST(Startup, SequentialSwitch) {
  const char* kVar = "WAN_FAST_START_SEQUENTIAL";
  {
    EnvGuard g(kVar, std::nullopt);
    EXPECT_TRUE(fast_start_forced_sequential());  // the default
  }
  for (const char* on : {"", "1"}) {
    EnvGuard g(kVar, std::string(on));
    EXPECT_TRUE(fast_start_forced_sequential()) << "'" << on << "'";
  }
  {
    EnvGuard g(kVar, std::string("0"));
    EXPECT_FALSE(fast_start_forced_sequential());
  }
  for (const char* bad : {"yes", "2", "true", " 1"}) {
    EnvGuard g(kVar, std::string(bad));
    try {
      (void)fast_start_forced_sequential();
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(kVar), std::string::npos) << m;
      EXPECT_NE(m.find(bad), std::string::npos) << m;
      EXPECT_NE(m.find("expected 0 or 1"), std::string::npos) << m;
    }
  }
}

TEST(Startup, TraceJsonHasEveryFieldAndMark) {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> u(0.001, 5.0);
  for (bool concurrent : {true, false}) {
    FastStart fs;
    fs.warm_up_concurrent = concurrent;
    fs.warm_up_order_reason = concurrent ? "fits" : "memory: the warm-up beside the text encoder needs 70 GiB";
    fs.free_bytes_at_choice = rng() >> 20;
    fs.concurrent_need_bytes = rng() >> 20;
    fs.setup = u(rng), fs.loader_setup = u(rng), fs.load_text_encoder = u(rng), fs.text_encode = u(rng);
    fs.warm_up = u(rng);
    fs.load_wall = u(rng), fs.gb_per_s = u(rng);
    fs.bytes = rng() >> 16;
    StartupMarks& m = fs.marks;
    m.libraries_loaded = u(rng), m.entered = u(rng), m.loader_started = u(rng), m.streaming = u(rng);
    m.text_resident = u(rng);
    m.text_encoded = u(rng), m.warm_up_done = u(rng), m.weights_resident = u(rng), m.returned = u(rng);

    const nlohmann::json j = nlohmann::json::parse(startup_trace_json(fs));
    EXPECT_EQ(j.at("version").get<int>(), kStartupTraceVersion);
    EXPECT_EQ(j.at("warm_up_order").get<std::string>(), concurrent ? "concurrent" : "sequential");
    EXPECT_EQ(j.at("reason").get<std::string>(), fs.warm_up_order_reason);
    EXPECT_EQ(j.at("free_bytes").get<uint64_t>(), fs.free_bytes_at_choice);
    EXPECT_EQ(j.at("need_bytes").get<uint64_t>(), fs.concurrent_need_bytes);
    EXPECT_EQ(j.at("bytes").get<uint64_t>(), fs.bytes);
    // Doubles survive the round trip exactly (nlohmann writes the shortest exact form).
    EXPECT_EQ(j.at("setup_s").get<double>(), fs.setup);
    EXPECT_EQ(j.at("loader_setup_s").get<double>(), fs.loader_setup);
    EXPECT_EQ(j.at("load_text_encoder_s").get<double>(), fs.load_text_encoder);
    EXPECT_EQ(j.at("text_encode_s").get<double>(), fs.text_encode);
    EXPECT_EQ(j.at("warm_up_s").get<double>(), fs.warm_up);
    EXPECT_EQ(j.at("load_wall_s").get<double>(), fs.load_wall);
    EXPECT_EQ(j.at("gb_per_s").get<double>(), fs.gb_per_s);
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
