// `wan inspect PATH [--json FILE]`: layout, task, DiT config and, per component, its tensors (count,
// dtypes, parameters) and the tensors missing, unexpected or of the wrong shape against its table
// (pipeline/checkpoint_check.h; the DiT's is spec §3.2).
// Exit codes: 0 only for a complete, consistent checkpoint; 2 (after the report) when any component
// has a problem, or (one line, no report) when a file or folder cannot be read.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/layout.h"
#include "api/commands.h"
#include "cli/commands.h"
#include "pipeline/checkpoint_check.h"
#include "pipeline/files.h"

namespace wan::cli {
namespace {

using nlohmann::json;

std::string config_line(const DiTConfig& c) {
  return cat("dim ", c.dim, ", ffn_dim ", c.ffn_dim, ", num_heads ", c.num_heads, ", num_layers ", c.num_layers,
             ", in_dim ", c.in_dim, ", out_dim ", c.out_dim, ", freq_dim ", c.freq_dim, ", text_dim ", c.text_dim,
             ", text_len ", c.text_len, ", eps ", c.eps, ", model_type ", c.model_type);
}

void print_list(const char* what, const std::vector<std::string>& v) {
  constexpr size_t kShown = 20;  // the JSON output has the full lists
  printf("    %s: %zu\n", what, v.size());
  for (size_t i = 0; i < v.size() && i < kShown; ++i) printf("      %s\n", v[i].c_str());
  if (v.size() > kShown) printf("      ... and %zu more (see --json)\n", v.size() - kShown);
}

void print_text(const CheckpointInfo& info, const std::vector<ComponentReport>& reports) {
  printf("path:    %s\n", info.root.c_str());
  printf("layout:  %s\n", layout_name(info.layout));
  printf("task:    %s%s\n", task_name(info.task), info.task_certain ? "" : " (guessed)");
  for (const std::string& n : info.notes) printf("note:    %s\n", n.c_str());
  if (info.layout == Layout::ComfyUI)
    printf("comfyui: prefix '%s', %s\n", info.dit_prefix.c_str(), info.fp8_scaled ? "fp8_scaled" : "not fp8_scaled");
  printf("dit config (%s): %s\n", info.dit_config_from_file ? "config.json" : "inferred from shapes",
         config_line(info.dit).c_str());
  printf("dit parameters per expert (expected): %lld\n", static_cast<long long>(dit_param_count(info.dit)));
  size_t problems = 0;
  for (const ComponentReport& r : reports) {
    printf("%s: %s\n", role_name(r.role), r.path.c_str());
    printf("    format: %s\n", r.format.c_str());
    if (!r.has_tensors) continue;
    printf("    tensors: %zu, parameters: %lld\n", r.tensors, static_cast<long long>(r.params));
    std::string d;
    for (const auto& [k, v] : r.dtypes) d += cat(d.empty() ? "" : ", ", k, " ", v);
    printf("    dtypes: %s\n", d.empty() ? "(none)" : d.c_str());
    if (!r.table_error.empty()) printf("    problem: %s\n", r.table_error.c_str());
    print_list("missing", r.missing);
    print_list("unexpected", r.unexpected);
    if (!r.ignored.empty()) print_list("ignored (mapped to no model tensor)", r.ignored);
    print_list("shape mismatches", r.mismatches);
    problems += r.problems();
  }
  if (problems) printf("status: INCOMPLETE (%zu missing, mis-shaped or unexpected DiT tensors)\n", problems);
  else printf("status: ok\n");
}

std::string json_report(const CheckpointInfo& info, const std::vector<ComponentReport>& reports) {
  json j;
  j["path"] = info.root;
  j["layout"] = layout_name(info.layout);
  j["task"] = task_name(info.task);
  j["task_certain"] = info.task_certain;
  j["notes"] = info.notes;
  j["dit_prefix"] = info.dit_prefix;
  j["fp8_scaled"] = info.fp8_scaled;
  j["vae_version"] = info.vae_version;
  j["dit_config_source"] = info.dit_config_from_file ? "config.json" : "shapes";
  j["dit_config"] = json::parse(dit_config_to_official_json(info.dit));
  j["dit_param_count"] = dit_param_count(info.dit);
  json comps = json::array();
  bool ok = true;
  for (const ComponentReport& r : reports) {
    json c;
    c["role"] = role_name(r.role);
    c["path"] = r.path;
    c["format"] = r.format;
    if (r.has_tensors) {
      c["tensors"] = r.tensors;
      c["parameters"] = r.params;
      c["dtypes"] = r.dtypes;
      c["unexpected"] = r.unexpected;
      c["ignored"] = r.ignored;
      c["missing"] = r.missing;
      c["shape_mismatches"] = r.mismatches;
      if (!r.table_error.empty()) c["problem"] = r.table_error;
      ok = ok && r.problems() == 0;
    }
    comps.push_back(c);
  }
  j["components"] = comps;
  j["complete"] = ok;
  return j.dump(2) + "\n";
}

}  // namespace

int cmd_inspect(int argc, char** argv) {
  const api::Values args = api::parse_argv(api::inspect_spec(), argc, argv);
  if (api::print_help_if_asked(args, api::inspect_spec())) return 0;
  const std::optional<std::string> json_file = args.get("json");
  WAN_CHECK(args.positional().size() == 1, "inspect: expected one PATH, got ", args.positional().size(),
            " (usage: wan inspect PATH [--json FILE]; `--json -` prints the JSON instead of the text)");
  if (json_file && *json_file != "-") check_output_path(*json_file, "--json");
  CheckpointInfo info = detect_checkpoint(args.positional()[0]);
  std::vector<ComponentReport> reports;
  size_t problems = 0;
  for (const Component& c : info.components) {
    reports.push_back(check_component(info, c));
    problems += reports.back().problems();
  }
  if (!json_file) print_text(info, reports);
  else if (*json_file == "-") printf("%s", json_report(info, reports).c_str());
  else write_text_file(*json_file, json_report(info, reports));
  return problems == 0 ? 0 : 2;  // the report is printed either way; only a complete, consistent checkpoint is 0
}

}  // namespace wan::cli
