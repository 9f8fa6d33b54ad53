// PEFT alpha / rank configuration of a LoRA file (lora_peft.h).
#include "lora/lora_peft.h"

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace wan::lora_detail {
namespace {

using nlohmann::json;

// A pattern key matches "<anything>.<key>" or "<key>" at the end (PEFT's rule), as a regex.
bool pattern_matches(const std::string& key, const std::string& module) {
  try {
    return std::regex_match(module, std::regex("(.*\\.)?(" + key + ")"));
  } catch (const std::regex_error&) {
    return module == key || (module.size() > key.size() && module.compare(module.size() - key.size(), key.size(), key) == 0 &&
                             module[module.size() - key.size() - 1] == '.');
  }
}

// The config's field `name`, looked up under "transformer." first (diffusers' packed metadata).
const json* field(const json& j, const std::string& name) {
  for (const std::string& k : {"transformer." + name, name}) {
    auto it = j.find(k);
    if (it != j.end() && !it->is_null()) return &*it;
  }
  return nullptr;
}

PeftConfig parse(const json& j, const std::string& where) {
  PeftConfig c;
  c.source = where;
  WAN_CHECK(j.is_object(), where, ": not a JSON object");
  const json* alpha = field(j, "lora_alpha");
  const json* r = field(j, "r");
  if (!alpha && !r) return c;
  WAN_CHECK(!alpha || alpha->is_number(), where, ": lora_alpha is not a number");
  WAN_CHECK(!r || r->is_number_integer(), where, ": r is not an integer");
  c.present = true;
  c.r = r ? r->get<int64_t>() : 0;
  c.lora_alpha = alpha ? alpha->get<double>() : static_cast<double>(c.r);  // PEFT's default alpha is 8; r is safer
  if (const json* rs = field(j, "use_rslora")) c.rslora = rs->is_boolean() && rs->get<bool>();
  if (const json* ap = field(j, "alpha_pattern"); ap && ap->is_object())
    for (const auto& [k, v] : ap->items()) {
      WAN_CHECK(v.is_number(), where, ": alpha_pattern['", k, "'] is not a number");
      c.alpha_pattern[k] = v.get<double>();
    }
  if (const json* rp = field(j, "rank_pattern"); rp && rp->is_object())
    for (const auto& [k, v] : rp->items()) {
      WAN_CHECK(v.is_number_integer(), where, ": rank_pattern['", k, "'] is not an integer");
      c.rank_pattern[k] = v.get<int64_t>();
    }
  return c;
}

json parse_json(const std::string& text, const std::string& where) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    WAN_THROW(where, ": malformed JSON (", e.what(), ")");
  }
}

}  // namespace

PeftModuleScale PeftConfig::module(const std::string& m) const {
  PeftModuleScale s{lora_alpha, r};
  for (const auto& [k, v] : alpha_pattern)
    if (pattern_matches(k, m)) s.alpha = v;
  for (const auto& [k, v] : rank_pattern)
    if (pattern_matches(k, m)) s.r = v;
  return s;
}

std::string PeftConfig::describe() const {
  std::ostringstream os;
  os << " (lora_alpha " << lora_alpha << ", r " << r;
  if (rslora) os << ", rsLoRA";
  if (!alpha_pattern.empty() || !rank_pattern.empty())
    os << ", " << alpha_pattern.size() << " alpha / " << rank_pattern.size() << " rank patterns";
  os << ")";
  return os.str();
}

PeftConfig load_peft_config(const SafetensorsFile& file, const std::string& path) {
  auto md = file.metadata().find("lora_adapter_metadata");
  if (md != file.metadata().end()) {
    const std::string where = "lora " + path + ": metadata lora_adapter_metadata";
    PeftConfig c = parse(parse_json(md->second, where), where);
    c.source = "safetensors metadata lora_adapter_metadata";
    if (c.present) return c;
  }
  const std::filesystem::path cfg = std::filesystem::path(path).parent_path() / "adapter_config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(cfg, ec)) return {};
  std::ifstream in(cfg);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string where = "lora " + path + ": " + cfg.string();
  PeftConfig c = parse(parse_json(ss.str(), where), where);
  c.source = "adapter_config.json";
  return c;
}

}  // namespace wan::lora_detail
