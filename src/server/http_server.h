// The HTTP face of `wan serve` (cpp-httplib: a small, well-kept library in Debian that the llama.cpp
// and stable-diffusion.cpp servers also use). Routes: POST/GET/DELETE /v1/videos[/{id}[/content]],
// GET /v1/models, /health, /ready, /metrics. Every error is OpenAI's error object with its status.
// The library's types stay in http_server.cpp; the job layer (jobs.h) knows nothing of HTTP.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "server/jobs.h"
#include "server/requests.h"

namespace wan::server {

struct HttpConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                  // 0: any free port
  std::string api_key;              // empty: no authentication
  size_t max_body = 32u << 20;      // bytes; larger bodies get 413
  std::string video_content_type = "video/mp4";
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
// The /metrics text (Prometheus exposition format) of the queue's counters.
std::string metrics_text(const QueueStats& s, bool draining);

// False in a build without cpp-httplib: HttpServer then throws kNoHttp, and `wan serve` refuses with it
// before it loads anything.
bool http_available();
inline constexpr const char* kNoHttp =
    "wan serve: this build has no HTTP library (cpp-httplib); install libcpp-httplib-dev (scripts/setup.sh) "
    "and rebuild";

}  // namespace wan::server
