// Routes of `wan serve` (see http_server.h). A POST is parsed, planned and queued before it is
// answered; reads answer from the job store; content is streamed from the file with Range support.
#include "server/http_server.h"

#ifdef WAN_HAVE_HTTPLIB
#include <httplib.h>
#include <sys/socket.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "formats/output_file.h"

namespace wan::server {

#ifdef WAN_HAVE_HTTPLIB

bool http_available() { return true; }

namespace {

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(e.body().dump(), "application/json");
}

// cpp-httplib 0.11 applies a request's Range to whatever body a routed handler answers, an error object
// included (a 400 came back as multipart/byteranges slices of the JSON). Only a video is ranged, so an
// answer that is not one forgets the Range. The Request is the server's own mutable object, handed to
// handlers as const.
void ignore_range(const httplib::Request& req) { const_cast<httplib::Request&>(req).ranges.clear(); }

void send_json(httplib::Response& res, const nlohmann::json& j, int status = 200) {
  res.status = status;
  res.set_content(j.dump(), "application/json");
}

// The uploaded image's extension, from its declared type or its file name; only image types.
std::string image_extension(const httplib::MultipartFormData& f) {
  static const std::pair<const char*, const char*> kTypes[] = {
      {"image/png", ".png"}, {"image/jpeg", ".jpg"}, {"image/webp", ".webp"}, {"image/bmp", ".bmp"}};
  for (const auto& [type, ext] : kTypes)
    if (f.content_type == type) return ext;
  std::string ext = std::filesystem::path(f.filename).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* ok : {".png", ".jpg", ".jpeg", ".webp", ".bmp"})
    if (ext == ok) return ext;
  throw ApiError(400, "input_reference: expected a PNG, JPEG, WebP or BMP image", "input_reference", "invalid_value");
}

}  // namespace

// Debian's libcpp-httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into the
// library): a burst of clients then overflows the accept queue and a few connections are reset. A second
// listen() on the bound socket raises it (Linux updates the backlog of a listening socket).
class Listener : public httplib::Server {
 public:
  void widen_backlog() { ::listen(svr_sock_, 1024); }
};

struct HttpServer::Impl {
  HttpConfig cfg;
  const ServedModel& model;
  JobQueue& jobs;
  Listener svr;
  std::atomic<bool> draining{false};
  int64_t started_at = unix_now();

  Impl(HttpConfig c, const ServedModel& m, JobQueue& q) : cfg(std::move(c)), model(m), jobs(q) {}
  void routes();
  void create(const httplib::Request& req, httplib::Response& res);
  void content(const std::string& id, httplib::Response& res);
  void list(const httplib::Request& req, httplib::Response& res);
  void events(const std::string& id, httplib::Response& res);
  bool authorised(const httplib::Request& req) const;
};

bool HttpServer::Impl::authorised(const httplib::Request& req) const {
  if (cfg.api_key.empty()) return true;
  const std::string h = req.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  const std::string token = h.rfind(prefix, 0) == 0 ? h.substr(prefix.size()) : "";
  return key_matches(token, cfg.api_key);
}

