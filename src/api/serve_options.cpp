// serve's and a video request's tables (see serve_options.h). The shared rows are looked up in
// generate's table by name and copied, so a change to generate's check reaches the server too.
#include "api/serve_options.h"

#include <cmath>
#include <cstdlib>

#include "api/commands.h"

namespace wan::api {
namespace {

// The generate rows serve takes over unchanged: which weights, where they run, how.
const char* const kModelRows[] = {"model", "dit-high", "dit-low", "dit", "text-encoder", "vae", "tokenizer",
                                  "weights", "weights-seed", "config", "layers", "task", "device", "attention",
                                  "gemm", "precision", "keep-text-encoder", "memory-budget",
                                  "host-memory-budget", "vae-tile"};

// Generate rows whose value in serve is the default of every request (and the preloaded models' shape).
const char* const kRequestDefaultRows[] = {"size", "frames"};

Option generate_row(const std::string& name) {
  const Option* o = find_option(generate_spec(), name);
  WAN_ASSERT(o != nullptr, "generate has no row ", name);
  return *o;
}

// A generate row under the API's name (the check and range stay generate's).
Option renamed(const std::string& from, const std::string& to, const std::string& help) {
  Option o = generate_row(from);
  o.name = to;
  o.aliases.clear();
  o.help = help;
  return o;
}

Option duration_row(std::string name, std::string def, std::string help) {
  Option o = option(std::move(name), Kind::String, "DURATION", std::move(def), std::move(help));
  const std::string key = o.name;
  o.check = [key](const std::string& s) {
    (void)parse_duration(s, key);
    return std::string();
  };
  return o;
}

Option int_row(std::string name, std::string meta, std::string def, std::string help, double lo, double hi) {
  Option o = option(std::move(name), Kind::Int, std::move(meta), std::move(def), std::move(help));
  o.min = lo;
  o.max = hi;
  return o;
}

}  // namespace

double parse_duration(const std::string& s, const std::string& key) {
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  const std::string unit = end ? std::string(end) : "";
  double scale = 0;
  if (unit.empty() || unit == "s") scale = 1;
  else if (unit == "m") scale = 60;
  else if (unit == "h") scale = 3600;
  else if (unit == "d") scale = 86400;
  if (s.empty() || end == s.c_str() || scale == 0 || !std::isfinite(x) || x < 0)
    throw OptionError(key, cat("{}: expected a duration such as 90, 90s, 15m, 24h or 7d, got '", s, "'"));
  return x * scale;
}

const CommandSpec& serve_spec() {
  static const CommandSpec s = [] {
    CommandSpec c;
    c.name = "serve";
    c.summary = "an HTTP server with the OpenAI Videos API shape and a job queue";
    c.usage = {"serve --model DIR [--host 127.0.0.1] [--port 8000] [options]",
               "serve --weights random --config tiny [options]   (tests)"};
    c.about =
        "Serves POST/GET/DELETE /v1/videos, GET /v1/videos/{id}/events (server-sent events), GET /v1/models, "
        "/health, /ready and /metrics (docs/openapi.yaml). Requests are checked with generate's rules and planned before they are queued (bad ones get 400 at once); one worker per "
        "model instance (one GPU, or a parallel layout's GPUs) takes the jobs in order. SIGTERM / SIGINT: stop accepting, let the running job finish within "
        "--drain-timeout or cancel it, exit 0.";
    for (const char* n : kModelRows) c.options.push_back(generate_row(n));
    for (const char* n : kRequestDefaultRows) {
      c.options.push_back(generate_row(n));
      c.options.back().help += "; the default of a request that gives none, and the shape the models are preloaded for "
                               "(one DiT serves every request up to its shape)";
    }
    Option gpus = generate_row("gpus");
    gpus.help =
        "serve on several GPUs: a replica of the models on each (one worker per GPU, models resident between "
        "jobs), or with --cfg-parallel / --ulysses U / --ring R instances of that layout's GPUs (cfg x U x R "
        "consecutive GPUs each; every job runs split over its instance and loads its models)";
    c.options.push_back(gpus);
    for (const char* n : {"devices", "cfg-parallel", "ulysses", "ring"}) c.options.push_back(generate_row(n));
    c.options.back().help = "ring attention over R GPUs (each instance: cfg x U x R GPUs; a flag not given is 1)";
    c.options.push_back(option("host", Kind::String, "ADDR", "127.0.0.1", "address to listen on (loopback by default)"));
    c.options.push_back(int_row("port", "N", "8000", "TCP port; 0 picks a free one (printed)", 0, 65535));
    c.options.push_back(option("api-key", Kind::String, "KEY", "$WAN_API_KEY",
                               "require 'Authorization: Bearer KEY' on /v1/* and /metrics (none: open)"));
    c.options.push_back(option("output-dir", Kind::Path, "DIR", "wan-serve",
                               "videos, uploaded images and job records (created if missing)"));
    c.options.push_back(option("served-model-name", Kind::String, "NAME", "wan2.2-<task>",
                               "the model id of /v1/models and of the requests' 'model'"));
    c.options.push_back(int_row("max-queue", "N", "16", "jobs waiting at most (more: 429)", 1, 1000000));
    c.options.push_back(duration_row("retention", "24h", "keep finished jobs and their videos this long"));
    c.options.push_back(duration_row("drain-timeout", "60s", "on SIGTERM, wait this long for the running job"));
    c.options.push_back(duration_row("job-timeout", "1h", "a job running longer fails (0: no limit)"));
    c.options.push_back(int_row("max-body-mb", "N", "32", "largest request body in MiB (more: 413)", 1, 4096));
    c.options.push_back(int_row("max-prompt", "N", "10000", "longest prompt in bytes (more: 400)", 1, 1e7));
    c.options.push_back(option("lora-dir", Kind::Path, "DIR", "",
                               "LoRA files a request may name in 'loras' (names resolve only inside DIR; "
                               "none: requests with loras get 400)"));
    c.options.push_back(duration_row("request-timeout", "30s",
                                     "a client that sends or reads nothing this long is disconnected"));
    c.options.push_back(flag_option("no-preload", "load the models with the first job instead of at start (at "
                                                  "start: those of a request of the default size and frames)"));
    c.options.push_back(flag_option("quiet", "no log lines on stderr"));
    c.epilog = "Exit codes: 0 stopped by SIGTERM / SIGINT after draining, 1 internal error, 2 bad options or a\n"
               "model that cannot be planned.\n";
    return c;
  }();
  return s;
}

// The request fields that are generate rows under their API names, in the order of the request table:
// the rows are copied from generate's (so the checks are generate's), and requests.cpp sets each field
// on generate's Values under generate's name. "prompt" is the request's own row (required, documented
// as the API's) but passes on the same way.
const std::vector<RequestRename>& video_request_renames() {
  static const std::vector<RequestRename> r = {
      {"prompt", "prompt", ""},
      {"size", "size", "WxH"},
      {"negative_prompt", "negative-prompt", ""},
      {"seed", "seed", ""},
      {"steps", "steps", ""},
      {"guidance_scale", "guide-scale", "G or low,high"},
      {"shift", "shift", ""},
      {"sampler", "sampler", ""},
      {"num_frames", "frames", "4n+1"},
      {"preset", "preset", ""},
  };
  return r;
}

const CommandSpec& video_request_spec() {
  static const CommandSpec s = [] {
    CommandSpec c;
    c.name = "POST /v1/videos";
    c.options.push_back(option("prompt", Kind::String, "TEXT", "", "the prompt"));
    c.options.back().required = true;
    c.options.push_back(option("model", Kind::String, "NAME", "", "the served model's id"));
    Option seconds = option("seconds", Kind::Float, "S", "", "frames = seconds * fps + 1, rounded to 4n+1");
    seconds.min = 0;
    seconds.max = 3600;
    c.options.push_back(seconds);
    c.options.push_back(int_row("fps", "N", "", "must be the model's frame rate (used with seconds)", 1, 1000));
    for (const RequestRename& r : video_request_renames()) {
      if (r.field == "prompt") continue;
      Option o = renamed(r.generate, r.field, r.help);
      if (r.field == "seed") {
        o.min = 0;
        o.max = 9007199254740991.0;  // 2^53 - 1: exact in every JSON client
      }
      c.options.push_back(o);
    }
    // LoRA files by name under serve's --lora-dir, with scales: a JSON array of {name, scale, expert}
    // or "name[:scale]" strings, or one such string. Parsed, resolved inside --lora-dir and passed on
    // as generate's --lora rows by the server (server/requests.h parse_loras, resolve_lora), which
    // needs the folder this table does not know.
    c.options.push_back(option("loras", Kind::String, "LIST", "", "LoRAs under --lora-dir: [{name, scale, expert}]"));
    return c;
  }();
  return s;
}

Values generate_base_values(const Values& serve) {
  Values g(generate_spec());
  for (const char* n : kModelRows)
    if (serve.has(n)) g.set(n, *serve.get(n));
  for (const char* n : kRequestDefaultRows)
    if (serve.has(n)) g.set(n, *serve.get(n));
  return g;
}

}  // namespace wan::api
