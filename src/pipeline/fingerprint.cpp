// The plan's fingerprint: what must be equal for a saved state to continue in another process
// (pipeline.h plan_fingerprint), and the differences between two fingerprints.
#include <cstdio>
#include <filesystem>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/hash.h"
#include "pipeline/denoiser.h"
#include "pipeline/pipeline.h"
#include "pipeline/pipeline_internal.h"

namespace wan {
namespace {
// 64-bit FNV-1a of bytes, as 16 hex digits (fingerprints).
std::string hash_hex(const void* data, size_t n) {
  char buf[20];
  snprintf(buf, sizeof buf, "%016llx",
           static_cast<unsigned long long>(fnv1a64(std::string_view(static_cast<const char*>(data), n))));
  return buf;
}

std::string exact(double v) {
  char buf[40];
  snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

namespace pipeline_detail {
std::string fingerprint_numerics(const GeneratePlan& p) {
  if (parse_device(p.device) < 0) return "cpu float32";
  // Each lossy switch rounds differently, so a state resumes only under the same ones.
  std::string s = "cuda bf16";
  if (p.gemm == "fp8") s += ", fp8 block GEMMs";
  if (p.attention == "own-fp8") s += ", fp8 self-attention";
  if (!p.parallel.empty()) s += ", " + p.parallel;
  return s;
}
}  // namespace pipeline_detail

std::string plan_fingerprint(const GeneratePlan& p) {
  nlohmann::ordered_json j;
  j["format"] = "wan-generate-state 1";
  j["task"] = task_name(p.task);
  std::string root = p.ckpt.root;  // a checkpoint's folder or file, absolute; or the configuration's name
  if (!p.ckpt.components.empty()) {
    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::weakly_canonical(p.ckpt.root, ec);
    if (!ec) root = abs.string();
  }
  j["weights"] = p.random_weights ? cat("random, seed ", p.weights_seed, ", ", root, ", DiT ", p.ckpt.dit.num_layers, " layers")
                                  : cat("checkpoint ", root);
  if (p.ckpt.layout == Layout::ComfyUI && p.ckpt.components.size() > 1) {  // separate files: each one counts
    std::string files;
    for (const Component& c : p.ckpt.components) {
      std::error_code ec;
      const std::filesystem::path abs = std::filesystem::weakly_canonical(c.path, ec);
      files += cat(files.empty() ? "" : "; ", role_name(c.role), " ", ec ? c.path : abs.string());
    }
    j["components"] = files;
  }
  j["numerics"] = pipeline_detail::fingerprint_numerics(p);
  j["video"] = cat(p.width, "x", p.height, ", ", p.frames, " frames");
  j["latents"] = p.latent_shape.str();
  j["noise"] = p.init_latents.defined() ? cat("init-latents ", hash_hex(p.init_latents.data(), p.init_latents.nbytes()))
                                        : cat("seed ", p.seed);
  j["steps"] = std::to_string(p.sampler.steps);
  j["sampler"] = solver_name(p.sampler.solver);
  j["schedule"] = schedule_name(p.sampler.schedule);
  j["shift"] = exact(p.sampler.shift);
  if (!p.sampler.timesteps.empty() || p.sampler.bf16_latents) {  // the distill grids' own keys
    std::string t;
    for (float x : p.schedule.model_t) t += cat(t.empty() ? "" : ",", exact(x));
    j["timesteps"] = t;
    j["bf16_latents"] = p.sampler.bf16_latents ? "yes" : "no";
  }
  j["guide"] = cat(exact(p.guide_low), ",", exact(p.guide_high));
  j["boundary"] = exact(p.boundary);
  auto text = [](const Tensor& e, const std::string& s) {
    return e.defined() ? cat("embeddings ", e.shape().str(), " ", hash_hex(e.data(), e.nbytes()))
                       : cat("text ", hash_hex(s.data(), s.size()));
  };
  j["prompt"] = text(p.prompt_embeds, p.prompt);
  j["negative"] = text(p.negative_embeds, p.negative_prompt);
  auto image = [](const Tensor& t) { return t.defined() ? cat(t.shape().str(), " ", hash_hex(t.data(), t.nbytes())) : "none"; };
  if (p.image.defined()) j["image"] = image(p.image);
  if (p.last_image.defined()) j["last_image"] = image(p.last_image);
  // LoRAs change the weights: each file by path, size and modification time, with its strength and
  // expert (a state resumes only with the same LoRAs).
  if (!p.loras.empty()) {
    std::string l;
    for (const LoraSpec& s : p.loras) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(s.path, ec);
      const auto mtime = std::filesystem::last_write_time(s.path, ec).time_since_epoch().count();
      l += cat(l.empty() ? "" : "; ", lora_expert_name(s.expert), " ", s.path, ":", exact(s.strength), " (", size,
               " bytes, mtime ", mtime, ")");
    }
    j["lora"] = l;
  }
  return j.dump();
}

std::string fingerprint_differences(const std::string& saved, const std::string& now) {
  nlohmann::json a, b;
  try {
    a = nlohmann::json::parse(saved);
    b = nlohmann::json::parse(now);
  } catch (const std::exception&) {
    return "unreadable fingerprint";
  }
  if (!a.is_object() || !b.is_object()) return "unreadable fingerprint";
  std::string out;
  auto value = [](const nlohmann::json& j, const std::string& k) {
    auto it = j.find(k);
    return it == j.end() ? std::string("(none)") : it->is_string() ? it->get<std::string>() : it->dump();
  };
  std::vector<std::string> keys;
  for (auto it = b.begin(); it != b.end(); ++it) keys.push_back(it.key());
  for (auto it = a.begin(); it != a.end(); ++it)
    if (!b.contains(it.key())) keys.push_back(it.key());
  for (const std::string& k : keys) {
    const std::string x = value(a, k), y = value(b, k);
    if (x != y) out += cat(out.empty() ? "" : "; ", k, " ", x, " (saved) vs ", y, " (now)");
  }
  return out;
}

}  // namespace wan