void HttpServer::Impl::create(const httplib::Request& req, httplib::Response& res) {
  const auto received = std::chrono::steady_clock::now();  // the body is in: parsing and planning count
  if (draining) throw ApiError(503, "the server is shutting down", "", "shutting_down");
  std::map<std::string, std::string> fields;
  const httplib::MultipartFormData* image = nullptr;
  if (req.is_multipart_form_data()) {
    std::vector<std::string> loras;  // repeatable; the OpenAI SDK sends a list in extra_body as "loras[]"
    for (const auto& [name, part] : req.files) {
      if (name == "input_reference") image = &part;
      else if (!part.filename.empty()) throw ApiError(400, cat("'", name, "': only input_reference may be a file"), name);
      else if (name == "loras" || name == "loras[]") loras.push_back(part.content);
      else fields[name] = part.content;
    }
    if (!loras.empty()) fields["loras"] = loras_from_form(loras);
  } else if (req.get_header_value("Content-Type").rfind("application/json", 0) == 0) {
    nlohmann::json body;
    try {
      body = nlohmann::json::parse(req.body);
    } catch (const std::exception& e) {
      throw ApiError(400, cat("the body is not valid JSON: ", e.what()), "", "invalid_json");
    }
    fields = fields_from_json(body);
  } else {
    throw ApiError(400, "Content-Type must be application/json or multipart/form-data", "", "invalid_content_type");
  }
  JobInfo pre;
  pre.id = new_job_id();
  std::string image_path;
  struct Cleanup {  // the uploaded copy goes unless the job took it
    std::string path;
    ~Cleanup() {
      std::error_code ec;
      if (!path.empty()) std::filesystem::remove(path, ec);
    }
  } cleanup;
  if (image) {
    const std::string file = pre.id + ".input" + image_extension(*image);
    image_path = jobs.path_of(file);
    OutputFile f(image_path, "input_reference");
    f.write(image->content.data(), image->content.size());
    f.commit();
    cleanup.path = image_path;
    pre.input_file = file;
  }
  VideoRequest r = parse_video_request(fields, model, image_path);
  plan_video_request(r, model);
  r.info.id = pre.id;
  r.info.input_file = pre.input_file;
  switch (jobs.submit(r.info, std::move(r.opts), std::move(r.plan), received)) {
    case JobQueue::Submit::Full:
      res.set_header("Retry-After", "10");
      throw ApiError(429, "the job queue is full; retry later", "", "queue_full");
    case JobQueue::Submit::Closed:
      throw ApiError(503, "the server is shutting down", "", "shutting_down");
    case JobQueue::Submit::Accepted:
      break;
  }
  cleanup.path.clear();
  if (cfg.log) cfg.log(cat("accepted ", r.info.id, " (", r.info.size, ", ", r.info.seconds, " s)"));
  send_json(res, video_object(r.info));
}

void HttpServer::Impl::content(const std::string& id, httplib::Response& res) {
  const auto j = jobs.get(id);
  if (!j) throw ApiError(404, cat("no video '", id, "'"), "video_id", "not_found");
  if (j->state != JobState::Completed)
    throw ApiError(400, cat("video '", id, "' is ", state_name(j->state), ", not completed"), "video_id",
                   "video_not_ready");
  const std::string path = jobs.path_of(j->video_file);
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw ApiError(404, cat("the video of '", id, "' has expired or was removed"), "video_id", "not_found");
  auto in = std::make_shared<std::ifstream>(path, std::ios::binary);
  res.set_content_provider(size, cfg.video_content_type,
                           [in](size_t offset, size_t length, httplib::DataSink& sink) {
                             std::vector<char> buf(std::min<size_t>(length, 1 << 20));
                             in->seekg(static_cast<std::streamoff>(offset));
                             in->read(buf.data(), static_cast<std::streamsize>(buf.size()));
                             const auto got = in->gcount();
                             return got > 0 && sink.write(buf.data(), static_cast<size_t>(got));
                           });
}

// Server-sent events: the video object as each event's data, first as it is now, then on every change of
// state or progress; the stream ends after a terminal state, or with an "error" event when the job is
// deleted. A comment line every 15 s keeps proxies from closing a quiet stream (and finds gone clients).
void HttpServer::Impl::events(const std::string& id, httplib::Response& res) {
  struct Stream {
    std::optional<JobInfo> last;
    std::chrono::steady_clock::time_point wrote = std::chrono::steady_clock::now();
  };
  auto st = std::make_shared<Stream>();
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, id, st](size_t, httplib::DataSink& sink) {
    const auto send = [&](const std::string& text) {
      st->wrote = std::chrono::steady_clock::now();
      return sink.write(text.data(), text.size());
    };
    // Short waits: the library checks for its own stop between calls, so a stopping server ends the stream.
    const std::optional<JobInfo> j = st->last ? jobs.wait_change(id, *st->last, 1.0) : jobs.get(id);
    if (!j) {
      send("event: error\ndata: " + ApiError(404, cat("video '", id, "' was deleted"), "video_id", "not_found").body().dump() + "\n\n");
      sink.done();
      return true;
    }
    if (st->last && j->state == st->last->state && j->progress == st->last->progress) {
      if (std::chrono::steady_clock::now() - st->wrote < std::chrono::seconds(15)) return true;
      return send(": keep-alive\n\n");
    }
    st->last = j;
    if (!send("data: " + video_object(*j).dump() + "\n\n")) return false;
    if (j->state == JobState::Completed || j->state == JobState::Failed) sink.done();
    return true;
  });
}

