// Request fields -> GenerateOptions (see requests.h). Every field passes its row of the request table
// (so "steps" is checked exactly as --steps is), then is set on generate's Values under generate's name
// (api::video_request_renames, the table the request rows are built from) and converted by
// api::generate_options, the CLI's own conversion. LoRAs become --lora / --lora-high / --lora-low values
// of resolved files, so generate's rows and plan check them as the CLI's.
#include "server/requests.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
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
  if (!param.empty()) e["param"] = printable(param);  // a form field's name is raw bytes
  if (!code.empty()) e["code"] = code;
  return {{"error", e}};
}

std::map<std::string, std::string> fields_from_json(const nlohmann::json& body) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : body.items()) {
    if (v.is_null()) continue;
    if (k == "loras" && (v.is_array() || v.is_object())) {
      out[k] = v.dump();
      continue;
    }
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
namespace fs = std::filesystem;

constexpr size_t kMaxLoras = 16;

ApiError lora_error(const std::string& message, const std::string& code = "invalid_value") {
  return ApiError(400, "'loras': " + message, "loras", code);
}

// The request field a plan error names ("'frames' ..." -> num_frames), "" when none.
std::string param_of(const std::string& message) {
  for (const char* lora : {"lora ", "lora-high ", "lora-low "})  // a LoRA file's error: "lora FILE: ..."
    if (message.rfind(lora, 0) == 0) return "loras";
  if (message.empty() || message[0] != '\'') return "";
  const size_t end = message.find('\'', 1);
  if (end == std::string::npos) return "";
  const std::string name = message.substr(1, end - 1);
  for (const api::RequestRename& r : api::video_request_renames())
    if (r.generate == name) return r.field;
  if (name == "lora" || name == "lora-high" || name == "lora-low") return "loras";
  return name == "image" ? "input_reference" : "";
}

LoraRequest lora_from_string(const std::string& s) {
  try {
    const LoraSpec spec = parse_lora_arg(s, LoraExpert::All, "loras");
    return {spec.path, spec.strength, "both"};
  } catch (const std::exception&) {
    throw lora_error(cat("expected \"name[:scale]\", got '", s, "'"));
  }
}

LoraRequest lora_from_json(const nlohmann::json& j) {
  if (j.is_string()) return lora_from_string(j.get<std::string>());
  if (!j.is_object()) throw lora_error("each LoRA is an object {name, scale, expert} or a \"name:scale\" string");
  LoraRequest r;
  for (const auto& [k, v] : j.items()) {
    if (k == "name" && v.is_string()) {
      r.name = v.get<std::string>();
    } else if (k == "scale" && v.is_number()) {
      r.scale = v.get<double>();
    } else if (k == "scale" && v.is_string()) {  // multipart clients send every value as text
      char* end = nullptr;
      const std::string t = v.get<std::string>();
      r.scale = std::strtod(t.c_str(), &end);
      if (t.empty() || *end) throw lora_error(cat("'scale': expected a number, got '", t, "'"));
    } else if (k == "expert" && v.is_string()) {
      r.expert = v.get<std::string>();
      if (r.expert != "high" && r.expert != "low" && r.expert != "both")
        throw lora_error(cat("'expert': expected high, low or both, got '", r.expert, "'"));
    } else {
      throw lora_error(cat("unexpected '", k, "' (a LoRA has a string name, a number scale and an expert)"));
    }
  }
  if (r.name.empty()) throw lora_error("each LoRA needs a 'name'");
  if (!std::isfinite(r.scale) || std::fabs(r.scale) > 1000) throw lora_error("'scale' must be a number within +-1000");
  return r;
}
}  // namespace

std::vector<LoraRequest> parse_loras(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !(j.is_array() || j.is_object())) j = text;  // the "name[:scale]" form
  if (!j.is_array()) j = nlohmann::json::array({j});
  if (j.size() > kMaxLoras) throw lora_error(cat(j.size(), " LoRAs, at most ", kMaxLoras));
  std::vector<LoraRequest> out;
  for (const auto& e : j) out.push_back(lora_from_json(e));
  return out;
}

std::string loras_from_form(const std::vector<std::string>& values) {
  nlohmann::json all = nlohmann::json::array();
  for (const std::string& v : values) {
    nlohmann::json j = nlohmann::json::parse(v, nullptr, false);
    if (j.is_array()) {
      for (auto& e : j) all.push_back(std::move(e));
    } else if (j.is_object()) {
      all.push_back(std::move(j));
    } else {
      all.push_back(v);
    }
  }
  return all.dump();
}

