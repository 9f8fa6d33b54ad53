// Request fields -> GenerateOptions (see requests.h). Every field passes its row of the request table
// (so "steps" is checked exactly as --steps is), then is set on generate's Values under generate's name
// and converted by api::generate_options, the CLI's own conversion.
#include "server/requests.h"

#include <cmath>
#include <new>
#include <sstream>

#include "api/commands.h"
#include "api/serve_options.h"
#include "core/printable.h"

namespace wan::server {

std::string ApiError::type() const {
  switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

nlohmann::json ApiError::body() const {
  nlohmann::json e = {{"message", printable(message)}, {"type", type()}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return {{"error", e}};
}

std::map<std::string, std::string> fields_from_json(const nlohmann::json& body) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : body.items()) {
    if (v.is_null()) continue;
    if (k == "input_reference")
      throw ApiError(400, "input_reference: upload the image as a multipart/form-data file", k, "invalid_value");
    if (v.is_string()) {
      out[k] = v.get<std::string>();
    } else if (v.is_number_integer()) {
      out[k] = std::to_string(v.get<long long>());
    } else if (v.is_number()) {
      std::ostringstream os;
      os.precision(17);
      os << v.get<double>();
      out[k] = os.str();
    } else {
      throw ApiError(400, cat("'", k, "': expected a string or a number, got ", v.dump()), k, "invalid_type");
    }
  }
  return out;
}

int frames_for_seconds(double seconds, int fps) {
  const double f = seconds * fps + 1;
  const long n = std::lround((f - 1) / 4.0);
  return static_cast<int>(4 * std::max(0L, n) + 1);
}

bool key_matches(const std::string& presented, const std::string& key) {
  unsigned diff = presented.size() == key.size() ? 0u : 1u;
  const size_t n = std::max(presented.size(), key.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char a = i < presented.size() ? presented[i] : 0;
    const unsigned char b = i < key.size() ? key[i] : 0;
    diff |= static_cast<unsigned>(a ^ b);
  }
  return diff == 0;
}

namespace {
// Request names -> generate's names, for the fields passed on as they are.
const std::map<std::string, std::string> kToGenerate = {
    {"prompt", "prompt"},   {"size", "size"},         {"negative_prompt", "negative-prompt"},
    {"seed", "seed"},       {"steps", "steps"},       {"guidance_scale", "guide-scale"},
    {"shift", "shift"},     {"sampler", "sampler"},   {"num_frames", "frames"},
    {"preset", "preset"}};

// The request field a plan error names ("'frames' ..." -> num_frames), "" when none.
std::string param_of(const std::string& message) {
  if (message.empty() || message[0] != '\'') return "";
  const size_t end = message.find('\'', 1);
  if (end == std::string::npos) return "";
  const std::string name = message.substr(1, end - 1);
  for (const auto& [from, to] : kToGenerate)
    if (to == name) return from;
  return name == "image" ? "input_reference" : "";
}
}  // namespace

VideoRequest parse_video_request(const std::map<std::string, std::string>& fields, const ServedModel& m,
                                 const std::string& image_path) {
  const api::CommandSpec& spec = api::video_request_spec();
  api::Values req(spec);
  for (const auto& [k, text] : fields) {
    const api::Option* o = api::find_option(spec, k);
    if (!o) throw ApiError(400, cat("unknown parameter '", k, "'"), k, "unknown_parameter");
    try {
      api::validate(*o, text);
    } catch (const OptionError& e) {
      throw ApiError(400, e.json_message(), k, "invalid_value");
    }
    req.set(o->name, text);
  }
  const auto prompt = req.get("prompt");
  if (!prompt || prompt->empty()) throw ApiError(400, "missing required parameter 'prompt'", "prompt", "missing_required_parameter");
  if (prompt->size() > m.max_prompt)
    throw ApiError(400, cat("'prompt': ", prompt->size(), " bytes, at most ", m.max_prompt), "prompt", "invalid_value");
  if (auto model = req.get("model"); model && *model != m.id)
    throw ApiError(400, cat("'model': this server serves '", m.id, "', not '", *model, "'"), "model", "model_not_found");
  if (req.has("fps") && req.get_int("fps", 0) != m.fps)
    throw ApiError(400, cat("'fps': this model writes ", m.fps, " fps videos; other rates are not supported"), "fps",
                   "invalid_value");
  api::Values g = m.base;
  for (const auto& [from, to] : kToGenerate)
    if (auto v = req.get(from)) g.set(to, *v);
  if (req.has("seconds") && !req.has("num_frames")) {
    const int f = frames_for_seconds(req.get_double("seconds", 0), m.fps);
    g.set("frames", std::to_string(f));
  }
  const bool from_seconds = req.has("seconds") && !req.has("num_frames");
  if (!image_path.empty()) g.set("image", image_path);
  VideoRequest r;
  r.frames_from_seconds = from_seconds;
  try {
    r.opts = api::generate_options(g, nullptr);
  } catch (const std::exception& e) {
    const std::string msg = api::json_error_message(api::generate_spec(), e);
    throw ApiError(400, msg, param_of(msg), "invalid_value");
  }
  r.info.model = m.id;
  r.info.prompt = *prompt;
  r.info.seconds = req.get_or("seconds", "");
  r.opts.outputs.clear();
  return r;
}

void plan_video_request(VideoRequest& r, const ServedModel& m) {
  GeneratePlan plan;
  try {
    plan = plan_generate(r.opts);
  } catch (const std::bad_alloc&) {
    throw ApiError(400, "the request is too large for this machine", "", "invalid_value");
  } catch (const Error& e) {
    std::string msg = api::json_error_message(api::generate_spec(), e);
    if (e.kind() != ErrorKind::BadInput) throw ApiError(500, msg);
    std::string param = param_of(msg);
    if (param.empty() && msg.find("'image'") != std::string::npos) param = "input_reference";  // "missing 'image'"
    for (size_t at = msg.find("'image'"); at != std::string::npos; at = msg.find("'image'", at))
      msg.replace(at, 7, "'input_reference'");
    const size_t quote = msg.find('\'', 1);
    if (param == "num_frames" && r.frames_from_seconds) {  // "'seconds': 'frames' 57601: ..."
      param = "seconds";
      msg = "'seconds': " + msg;
    } else if (!param.empty() && msg[0] == '\'' && quote != std::string::npos) {
      msg.replace(0, quote + 1, "'" + param + "'");  // generate's name for it -> the request's
    }
    throw ApiError(400, msg, param, "invalid_value");
  }
  r.opts.seed = plan.seed;
  r.info.size = cat(plan.width, "x", plan.height);
  if (r.info.seconds.empty()) {
    std::ostringstream os;
    os << static_cast<double>(plan.frames - 1) / plan.fps;
    r.info.seconds = os.str();
  }
}

}  // namespace wan::server
