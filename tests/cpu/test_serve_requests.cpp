// A video request of `wan serve` (src/server/requests.h, api/serve_options.h): fields checked with
// generate's rules under their API names, seconds -> 4n+1 frames, the served model and frame rate,
// limits, the plan run before queuing (tiny random model), LoRAs named under --lora-dir (resolved
// only inside it, passed on as --lora / --lora-high / --lora-low), OpenAI error objects, the
// constant-time key check and serve's durations.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "models/config.h"
#include "server/jobs.h"
#include "testing/make_lora.h"
#include "api/serve_options.h"
#include "server/http_server.h"
#include "server/requests.h"

namespace {

using namespace wan;
using namespace wan::server;
using Fields = std::map<std::string, std::string>;

// `serve_options`: more of the server's own options (name -> value).
ServedModel tiny(const Fields& serve_options = {}) {
  api::Values serve(api::serve_spec());
  serve.set("weights", "random");
  serve.set("config", "tiny");
  for (const auto& [k, v] : serve_options) serve.set(k, v);
  ServedModel m(api::generate_base_values(serve));
  m.id = "wan2.2-t2v-A14B";
  m.fps = 16;
  m.max_prompt = 100;
  return m;
}

// The ApiError a request raises (status 0 when none).
ApiError error_of(const Fields& f, bool plan = false) {
  try {
    VideoRequest r = parse_video_request(f, tiny(), "");
    if (plan) plan_video_request(r, tiny());
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "");
}

TEST(ServeRequests, FieldsBecomeGenerateOptionsWithTheCliRules) {
  const VideoRequest r = parse_video_request({{"prompt", "a cat"},
                                              {"size", "64x32"},
                                              {"seconds", "0.25"},
                                              {"steps", "2"},
                                              {"seed", "7"},
                                              {"guidance_scale", "3,4.5"},
                                              {"shift", "5"},
                                              {"sampler", "euler"},
                                              {"negative_prompt", "blur"}},
                                             tiny(), "");
  EXPECT_EQ(r.opts.prompt.value(), "a cat");
  EXPECT_EQ(r.opts.width.value(), 64);
  EXPECT_EQ(r.opts.height.value(), 32);
  EXPECT_EQ(r.opts.frames.value(), 5);  // 0.25 s * 16 fps + 1
  EXPECT_EQ(r.opts.steps.value(), 2);
  EXPECT_EQ(r.opts.seed.value(), 7u);
  EXPECT_FLOAT_EQ(r.opts.guide_low.value(), 3.0f);
  EXPECT_FLOAT_EQ(r.opts.guide_high.value(), 4.5f);
  EXPECT_DOUBLE_EQ(r.opts.shift.value(), 5.0);
  EXPECT_EQ(r.opts.negative_prompt.value(), "blur");
  EXPECT_TRUE(r.opts.random_weights);
  EXPECT_EQ(r.opts.config, "tiny");
  EXPECT_EQ(r.info.seconds, "0.25");
  EXPECT_TRUE(r.opts.image_file.empty());
  // num_frames wins over seconds; an uploaded image becomes --image.
  const VideoRequest n = parse_video_request({{"prompt", "x"}, {"seconds", "4"}, {"num_frames", "9"}}, tiny(), "/srv/in.png");
  EXPECT_EQ(n.opts.frames.value(), 9);
  EXPECT_EQ(n.opts.image_file, "/srv/in.png");
}

TEST(ServeRequests, TheServersMemoryBudgetReachesEveryJob) {
  const ServedModel m = tiny({{"memory-budget", "24GiB"}, {"host-memory-budget", "64G"}});
  const VideoRequest r = parse_video_request({{"prompt", "a cat"}}, m, "");
  EXPECT_EQ(r.opts.memory_budget, int64_t{24} << 30);
  EXPECT_EQ(r.opts.host_memory_budget, int64_t{64} << 30);
  // A request cannot set it: the budget is the server's.
  EXPECT_EQ(error_of({{"prompt", "x"}, {"memory_budget", "1G"}}).status, 400);
}

// serve --size / --frames: the default of a request that gives none (and the preload's shape).
TEST(ServeRequests, TheServersSizeAndFramesAreTheRequestsDefaults) {
  const ServedModel m = tiny({{"size", "96x64"}, {"frames", "13"}});
  VideoRequest r = parse_video_request({{"prompt", "a cat"}}, m, "");
  plan_video_request(r, m);
  EXPECT_EQ(r.plan->width, 96);
  EXPECT_EQ(r.plan->frames, 13);
  EXPECT_EQ(r.info.size, "96x64");
  r = parse_video_request({{"prompt", "a cat"}, {"size", "64x48"}, {"num_frames", "5"}}, m, "");
  plan_video_request(r, m);
  EXPECT_EQ(r.info.size, "64x48");
  EXPECT_EQ(r.plan->frames, 5);
  // Instances split over GPUs: requests are planned as multi-GPU runs (each rank checks its share).
  ServedModel p = tiny();
  p.parallel = true;
  EXPECT_TRUE(parse_video_request({{"prompt", "a cat"}}, p, "").opts.parallel);
  EXPECT_FALSE(parse_video_request({{"prompt", "a cat"}}, m, "").opts.parallel);
}

TEST(ServeRequests, BadFieldsAre400NamingTheParam) {
  struct Case {
    Fields f;
    std::string param;
  } cases[] = {
      {{{"prompt", "x"}, {"steps", "0"}}, "steps"},
      {{{"prompt", "x"}, {"steps", "two"}}, "steps"},
      {{{"prompt", "x"}, {"num_frames", "6"}}, "num_frames"},
      {{{"prompt", "x"}, {"guidance_scale", "a,b"}}, "guidance_scale"},
      {{{"prompt", "x"}, {"sampler", "nope"}}, "sampler"},
      {{{"prompt", "x"}, {"size", "big"}}, "size"},
      {{{"prompt", "x"}, {"seconds", "-1"}}, "seconds"},
      {{{"prompt", "x"}, {"image", "/etc/passwd"}}, "image"},  // no field is a path
      {{{"prompt", "x"}, {"model", "sora-2"}}, "model"},
      {{{"prompt", "x"}, {"fps", "30"}}, "fps"},
      {{{"prompt", std::string(101, 'a')}}, "prompt"},
      {{{"size", "64x64"}}, "prompt"},
      {{{"prompt", ""}}, "prompt"},
  };
  for (const Case& c : cases) {
    const ApiError e = error_of(c.f);
    EXPECT_EQ(e.status, 400) << c.param;
    EXPECT_EQ(e.param, c.param) << e.message;
    EXPECT_FALSE(e.message.empty());
  }
  EXPECT_EQ(error_of({{"prompt", "x"}, {"model", "wan2.2-t2v-A14B"}, {"fps", "16"}}).status, 0);
  // Form fields are raw bytes: text that is not UTF-8 would make the video object unwritable as JSON.
  const ApiError utf8 = error_of({{"prompt", "caf\xe9"}});
  EXPECT_EQ(utf8.status, 400);
  EXPECT_EQ(utf8.param, "prompt");
  const ApiError name = error_of({{"prompt", "x"}, {"\xff\xfe", "1"}});
  EXPECT_EQ(name.status, 400);
  EXPECT_NO_THROW(name.body().dump());
}

TEST(ServeRequests, ThePlanRunsBeforeQueuing) {
  const ApiError e = error_of({{"prompt", "x"}, {"size", "72x64"}}, true);  // not a multiple of 16
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "size");
  EXPECT_NE(e.message.find("16"), std::string::npos) << e.message;
  const ApiError s = error_of({{"prompt", "x"}, {"size", "64x64"}, {"seconds", "3600"}}, true);  // past the RoPE
  EXPECT_EQ(s.param, "seconds");
  EXPECT_EQ(s.message.rfind("'seconds': 'frames' 57601", 0), 0u) << s.message;
  VideoRequest r = parse_video_request({{"prompt", "x"}, {"size", "64x64"}, {"num_frames", "5"}, {"steps", "2"}}, tiny(), "");
  EXPECT_FALSE(r.opts.seed.has_value());
  plan_video_request(r, tiny());
  EXPECT_TRUE(r.opts.seed.has_value());  // the random seed is fixed when accepted
  EXPECT_EQ(r.info.size, "64x64");
  EXPECT_EQ(r.info.seconds, "0.25");
}