void HttpServer::Impl::list(const httplib::Request& req, httplib::Response& res) {
  long limit = 20;
  if (req.has_param("limit")) {
    const std::string s = req.get_param_value("limit");
    char* end = nullptr;
    limit = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end || limit < 1 || limit > 100)
      throw ApiError(400, "'limit': expected an integer in 1..100", "limit", "invalid_value");
  }
  const std::string order = req.has_param("order") ? req.get_param_value("order") : "desc";
  if (order != "asc" && order != "desc") throw ApiError(400, "'order': expected asc or desc", "order", "invalid_value");
  std::vector<JobInfo> all = jobs.list();
  if (order == "desc") std::reverse(all.begin(), all.end());
  size_t start = 0;
  if (req.has_param("after")) {
    const std::string after = req.get_param_value("after");
    auto it = std::find_if(all.begin(), all.end(), [&](const JobInfo& j) { return j.id == after; });
    if (it == all.end()) throw ApiError(400, cat("'after': no video '", after, "'"), "after", "invalid_value");
    start = static_cast<size_t>(it - all.begin()) + 1;
  }
  nlohmann::json data = nlohmann::json::array();
  for (size_t i = start; i < all.size() && data.size() < static_cast<size_t>(limit); ++i)
    data.push_back(video_object(all[i]));
  const bool more = start + data.size() < all.size();
  send_json(res, {{"object", "list"},
                  {"data", data},
                  {"first_id", data.empty() ? nlohmann::json() : data.front()["id"]},
                  {"last_id", data.empty() ? nlohmann::json() : data.back()["id"]},
                  {"has_more", more}});
}

// Wraps a handler: ApiError -> its object; anything else -> 500 with the message.
template <typename F>
httplib::Server::Handler guarded(F f) {
  return [f](const httplib::Request& req, httplib::Response& res) {
    try {
      f(req, res);
      if (!res.body.empty()) ignore_range(req);  // a JSON answer; the video is a content provider
      return;
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const std::exception& e) {
      send_error(res, ApiError(500, cat("internal: ", e.what())));
    }
    ignore_range(req);
  };
}

