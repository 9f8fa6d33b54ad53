// A video request (POST /v1/videos) becomes GenerateOptions here, through the request table
// (api/serve_options.h) and generate's option rules, then plan_generate, so a request that cannot run
// is refused (400) before it is queued. Errors are ApiError: the OpenAI error object and its status.
// No field is a path; an uploaded input_reference is saved by the server under a name it chooses.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "api/options.h"
#include "pipeline/pipeline.h"
#include "server/jobs.h"

namespace wan::server {

// An error as OpenAI's API shows it: {"error": {"message", "type", "param", "code"}} with `status`.
struct ApiError : std::exception {
  ApiError(int status, std::string message, std::string param = "", std::string code = "")
      : status(status), message(std::move(message)), param(std::move(param)), code(std::move(code)) {}
  const char* what() const noexcept override { return message.c_str(); }
  std::string type() const;  // invalid_request_error, authentication_error, ... from the status
  nlohmann::json body() const;
  int status;
  std::string message, param, code;
};

// What the server serves: fixed at start from serve's options and a probe plan.
struct ServedModel {
  std::string id;        // /v1/models id; a request's "model" must equal it when given
  int fps = 16;          // the task's frame rate (seconds -> frames)
  api::Values base;      // generate Values with serve's model rows
  size_t max_prompt = 10000;
  explicit ServedModel(api::Values b) : base(std::move(b)) {}
};

struct VideoRequest {
  GenerateOptions opts;
  JobInfo info;  // model, prompt, size, seconds filled
  bool frames_from_seconds = false;  // a frame count the plan refuses is the 'seconds' field's fault
};

// A JSON body's fields as text (strings as they are, numbers printed, anything else refused).
std::map<std::string, std::string> fields_from_json(const nlohmann::json& body);

// Checks the fields against the request table and turns them into options (no planning yet).
// image_path: the server's copy of an uploaded input_reference ("" when none).
VideoRequest parse_video_request(const std::map<std::string, std::string>& fields, const ServedModel& m,
                                 const std::string& image_path);

// plan_generate on the request: a failure is ApiError 400 naming the reason. Fixes a random seed and
// fills info.size / info.seconds from the plan, so the job runs what was checked.
void plan_video_request(VideoRequest& r, const ServedModel& m);

// Frames of `seconds` at `fps`: seconds * fps + 1, rounded to the nearest 4n+1 (at least 1).
int frames_for_seconds(double seconds, int fps);

// Constant-time comparison of a presented bearer token with the key (length leaks, content does not).
bool key_matches(const std::string& presented, const std::string& key);

}  // namespace wan::server