std::string resolve_lora(const std::string& lora_dir, const std::string& name) {
  if (lora_dir.empty())
    throw lora_error("this server takes no LoRAs (it was started without --lora-dir)", "loras_not_enabled");
  const fs::path p(name);
  if (name.empty() || name.size() > 1024 || name.find('\0') != std::string::npos)
    throw lora_error("a LoRA name is a file name of at most 1024 bytes");
  if (p.is_absolute() || p.has_root_path())
    throw lora_error(cat("'", name, "': name a file inside the server's LoRA folder, not an absolute path"));
  for (const fs::path& part : p)
    if (part == "..") throw lora_error(cat("'", name, "': '..' is not allowed in a LoRA name"));
  std::error_code ec;
  const fs::path base = fs::weakly_canonical(lora_dir, ec);
  const fs::path full = ec ? fs::path() : fs::weakly_canonical(base / p, ec);  // symlinks followed
  const auto [b, f] = std::mismatch(base.begin(), base.end(), full.begin(), full.end());
  if (ec || b != base.end() || f == full.end())
    throw lora_error(cat("'", name, "' leads outside the server's LoRA folder"));
  if (!fs::is_regular_file(full, ec))
    throw lora_error(cat("no LoRA '", name, "' in the server's LoRA folder"), "lora_not_found");
  return full.string();
}

namespace {
// Each LoRA of the request as the CLI's --lora / --lora-high / --lora-low value "PATH:SCALE", through
// generate's row check.
void add_loras(const std::string& text, const ServedModel& m, api::Values& g) {
  for (const LoraRequest& l : parse_loras(text)) {
    const char* row = l.expert == "high" ? "lora-high" : l.expert == "low" ? "lora-low" : "lora";
    std::ostringstream value;
    value.precision(9);
    value << resolve_lora(m.lora_dir, l.name) << ":" << l.scale;
    try {
      api::validate(*api::find_option(api::generate_spec(), row), value.str());
    } catch (const OptionError&) {
      throw lora_error(cat("'", l.name, "' is not a usable LoRA name"));
    }
    g.append(row, value.str());
  }
}

// A message with the LoRA folder's path taken out: an error about a LoRA file names it as the request did.
std::string without_lora_dir(std::string msg, const ServedModel& m) {
  if (m.lora_dir.empty()) return msg;
  const std::string dir = m.lora_dir + "/";
  for (size_t at = msg.find(dir); at != std::string::npos; at = msg.find(dir, at)) msg.erase(at, dir.size());
  return msg;
}
}  // namespace

VideoRequest parse_video_request(const std::map<std::string, std::string>& fields, const ServedModel& m,
                                 const std::string& image_path) {
  const api::CommandSpec& spec = api::video_request_spec();
  api::Values req(spec);
  for (const auto& [k, text] : fields) {
    const api::Option* o = api::find_option(spec, k);
    if (!o) throw ApiError(400, cat("unknown parameter '", k, "'"), k, "unknown_parameter");
    // Form fields arrive as raw bytes; the video object and the job record are JSON, which holds UTF-8 only.
    if (first_invalid_utf8(text) != std::string::npos)
      throw ApiError(400, cat("'", k, "': not valid UTF-8 text"), k, "invalid_value");
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
  for (const api::RequestRename& r : api::video_request_renames())
    if (auto v = req.get(r.field)) g.set(r.generate, *v);
  if (auto l = req.get("loras")) add_loras(*l, m, g);
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
    r.opts.plan_as_owner = true;  // the resident models are the server's to free (pipeline/model_cache.h)
    r.opts.parallel = m.parallel;  // each rank checks its memory share when the job starts
  } catch (const std::exception& e) {
    const std::string msg = without_lora_dir(api::json_error_message(api::generate_spec(), e), m);
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
    std::string msg = without_lora_dir(api::json_error_message(api::generate_spec(), e), m);
    if (e.kind() != ErrorKind::BadInput) throw ApiError(500, msg);
    std::string param = param_of(msg);
    if (param.empty() && msg.find("'image'") != std::string::npos) param = "input_reference";  // "missing 'image'"
    for (size_t at = msg.find("'image'"); at != std::string::npos; at = msg.find("'image'", at))
      msg.replace(at, 7, "'input_reference'");
    const size_t quote = msg.find('\'', 1);
    if (param == "num_frames" && r.frames_from_seconds) {  // "'seconds': 'frames' 57601: ..."
      param = "seconds";
      msg = "'seconds': " + msg;
    } else if (param == "loras" && msg[0] != '\'') {  // "lora x.safetensors: ..." -> "'loras': x.safetensors: ..."
      msg = "'loras': " + msg.substr(msg.find(' ') + 1);
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
  r.plan = std::make_shared<const GeneratePlan>(std::move(plan));
}

}  // namespace wan::server
