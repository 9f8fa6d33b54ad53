// Fuzz target: a video request (POST /v1/videos, server/requests.h) from its fields to a planned job,
// without the HTTP library: an input whose first byte is '{' is a JSON body, anything else form fields
// ("name=value" lines, as a multipart body's fields arrive). The server's answer must be an ApiError with
// a 4xx status (a bad request is never a 500) or a request that planned, whose options then hold what
// the rules promise: the served model's weights, a prompt within max_prompt, a 4n+1 frame count, a
// size the plan accepted, and LoRA files ("loras") only inside the --lora-dir (an empty temporary
// folder: every name fails, but must fail as a 4xx). The model is the tiny random one `wan serve
// --weights random --config tiny` serves on the CPU.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "api/serve_options.h"
#include "fuzz_util.h"
#include "server/requests.h"

namespace {

using namespace wan;

const server::ServedModel& model() {
  static const server::ServedModel m = [] {
    const char* argv[] = {"serve", "--weights", "random", "--config", "tiny", "--device", "cpu"};
    const api::Values v = api::parse_argv(api::serve_spec(), 7, const_cast<char**>(argv));
    server::ServedModel s(api::generate_base_values(v));
    s.id = "wan2.2-t2v-A14B";
    s.fps = 16;
    s.max_prompt = 2000;
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / "wan_fuzz_loras";
    std::filesystem::create_directories(dir);
    s.lora_dir = std::filesystem::weakly_canonical(dir).string();
    return s;
  }();
  return m;
}

std::map<std::string, std::string> form_fields(const std::string& text) {
  std::map<std::string, std::string> f;
  size_t at = 0;
  while (at <= text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    const size_t eq = line.find('=');
    if (eq != std::string::npos) f[line.substr(0, eq)] = line.substr(eq + 1);
    at = end + 1;
  }
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const server::ServedModel& m = model();
  try {
    std::map<std::string, std::string> fields;
    if (!text.empty() && text[0] == '{') {
      nlohmann::json body;
      try {
        body = nlohmann::json::parse(text);
      } catch (const nlohmann::json::exception&) {
        return 0;  // the route answers 400 invalid_json before the fields
      }
      fields = server::fields_from_json(body);
    } else {
      fields = form_fields(text);
    }
    server::VideoRequest r = server::parse_video_request(fields, m, "");
    for (const LoraSpec& l : r.opts.loras)
      fuzz::require(l.path.rfind(m.lora_dir + "/", 0) == 0, "a LoRA resolves inside --lora-dir");
    server::plan_video_request(r, m);
    fuzz::require(r.opts.random_weights && r.opts.config == "tiny", "the served model's weights");
    fuzz::require(!r.info.prompt.empty() && r.info.prompt.size() <= m.max_prompt, "a prompt within the limit");
    fuzz::require(r.opts.seed.has_value(), "the plan fixed the seed");
    fuzz::require(!r.opts.frames || (*r.opts.frames - 1) % 4 == 0, "frames are 4n + 1");
    fuzz::require(!r.info.size.empty() && r.info.size.find('x') != std::string::npos, "the planned size");
  } catch (const server::ApiError& e) {
    fuzz::require(e.status >= 400 && e.status < 500, "a bad request is a 4xx answer");
    fuzz::require(!e.message.empty(), "an error says why");
  }
  return 0;
}
