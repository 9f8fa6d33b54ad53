// A checkpoint's weight files against its tensor tables (see checkpoint_check.h).
#include "pipeline/checkpoint_check.h"

#include <algorithm>
#include <memory>
#include <optional>

#include "core/error.h"
#include "formats/gguf_quant.h"
#include "models/dit/weights.h"
#include "models/umt5/weights.h"
#include "models/vae/weights.h"
#include "models/weight_spec.h"
#include "pipeline/models.h"

namespace wan {

namespace {

std::string format_of(const std::string& path, Role role) {
  auto ends = [&](const char* s) {
    const std::string x = s;
    return path.size() >= x.size() && path.compare(path.size() - x.size(), x.size(), x) == 0;
  };
  if (role == Role::Tokenizer) return "tokenizer folder";
  if (ends(".pth") || ends(".pt")) return "pth";
  if (ends(".safetensors.index.json")) return "safetensors (sharded, index)";
  if (ends(".safetensors")) return "safetensors";
  if (ends(".gguf")) return "gguf";
  return "safetensors folder";
}

std::map<std::string, Shape> expected_shapes(const CheckpointInfo& info, Role role, const KnownConfigs& known) {
  if (role_is_dit(role)) return dit_expected_shapes(info.dit);
  if (role == Role::TextEncoder) return shape_map(umt5_weight_table(known.t5 ? *known.t5 : t5_config_for(info)));
  if (role == Role::Vae) return shape_map(vae_weight_table(known.vae ? *known.vae : vae_config_for(info)));
  return {};
}

// A tensor's type as stored: a GGUF block type by ggml's name ("Q4_K"; the store's dtype() is what get()
// returns, f32), else the dtype.
std::string stored_type(const WeightStore& s, const std::string& n) {
  if (const std::optional<RawSpan> sp = s.raw_span(n); sp && sp->ggml_type != 0)
    if (const auto t = ggml_type_info(sp->ggml_type)) return t->name;
  return dtype_name(s.dtype(n));
}

}  // namespace

std::string ComponentReport::first_problem() const {
  if (!table_error.empty()) return table_error;
  if (!missing.empty()) return cat("missing tensor '", missing.front(), "' (", missing.size(), " missing)");
  if (!mismatches.empty()) return cat("tensor ", mismatches.front());
  if (!unexpected.empty() && role_is_dit(role))
    return cat("tensor '", unexpected.front(), "' is not part of the model its config describes (", unexpected.size(),
               " such tensors; does the config match the weights?)");
  return {};
}

ComponentReport check_component(const CheckpointInfo& info, const Component& c, const KnownConfigs& known) {
  ComponentReport r;
  r.role = c.role;
  r.path = c.path;
  r.format = format_of(c.path, c.role);
  if (c.role == Role::Tokenizer) return r;
  std::unique_ptr<WeightStore> store;
  WAN_WITH_CONTEXT(cat("reading ", role_name(c.role)), store = open_weights(info, c.role));
  r.has_tensors = true;
  const std::vector<std::string> names = store->names();
  r.tensors = names.size();
  for (const std::string& n : names) {
    r.params += store->shape(n).numel();
    r.dtypes[stored_type(*store, n)]++;
  }
  r.ignored = store->unexpected();
  std::map<std::string, Shape> want;
  try {
    want = expected_shapes(info, c.role, known);
  } catch (const Error& e) {
    r.table_error = cat("its config cannot be inferred from its tensors: ", e.what());
  }
  for (const auto& [n, s] : want) {
    if (!store->contains(n)) r.missing.push_back(n);
    else if (!(store->shape(n) == s)) r.mismatches.push_back(cat("'", n, "': ", store->shape(n).str(), ", expected ", s.str()));
  }
  for (const std::string& n : names)
    if (!want.count(n)) r.unexpected.push_back(n);
  std::sort(r.unexpected.begin(), r.unexpected.end());
  return r;
}

void validate_checkpoint(const CheckpointInfo& info, const std::vector<Role>& roles, const KnownConfigs& known) {
  for (const Component& c : info.components) {
    if (!roles.empty() && std::find(roles.begin(), roles.end(), c.role) == roles.end()) continue;
    const ComponentReport r = check_component(info, c, known);
    WAN_CHECK(r.problems() == 0, info.root, ": ", role_name(c.role), " (", c.path, "): ", r.first_problem(),
              "; `wan inspect ", info.root, "` lists every problem");
  }
}

}  // namespace wan