TEST(ServeRequests, AnImageTaskWithoutAnImageNamesInputReference) {
  api::Values serve(api::serve_spec());
  serve.set("weights", "random");
  serve.set("config", "tiny-i2v");
  ServedModel m(api::generate_base_values(serve));
  VideoRequest r = parse_video_request({{"prompt", "x"}, {"size", "64x64"}, {"num_frames", "5"}}, m, "");
  try {
    plan_video_request(r, m);
    FAIL() << "planned without an image";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "input_reference");
    EXPECT_NE(e.message.find("'input_reference'"), std::string::npos) << e.message;
    EXPECT_EQ(e.message.find("'image'"), std::string::npos) << e.message;
  }
}

TEST(ServeRequests, JsonFieldsAreStringsOrNumbers) {
  const Fields f = fields_from_json(nlohmann::json::parse(R"({"prompt":"p","steps":2,"shift":2.5,"seed":null})"));
  EXPECT_EQ(f.at("steps"), "2");
  EXPECT_EQ(f.at("shift"), "2.5");
  EXPECT_EQ(f.count("seed"), 0u);
  EXPECT_THROW(fields_from_json(nlohmann::json::parse(R"({"prompt":{"a":1}})")), ApiError);
  EXPECT_THROW(fields_from_json(nlohmann::json::parse(R"([1])")), ApiError);
  try {
    fields_from_json(nlohmann::json::parse(R"({"prompt":"p","input_reference":"/etc/passwd"})"));
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "input_reference");
  }
}

