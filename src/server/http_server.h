// The HTTP face of `wan serve` (cpp-httplib: a small, well-kept library in Debian that the llama.cpp
// and stable-diffusion.cpp servers also use). Routes: POST/GET/DELETE /v1/videos[/{id}[/content]],
// GET /v1/models, /health, /ready, /metrics. Every error is OpenAI's error object with its status.
// GET /v1/videos/{id}/events streams the video object (server-sent events) on each change until the job
// ends. The library's types stay in http_server.cpp; the job layer (jobs.h) knows nothing of HTTP.
// docs/openapi.yaml describes the API; tests/e2e/serve_schema.py holds the server to it.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/jobs.h"
#include "server/requests.h"

namespace wan::server {

struct HttpConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                  // 0: any free port
  std::string api_key;              // empty: no authentication
  size_t max_body = 32u << 20;      // bytes; larger bodies get 413
  std::string video_content_type = "video/mp4";
  double request_timeout_s = 30;    // a connection that sends or takes nothing this long is closed
  std::vector<int> devices;         // the models' CUDA devices for /metrics (none: CPU, host memory only)
  std::function<void(const std::string&)> log;  // one line per request; may be empty
};

class HttpServer {
 public:
  HttpServer(HttpConfig cfg, const ServedModel& model, JobQueue& jobs);
  ~HttpServer();
  int bind();           // binds and returns the port (throws wan::Error when it cannot)
  void serve();         // handles requests until stop()
  void begin_drain();   // from now on POST /v1/videos and /ready answer 503
  void stop();
  std::string metrics() const;  // the /metrics text

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The video object of the API for a job.
nlohmann::json video_object(const JobInfo& j);
// Memory for /metrics: the process's resident set, and each device's when the models run on CUDA.
struct MemoryGauges {
  int64_t host_rss_bytes = -1;  // -1: unknown (not Linux)
  struct Device {
    int index = 0;
    int64_t used_bytes = -1, total_bytes = -1;  // cudaMemGetInfo: total - free, total
  };
  std::vector<Device> devices;
};
MemoryGauges memory_gauges(const std::vector<int>& devices);
// The /metrics text (Prometheus exposition format) of the queue's counters and the memory gauges.
std::string metrics_text(const QueueStats& s, bool draining, const MemoryGauges& mem = {});

// False in a build without cpp-httplib: HttpServer then throws kNoHttp, and `wan serve` refuses with it
// before it loads anything.
bool http_available();
inline constexpr const char* kNoHttp =
    "wan serve: this build has no HTTP library (cpp-httplib); install libcpp-httplib-dev (scripts/setup.sh) "
    "and rebuild";

}  // namespace wan::server
