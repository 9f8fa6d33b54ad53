// `wan serve`: the HTTP server (src/server) over the job queue. Order: parse options, plan a small
// probe request (a model that cannot be planned exits 2 before listening), open the job store (restart:
// interrupted jobs become failed), listen, then wait for SIGTERM / SIGINT on this thread: stop taking
// jobs (503), let the running one finish within --drain-timeout or cancel it, stop, exit 0; a second
// signal exits at once (128 + signal).
// The signals are blocked in every thread and taken with sigwait, so no handler runs inside the server.
// Jobs run with the server's resident models (server::ResidentRunner, pipeline/model_cache.h), one
// worker per model instance (server/instances.h: a replica per GPU, or parallel layouts).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "api/commands.h"
#include "api/serve_options.h"
#include "cli/commands.h"
#include "formats/video.h"
#include "server/http_server.h"
#include "server/instances.h"
#include "server/jobs.h"

namespace wan::cli {

namespace {
// The served model's id and frame rate from a small plan of the serve options' model. A model that
// needs an image (i2v-A14B) is planned again with a grey probe image written to the output folder.
void probe_model(server::ServedModel& m, const api::Values& v, const std::string& dir) {
  api::Values g = m.base;
  g.set("prompt", "probe");
  g.set("size", "256x256");
  g.set("frames", "5");
  g.set("steps", "1");
  GeneratePlan plan;
  try {
    plan = plan_generate(api::generate_options(g, nullptr));
  } catch (const Error& first) {
    const std::vector<uint8_t> grey(256 * 256 * 3, 128);
    VideoWriteOptions vo;
    vo.overwrite_frames = true;
    write_video_rgb8(dir + "/.probe.png", grey.data(), 1, 256, 256, 16, vo);  // one frame: .probe_00000.png
    const std::string probe = png_sequence_paths(dir + "/.probe.png", 1).at(0);
    g.set("image", probe);
    try {
      plan = plan_generate(api::generate_options(g, nullptr));
    } catch (const Error&) {
      std::filesystem::remove(probe);
      throw first;  // the model's own problem, as without the image
    }
    std::filesystem::remove(probe);
  }
  m.fps = plan.fps;
  m.id = v.get_or("served-model-name", cat("wan2.2-", task_name(plan.task)));
}
}  // namespace

int cmd_serve(int argc, char** argv) {
  const api::CommandSpec& spec = api::serve_spec();
  const api::Values v = api::parse_argv(spec, argc, argv);
  if (api::print_help_if_asked(v, spec)) return 0;
  WAN_CHECK(v.positional().empty(), "serve takes no positional arguments");
  WAN_CHECK(server::http_available(), server::kNoHttp);
  ParallelArgs ia;
  ia.gpus = v.get_or("gpus", "");
  ia.devices = v.get_or("devices", "");
  ia.cfg = v.flag("cfg-parallel");
  ia.ulysses = v.get("ulysses");
  ia.ring = v.get("ring");
  ia.device = v.get("device");
  const server::Instances instances = server::plan_instances(ia);
  api::Values base = api::generate_base_values(v);
  if (instances.active()) base.set("device", cat("cuda:", instances.groups[0][0]));  // where requests are planned
  server::ServedModel model(base);
  model.parallel = instances.layout.active();
  model.max_prompt = static_cast<size_t>(v.get_int("max-prompt", 10000));
  if (auto dir = v.get("lora-dir")) {
    std::error_code lec;
    WAN_CHECK_OPTION("lora-dir", std::filesystem::is_directory(*dir, lec), "{} ", *dir, ": not a folder");
    model.lora_dir = std::filesystem::weakly_canonical(*dir).string();
  }
  const std::string out_dir = v.str("output-dir");
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  WAN_CHECK(!ec, "--output-dir ", out_dir, ": cannot create it: ", ec.message());
  probe_model(model, v, out_dir);
  const bool quiet = v.flag("quiet");

  // Before any thread exists: every thread inherits the blocked set, sigwait below takes them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  server::QueueConfig qc;
  qc.dir = out_dir;
  qc.max_queue = static_cast<size_t>(v.get_int("max-queue", 16));
  qc.retention_s = api::parse_duration(v.str("retention"), "retention");
  qc.job_timeout_s = api::parse_duration(v.str("job-timeout"), "job-timeout");
  qc.video_ext = video_have_ffmpeg() ? ".mp4" : ".y4m";
  std::vector<std::unique_ptr<server::JobRunner>> runners;
  if (!instances.active()) {
    runners.push_back(std::make_unique<server::ResidentRunner>(""));
  } else {
    for (const std::vector<int>& g : instances.groups) {
      if (model.parallel) runners.push_back(std::make_unique<server::ParallelRunner>(g, instances.layout));
      else runners.push_back(std::make_unique<server::ResidentRunner>(cat("cuda:", g[0])));
    }
    if (!quiet) fprintf(stderr, "wan serve: %s\n", instances.describe().c_str());
  }
  if (!v.flag("no-preload")) {  // the models of a request of the default size and frames
    api::Values g = model.base;
    g.set("prompt", "preload");
    try {
      GenerateOptions o = api::generate_options(g, nullptr);
      o.plan_as_owner = true;
      o.parallel = model.parallel;
      std::vector<std::future<double>> loads;  // each instance on its own GPUs, at once
      for (const auto& r : runners)
        loads.push_back(std::async(std::launch::async, [r = r.get(), o] { return r->preload(o); }));
      double s = 0;
      for (auto& f : loads) s = std::max(s, f.get());
      if (!quiet) fprintf(stderr, "wan serve: models resident in %.1f s\n", s);
    } catch (const Error& e) {  // e.g. a task that needs an image: the first job loads them
      fprintf(stderr, "wan serve: models load with the first job (%s)\n", e.what());
    }
  }
  std::vector<server::JobRunner*> workers;
  for (const auto& r : runners) workers.push_back(r.get());
  server::JobQueue jobs(qc, workers);
  for (const std::string& n : jobs.load_notes()) fprintf(stderr, "wan serve: %s\n", n.c_str());

  server::HttpConfig hc;
  hc.host = v.str("host");
  hc.port = static_cast<int>(v.get_int("port", 8000));
  const char* env_key = std::getenv("WAN_API_KEY");
  hc.api_key = v.get_or("api-key", env_key ? env_key : "");
  hc.max_body = static_cast<size_t>(v.get_int("max-body-mb", 32)) << 20;
  hc.request_timeout_s = api::parse_duration(v.str("request-timeout"), "request-timeout");
  if (instances.active()) {
    for (const std::vector<int>& g : instances.groups) hc.devices.insert(hc.devices.end(), g.begin(), g.end());
  } else if (const int d = v.device("device"); d >= 0) {
    hc.devices.push_back(d);
  }
  hc.video_content_type = video_have_ffmpeg() ? "video/mp4" : "video/x-yuv4mpeg";
  if (!quiet) hc.log = [](const std::string& s) { fprintf(stderr, "wan serve: %s\n", s.c_str()); };
  server::HttpServer http(hc, model, jobs);
  const int port = http.bind();
  printf("wan serve: listening on http://%s:%d (model %s, %zu jobs on record, %s)\n", hc.host.c_str(), port,
         model.id.c_str(), jobs.list().size(), hc.api_key.empty() ? "no API key" : "API key required");
  fflush(stdout);
  std::thread serving([&] { http.serve(); });

  int sig = 0;
  sigwait(&stop_signals, &sig);
  const double drain = api::parse_duration(v.str("drain-timeout"), "drain-timeout");
  fprintf(stderr, "wan serve: %s: draining (up to %g s for the running job)\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
          drain);
  std::thread([&stop_signals] {  // a second signal ends the process at once, as in the other commands
    int again = 0;
    sigwait(&stop_signals, &again);
    fprintf(stderr, "wan serve: second signal: exiting without draining\n");
    std::_Exit(128 + again);
  }).detach();
  http.begin_drain();
  const bool finished = jobs.shutdown(drain);
  http.stop();
  serving.join();
  fprintf(stderr, "wan serve: stopped (%s)\n", finished ? "no job cut short" : "the running job was cancelled");
  return 0;
}

}  // namespace wan::cli