TEST(ServeRequests, SecondsBecome4nPlus1Frames) {
  EXPECT_EQ(frames_for_seconds(0.25, 16), 5);
  EXPECT_EQ(frames_for_seconds(5, 16), 81);
  EXPECT_EQ(frames_for_seconds(4, 24), 97);
  EXPECT_EQ(frames_for_seconds(0.1, 16), 1);
  EXPECT_EQ(frames_for_seconds(0, 16), 1);
  EXPECT_EQ((frames_for_seconds(3.3, 24) - 1) % 4, 0);
}

TEST(ServeRequests, ErrorObjectsHaveOpenAIsShape) {
  const nlohmann::json b = ApiError(400, "bad", "steps", "invalid_value").body();
  EXPECT_EQ(b["error"]["message"], "bad");
  EXPECT_EQ(b["error"]["type"], "invalid_request_error");
  EXPECT_EQ(b["error"]["param"], "steps");
  EXPECT_EQ(b["error"]["code"], "invalid_value");
  const nlohmann::json n = ApiError(404, "gone").body();
  EXPECT_TRUE(n["error"]["param"].is_null());
  EXPECT_TRUE(n["error"]["code"].is_null());
  EXPECT_EQ(ApiError(401, "").type(), "authentication_error");
  EXPECT_EQ(ApiError(429, "").type(), "rate_limit_error");
  EXPECT_EQ(ApiError(503, "").type(), "service_unavailable_error");
}

TEST(ServeRequests, VideoObjectsShowStateAndError) {
  JobInfo j;
  j.id = "video_1";
  j.state = JobState::Failed;
  j.error_code = "timeout";
  j.error_message = "too long";
  j.expires_at = 5;
  const nlohmann::json o = video_object(j);
  EXPECT_EQ(o["object"], "video");
  EXPECT_EQ(o["status"], "failed");
  EXPECT_EQ(o["error"]["code"], "timeout");
  EXPECT_TRUE(o["completed_at"].is_null());
  EXPECT_EQ(o["expires_at"], 5);
  EXPECT_TRUE(o["timings"]["first_step_s"].is_null());  // never reached
  EXPECT_TRUE(o["timings"]["run_s"].is_number());        // finished (failed)
  j.state = JobState::InProgress;
  j.queue_seconds = 0.5;
  j.first_step_seconds = 0.75;
  EXPECT_EQ(video_object(j)["status"], "in_progress");
  EXPECT_TRUE(video_object(j)["error"].is_null());
  EXPECT_EQ(video_object(j)["timings"]["queue_s"], 0.5);
  EXPECT_EQ(video_object(j)["timings"]["first_step_s"], 0.75);
  EXPECT_TRUE(video_object(j)["timings"]["run_s"].is_null());  // still running
  EXPECT_TRUE(video_object(j)["timings"]["worker"].is_null());
  j.worker = 1;
  EXPECT_EQ(video_object(j)["timings"]["worker"], 1);
}

