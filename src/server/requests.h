// A video request (POST /v1/videos) becomes GenerateOptions here, through the request table
// (api/serve_options.h) and generate's option rules, then plan_generate, so a request that cannot run
// is refused (400) before it is queued. Errors are ApiError: the OpenAI error object and its status.
// No field is a path; an uploaded input_reference is saved by the server under a name it chooses, and a
// LoRA is named relative to serve's --lora-dir and resolved only inside it (resolve_lora).
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

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
  std::string lora_dir;  // --lora-dir, canonical; "" : requests may name no LoRA
  bool parallel = false; // jobs run split over several GPUs: requests are planned as multi-GPU runs
  explicit ServedModel(api::Values b) : base(std::move(b)) {}
};

struct VideoRequest {
  GenerateOptions opts;
  std::shared_ptr<const GeneratePlan> plan;  // plan_video_request's, handed to the worker (not planned twice)
  JobInfo info;  // model, prompt, size, seconds filled
  bool frames_from_seconds = false;  // a frame count the plan refuses is the 'seconds' field's fault
};

// A JSON body's fields as text (strings as they are, numbers printed, anything else refused; "loras"
// may be an array or an object, kept as its JSON text).
std::map<std::string, std::string> fields_from_json(const nlohmann::json& body);

// One LoRA of a request's "loras": a file name under --lora-dir, its scale and the expert it applies to.
struct LoraRequest {
  std::string name;
  double scale = 1.0;
  std::string expert = "both";  // "high", "low" or "both" (A14B's experts; TI2V's one model: "both")
};
// "loras" as any accepted form -> its LoRAs: a JSON array (or one element) whose elements are
// {"name", "scale", "expert"} objects or "name[:scale]" strings, or one "name[:scale]" string (the
// multipart form). Throws ApiError 400 naming "loras".
std::vector<LoraRequest> parse_loras(const std::string& text);
// The multipart values of "loras" / "loras[]" (each a "name[:scale]" string or JSON) as one JSON array text.
std::string loras_from_form(const std::vector<std::string>& values);
// `name` resolved strictly inside `lora_dir` (canonical): no absolute path, no "..", no symlink that
// leads out, an existing regular file; else ApiError 400 naming "loras" (the message never shows a
// server path). An empty lora_dir refuses every name.
std::string resolve_lora(const std::string& lora_dir, const std::string& name);

// Checks the fields against the request table and turns them into options (no planning yet).
// image_path: the server's copy of an uploaded input_reference ("" when none).
VideoRequest parse_video_request(const std::map<std::string, std::string>& fields, const ServedModel& m,
                                 const std::string& image_path);

// plan_generate on the request: a failure is ApiError 400 naming the reason. Fixes a random seed, fills
// info.size / info.seconds and keeps the plan in r.plan, so the job runs exactly what was checked.
void plan_video_request(VideoRequest& r, const ServedModel& m);

// Frames of `seconds` at `fps`: seconds * fps + 1, rounded to the nearest 4n+1 (at least 1).
int frames_for_seconds(double seconds, int fps);

// Constant-time comparison of a presented bearer token with the key (length leaks, content does not).
bool key_matches(const std::string& presented, const std::string& key);

}  // namespace wan::server