void HttpServer::Impl::routes() {
  // SO_REUSEADDR only: the library's default adds SO_REUSEPORT, which lets a second server bind the same
  // port and silently take half of the connections.
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  svr.set_payload_max_length(cfg.max_body);
  // A client that stops sending (or reading) holds a worker thread; past the timeout it is dropped.
  const auto secs = static_cast<time_t>(cfg.request_timeout_s);
  const auto usecs = static_cast<time_t>((cfg.request_timeout_s - static_cast<double>(secs)) * 1e6);
  svr.set_read_timeout(secs, usecs);
  svr.set_write_timeout(secs, usecs);
  svr.set_keep_alive_timeout(std::max<time_t>(1, std::min<time_t>(5, secs)));  // idle between requests
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const bool open = req.path == "/health" || req.path == "/ready";
    if (open || authorised(req)) return httplib::Server::HandlerResponse::Unhandled;
    ignore_range(req);
    res.set_header("WWW-Authenticate", "Bearer");
    send_error(res, ApiError(401, "a valid API key is required (Authorization: Bearer KEY)", "", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.set_error_handler([this](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler's own error object
    if (res.status == 413)
      send_error(res, ApiError(413, cat("the request body is larger than ", cfg.max_body, " bytes"), "", "body_too_large"));
    else if (res.status == 404)
      send_error(res, ApiError(404, "no such route", "", "not_found"));
    else if (res.status == 400) {  // refused by the HTTP library itself (bad framing, or a body that stalled)
      res.set_header("Connection", "close");  // the stream may be mid-body: nothing more on it is a request
      send_error(res, ApiError(400, "malformed request (HTTP framing or multipart/form-data body)", "", "invalid_request"));
    }
    else
      send_error(res, ApiError(res.status, cat("HTTP ", res.status)));
  });
  svr.Post("/v1/videos", guarded([this](const auto& req, auto& res) { create(req, res); }));
  svr.Get("/v1/videos", guarded([this](const auto& req, auto& res) { list(req, res); }));
  const auto find = [this](const std::string& id) {
    auto j = plausible_job_id(id) ? jobs.get(id) : std::nullopt;
    if (!j) throw ApiError(404, cat("no video '", id, "'"), "video_id", "not_found");
    return *j;
  };
  svr.Get(R"(/v1/videos/([^/]+))",
          guarded([find](const auto& req, auto& res) { send_json(res, video_object(find(req.matches[1]))); }));
  svr.Get(R"(/v1/videos/([^/]+)/content)", guarded([this, find](const auto& req, auto& res) {
            content(find(req.matches[1]).id, res);
          }));
  svr.Delete(R"(/v1/videos/([^/]+))", guarded([this, find](const auto& req, auto& res) {
               const std::string id = find(req.matches[1]).id;
               if (!jobs.remove(id)) throw ApiError(404, cat("no video '", id, "'"), "video_id", "not_found");
               if (cfg.log) cfg.log(cat("deleted ", id));
               send_json(res, {{"id", id}, {"object", "video.deleted"}, {"deleted", true}});
             }));
  svr.Get("/v1/models", guarded([this](const auto&, auto& res) {
            send_json(res, {{"object", "list"},
                            {"data", {{{"id", model.id}, {"object", "model"}, {"created", started_at}, {"owned_by", "wan"}}}}});
          }));
  svr.Get("/health", [](const auto&, auto& res) { send_json(res, {{"status", "ok"}}); });
  svr.Get("/ready", guarded([this](const auto&, auto& res) {
            if (draining || jobs.closed()) throw ApiError(503, "the server is shutting down", "", "shutting_down");
            send_json(res, {{"status", "ready"}});
          }));
  svr.Get(R"(/v1/videos/([^/]+)/events)", guarded([this, find](const auto& req, auto& res) {
            events(find(req.matches[1]).id, res);
          }));
  svr.Get("/metrics", [this](const auto&, auto& res) {
    res.set_content(metrics_text(jobs.stats(), draining, memory_gauges(cfg.devices)) + jobs.runner_metrics(),
                    "text/plain; version=0.0.4");
  });
}


HttpServer::HttpServer(HttpConfig cfg, const ServedModel& model, JobQueue& jobs)
    : impl_(std::make_unique<Impl>(std::move(cfg), model, jobs)) {
  impl_->routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  const int port = impl_->cfg.port == 0 ? impl_->svr.bind_to_any_port(impl_->cfg.host)
                                        : (impl_->svr.bind_to_port(impl_->cfg.host, impl_->cfg.port)
                                               ? impl_->cfg.port
                                               : -1);
  WAN_CHECK(port > 0, "cannot listen on ", impl_->cfg.host, ":", impl_->cfg.port, " (in use, or not an address here)");
  impl_->svr.widen_backlog();
  return port;
}

void HttpServer::serve() { impl_->svr.listen_after_bind(); }
void HttpServer::begin_drain() { impl_->draining = true; }
void HttpServer::stop() { impl_->svr.stop(); }
std::string HttpServer::metrics() const { return metrics_text(impl_->jobs.stats(), impl_->draining); }


#else  // a build without cpp-httplib: the rest of the engine builds; `wan serve` refuses in one line

bool http_available() { return false; }

struct HttpServer::Impl {};
HttpServer::HttpServer(HttpConfig, const ServedModel&, JobQueue&) { WAN_THROW(kNoHttp); }
HttpServer::~HttpServer() = default;
int HttpServer::bind() { WAN_THROW(kNoHttp); }
void HttpServer::serve() {}
void HttpServer::begin_drain() {}
void HttpServer::stop() {}
std::string HttpServer::metrics() const { return ""; }

#endif  // WAN_HAVE_HTTPLIB

}  // namespace wan::server