TEST(ServeRequests, KeysCompareWhole) {
  EXPECT_TRUE(key_matches("secret", "secret"));
  EXPECT_FALSE(key_matches("secreT", "secret"));
  EXPECT_FALSE(key_matches("secret2", "secret"));
  EXPECT_FALSE(key_matches("secre", "secret"));
  EXPECT_FALSE(key_matches("", "secret"));
}

TEST(ServeRequests, DurationsAndServeOptions) {
  EXPECT_DOUBLE_EQ(api::parse_duration("90", "d"), 90);
  EXPECT_DOUBLE_EQ(api::parse_duration("1.5m", "d"), 90);
  EXPECT_DOUBLE_EQ(api::parse_duration("24h", "d"), 86400);
  EXPECT_DOUBLE_EQ(api::parse_duration("7d", "d"), 604800);
  for (const char* bad : {"", "x", "5w", "-3", "1e999"}) EXPECT_THROW(api::parse_duration(bad, "d"), OptionError) << bad;
  const char* argv[] = {"serve", "--weights", "random", "--config", "tiny", "--port", "0", "--retention", "2h"};
  const api::Values v = api::parse_argv(api::serve_spec(), 9, const_cast<char**>(argv));
  EXPECT_EQ(v.get_int("port", -1), 0);
  const api::Values g = api::generate_base_values(v);
  EXPECT_EQ(g.get_or("config", ""), "tiny");
  const char* bad[] = {"serve", "--retention", "soon"};
  EXPECT_THROW(api::parse_argv(api::serve_spec(), 3, const_cast<char**>(bad)), OptionError);
  const char* port[] = {"serve", "--port", "70000"};
  EXPECT_THROW(api::parse_argv(api::serve_spec(), 3, const_cast<char**>(port)), OptionError);
}

// A --lora-dir with a tiny-DiT LoRA (a.safetensors, sub/b.safetensors), a file that is no LoRA, a
// symlink inside (in.safetensors -> a) and one that leads out (out.safetensors -> ../outside.safetensors).
struct LoraDir {
  std::filesystem::path root, dir;
  LoraDir() {
    namespace fs = std::filesystem;
    root = fs::temp_directory_path() / ("wan_serve_loras_" + new_job_id());
    dir = root / "loras";
    fs::create_directories(dir / "sub");
    gen::MakeLoraOptions o;
    o.dit = model_preset("tiny").dit;
    o.rank = 2;
    for (const fs::path& p : {dir / "a.safetensors", dir / "sub" / "b.safetensors", root / "outside.safetensors"}) {
      o.out = p.string();
      gen::make_lora(o);
    }
    std::ofstream(dir / "junk.safetensors") << "not a safetensors file";
    fs::create_symlink("a.safetensors", dir / "in.safetensors");
    fs::create_symlink("../outside.safetensors", dir / "out.safetensors");
  }
  ~LoraDir() { std::filesystem::remove_all(root); }
  ServedModel model() const {
    ServedModel m = tiny();
    m.lora_dir = std::filesystem::weakly_canonical(dir).string();
    return m;
  }
};

ApiError lora_error_of(const ServedModel& m, const std::string& loras, bool plan = false) {
  try {
    VideoRequest r = parse_video_request({{"prompt", "x"}, {"size", "64x64"}, {"num_frames", "5"}, {"loras", loras}}, m, "");
    if (plan) plan_video_request(r, m);
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "");
}

TEST(ServeRequests, LoraNamesResolveOnlyInsideTheLoraDir) {
  const LoraDir d;
  const std::string dir = d.model().lora_dir;
  EXPECT_EQ(resolve_lora(dir, "a.safetensors"), dir + "/a.safetensors");
  EXPECT_EQ(resolve_lora(dir, "sub/b.safetensors"), dir + "/sub/b.safetensors");
  EXPECT_EQ(resolve_lora(dir, "in.safetensors"), dir + "/a.safetensors");  // a symlink that stays inside
  struct Case {
    std::string name, code;
  } refused[] = {
      {"/etc/passwd", "invalid_value"},
      {(d.root / "outside.safetensors").string(), "invalid_value"},  // absolute, though it exists
      {"../outside.safetensors", "invalid_value"},
      {"sub/../a.safetensors", "invalid_value"},  // ".." anywhere, even when it would stay inside
      {"out.safetensors", "invalid_value"},       // a symlink that leads out
      {"missing.safetensors", "lora_not_found"},
      {"sub", "lora_not_found"},  // a folder
      {"", "invalid_value"},
  };
  for (const Case& c : refused) {
    try {
      resolve_lora(dir, c.name);
      ADD_FAILURE() << "resolved " << c.name;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << c.name;
      EXPECT_EQ(e.param, "loras") << c.name;
      EXPECT_EQ(e.code, c.code) << c.name << ": " << e.message;
      EXPECT_EQ(e.message.find(dir), std::string::npos) << e.message;  // no server path in the answer
    }
  }
  EXPECT_EQ(lora_error_of(tiny(), R"([{"name":"a.safetensors"}])").code, "loras_not_enabled");  // no --lora-dir
}

TEST(ServeRequests, LorasBecomeTheCliLoraOptions) {
  const LoraDir d;
  const ServedModel m = d.model();
  VideoRequest r = parse_video_request(
      {{"prompt", "x"}, {"size", "64x64"}, {"num_frames", "5"}, {"steps", "2"},
       {"loras", R"([{"name":"a.safetensors","scale":0.5,"expert":"high"},"sub/b.safetensors:0.25",{"name":"in.safetensors","expert":"low"}])"}},
      m, "");
  ASSERT_EQ(r.opts.loras.size(), 3u);  // generate's order: --lora, then --lora-high, then --lora-low
  EXPECT_EQ(r.opts.loras[0].path, m.lora_dir + "/sub/b.safetensors");
  EXPECT_EQ(r.opts.loras[0].expert, LoraExpert::All);
  EXPECT_FLOAT_EQ(r.opts.loras[0].strength, 0.25f);
  EXPECT_EQ(r.opts.loras[1].path, m.lora_dir + "/a.safetensors");
  EXPECT_EQ(r.opts.loras[1].expert, LoraExpert::High);
  EXPECT_FLOAT_EQ(r.opts.loras[1].strength, 0.5f);
  EXPECT_EQ(r.opts.loras[2].expert, LoraExpert::Low);
  EXPECT_FLOAT_EQ(r.opts.loras[2].strength, 1.0f);
  plan_video_request(r, m);  // the plan reads and checks the files against the tiny DiT
  ASSERT_TRUE(r.plan);
  EXPECT_EQ(r.plan->loras.size(), 3u);
  EXPECT_TRUE(r.plan->lora_high || r.plan->lora_low);
  // The string form (one multipart value) and a single object.
  EXPECT_EQ(parse_loras("a.safetensors:0.75").at(0).scale, 0.75);
  EXPECT_EQ(parse_loras(R"({"name":"a.safetensors"})").at(0).scale, 1.0);
  EXPECT_EQ(parse_loras(loras_from_form({"a.safetensors:2", R"([{"name":"b","scale":"0.5"}])"})).size(), 2u);
  // Malformed lists name the param; a file that is no LoRA fails its plan with a 400 that shows no path.
  for (const char* bad : {R"([{"name":"a.safetensors","scale":"big"}])", R"([{"name":"a.safetensors","expert":"mid"}])",
                          R"([{"file":"a.safetensors"}])", R"([{"scale":1}])", R"([1])", R"([{"name":"a.safetensors","scale":1e9}])"}) {
    const ApiError e = lora_error_of(m, bad);
    EXPECT_EQ(e.status, 400) << bad;
    EXPECT_EQ(e.param, "loras") << bad << ": " << e.message;
  }
  const ApiError junk = lora_error_of(m, R"(["junk.safetensors"])", true);
  EXPECT_EQ(junk.status, 400) << junk.message;
  EXPECT_EQ(junk.param, "loras") << junk.message << " / " << junk.code;
  EXPECT_EQ(junk.message.find(m.lora_dir), std::string::npos) << junk.message;
  EXPECT_NE(junk.message.find("junk.safetensors"), std::string::npos) << junk.message;
  // JSON bodies keep "loras" as an array.
  const Fields f = fields_from_json(nlohmann::json::parse(R"({"prompt":"p","loras":[{"name":"a"}]})"));
  EXPECT_EQ(nlohmann::json::parse(f.at("loras")).size(), 1u);
}

}  // namespace
