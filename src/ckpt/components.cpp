// detect_components (ckpt/layout.h): a Layout::ComfyUI checkpoint from separate ComfyUI files, checked
// from their safetensors headers only. Confirmed in ComfyUI's sources (comfyanonymous/ComfyUI):
// - comfy/model_detection.py: a Wan DiT has "{prefix}head.modulation"; in_dim = patch_embedding.weight
//   shape[1] (16 t2v, 36 i2v; 48 = the Wan 2.2 5B). Comfy-Org's split files carry no prefix.
// - comfy/text_encoders/t5.py + wan.py: UMT5 under HF names ("shared.weight", "encoder.block.N.layer.0.
//   SelfAttention.{q,k,v,o}.weight", "...relative_attention_bias.weight" in EVERY block for umt5, only
//   block 0 for T5, "layer.1.DenseReluDense.{wi_0,wi_1,wo}.weight", "encoder.final_layer_norm.weight");
//   no "encoder.embed_tokens.weight". sd.py detect_te_model keys on "encoder.block.N.layer.1.
//   DenseReluDense.wi_1.weight"; load_text_encoder_state_dicts takes the tokenizer from a "spiece_model"
//   tensor of the file when present (the engine reads --tokenizer instead).
// - comfy/ops.py scaled_fp8_ops: only Linear weights are fp8 ("<layer>.weight" f8_e4m3fn, "<layer>.
//   scale_weight" f32 scalar, W = W_fp8 * scale_weight; optional "<layer>.scale_input"); embeddings and
//   norms keep fp16. sd.py t5_xxl_detect: a "scaled_fp8" tensor marks the file (its dtype = the fp8 type).
// - comfy/sd.py VAE: "decoder.middle.0.residual.0.gamma" = a Wan VAE under the official WanVAE_ names
//   (comfy/ldm/wan/vae.py, vae2_2.py mirror the official modules); "decoder.upsamples.0.upsamples.0.
//   residual.2.weight" = Wan 2.2. Not confirmed: the VAE files' dtype (254 MB / 127M params: 2 bytes).
#include <cctype>
#include <filesystem>
#include <optional>
#include <string>

#include "ckpt/layout.h"
#include "ckpt/names.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"

namespace wan {

namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// What one file holds: each model found, with the key prefix it sits under.
struct FileContents {
  std::optional<std::string> dit, t5, vae;  // prefixes
  bool t5_official = false;                 // "token_embedding.weight" style (a converted .pth)
  bool t5_not_umt5 = false;                 // block 1 has no relative_attention_bias: T5, not UMT5
  bool vae_official = false;                // ComfyUI / official WanVAE_ names (else diffusers)
  int vae_version = 0;
  bool fp8_scaled = false;  // "scaled_fp8" marker or "<layer>.scale_weight" companions
  bool spiece = false;      // ComfyUI's embedded tokenizer ("spiece_model")
  size_t tensors = 0;
  std::string first;
};

std::string describe(const FileContents& f) {
  std::string s;
  auto add = [&](const std::string& x) { s += (s.empty() ? "" : " + ") + x; };
  if (f.dit) add("a Wan DiT");
  if (f.t5) add(f.t5_not_umt5 ? "a T5 text encoder (not UMT5)" : "a UMT5 text encoder");
  if (f.vae) add(f.vae_version == 22 ? "a Wan 2.2 VAE" : "a Wan 2.1 VAE");
  if (s.empty()) s = cat("no Wan DiT, UMT5 or Wan VAE tensors (", f.tensors, " tensors", f.tensors ? ", first '" : "",
                         f.first, f.tensors ? "'" : "", ")");
  return s;
}

// The option to pass a file of this contents with.
std::string option_for(const FileContents& f) {
  if (f.dit) return "--dit / --dit-high / --dit-low";
  if (f.t5 && !f.t5_not_umt5) return "--text-encoder";
  if (f.vae) return "--vae";
  return "";
}

// How many names of the set map under `version` (VAE version vote: 2.1 and 2.2 nest stages differently).
int vae_names_mapped(const SafetensorsSet& set, const std::string& prefix, bool official, int version) {
  int n = 0;
  for (const std::string& name : set.names()) {
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string s = name.substr(prefix.size());
    n += !(official ? vae_official_to_diffusers(s, version) : vae_diffusers_to_official(s, version)).empty();
  }
  return n;
}

FileContents inspect_file(const SafetensorsSet& set) {
  FileContents f;
  const std::vector<std::string> names = set.names();
  f.tensors = names.size();
  if (!names.empty()) f.first = names[0];
  auto prefix_of = [](const std::string& n, const std::string& marker) { return n.substr(0, n.size() - marker.size()); };
  for (const std::string& n : names) {
    if (ends_with(n, "head.modulation") && !f.dit) f.dit = prefix_of(n, "head.modulation");
    if (ends_with(n, "encoder.final_layer_norm.weight") && !f.t5) f.t5 = prefix_of(n, "encoder.final_layer_norm.weight");
    if (ends_with(n, "token_embedding.weight") && !f.t5) {
      f.t5 = prefix_of(n, "token_embedding.weight");
      f.t5_official = true;
    }
    if (ends_with(n, "decoder.middle.0.residual.0.gamma") && !f.vae) {
      f.vae = prefix_of(n, "decoder.middle.0.residual.0.gamma");
      f.vae_official = true;
    }
    if (ends_with(n, "decoder.mid_block.resnets.0.norm1.gamma") && !f.vae) f.vae = prefix_of(n, "decoder.mid_block.resnets.0.norm1.gamma");
    if (ends_with(n, ".scale_weight") || ends_with(n, "scaled_fp8")) f.fp8_scaled = true;
    if (ends_with(n, "spiece_model")) f.spiece = true;
  }
  if (f.t5 && !f.t5_official) {
    const std::string b1 = *f.t5 + "encoder.block.1.layer.0.SelfAttention.";
    f.t5_not_umt5 = set.contains(b1 + "k.weight") && !set.contains(b1 + "relative_attention_bias.weight");
  }
  if (f.vae) {
    const int n21 = vae_names_mapped(set, *f.vae, f.vae_official, 21);
    const int n22 = vae_names_mapped(set, *f.vae, f.vae_official, 22);
    f.vae_version = n22 > n21 ? 22 : 21;
  }
  return f;
}

struct Opened {
  std::optional<SafetensorsSet> set;
  FileContents contents;
};

// Exists, is a .safetensors file, parses; what it holds. `what` is "--vae PATH".
Opened open_component(const std::string& what, const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  WAN_CHECK(!ec && fs::exists(st), what, ": no such file");
  WAN_CHECK(!fs::is_directory(st), what, ": is a folder; give the .safetensors file itself");
  const std::string name = lower(fs::path(path).filename().string());
  WAN_CHECK(ends_with(name, ".safetensors"), what, ": not a .safetensors file (ComfyUI's model files are ",
            ends_with(name, ".gguf") ? "safetensors; a GGUF file is read as a DiT only (--dit*))"
                                     : "safetensors; an official .pth belongs in a release folder, see --model)");
  Opened o;
  try {
    o.set = SafetensorsSet::open(path);
  } catch (const Error& e) {
    WAN_THROW(what, ": not a valid safetensors file (", e.what(), ")");
  }
  o.contents = inspect_file(*o.set);
  return o;
}

[[noreturn]] void wrong_role(const std::string& what, const std::string& wanted, const FileContents& f) {
  const std::string opt = option_for(f);
  if (!f.dit && !f.t5 && !f.vae) WAN_THROW(what, ": not ", wanted, ": ", describe(f));
  WAN_THROW(what, ": this file holds ", describe(f), ", not ", wanted,
            opt.empty() ? std::string() : cat(" (pass it with ", opt, ")"));
}

// One DiT file: its config (from shapes), prefix and fp8_scaled flag, through the lone-file detection;
// a GGUF file (city96's quantised Wan files) by its magic.
CheckpointInfo open_dit_file(const std::string& what, const std::string& path) {
  if (is_gguf_file(path)) {
    try {
      return detect_checkpoint(path);
    } catch (const Error& e) {
      WAN_THROW(what, ": ", e.what());
    }
  }
  Opened o = open_component(what, path);
  if (!o.contents.dit) wrong_role(what, "a Wan DiT", o.contents);
  try {
    return detect_checkpoint(path);
  } catch (const Error& e) {
    WAN_THROW(what, ": ", e.what());
  }
}

// The experts' file names must not say the opposite expert ("..._low_noise_..." given as --dit-high).
void check_expert_name(const std::string& what, const std::string& path, bool high) {
  const std::string n = lower(fs::path(path).filename().string());
  const char* other = high ? "low_noise" : "high_noise";
  WAN_CHECK(n.find(other) == std::string::npos, what, ": the file name says ", high ? "low" : "high",
            "-noise expert, given as the ", high ? "high" : "low", "-noise one (swapped --dit-high / --dit-low?)");
}

// The DiT file(s): fills dit, dit_prefix, fp8_scaled, task and the DiT components.
void add_dits(const ComponentFiles& f, CheckpointInfo& info) {
  const bool experts = !f.dit_high.empty() || !f.dit_low.empty();
  WAN_CHECK(f.dit.empty() || !experts, "--dit ", f.dit, ": give either --dit (one model) or --dit-high and --dit-low",
            " (the two A14B experts), not both");
  WAN_CHECK(!f.dit.empty() || experts, "no DiT file: give --dit-high F --dit-low F (T2V / I2V-A14B) or --dit F ",
            "(TI2V-5B, or one expert alone)");
  if (!f.dit.empty()) {
    const std::string what = cat("--dit ", f.dit);
    CheckpointInfo d = open_dit_file(what, f.dit);
    info.dit = d.dit;
    info.dit_prefix = d.dit_prefix;
    info.fp8_scaled = d.fp8_scaled;
    info.gguf = d.gguf;
    info.components.push_back({Role::DiT, f.dit});
    if (d.dit.model_type != "ti2v")
      info.notes.push_back(cat("--dit: one ", d.dit.model_type, " A14B expert runs every step (the full model is ",
                               "--dit-high + --dit-low)"));
    return;
  }
  WAN_CHECK(!f.dit_low.empty(), "--dit-high ", f.dit_high, ": no --dit-low (the A14B models need both experts; ",
            "--dit F runs one expert alone)");
  WAN_CHECK(!f.dit_high.empty(), "--dit-low ", f.dit_low, ": no --dit-high (the A14B models need both experts; ",
            "--dit F runs one expert alone)");
  const std::string wh = cat("--dit-high ", f.dit_high), wl = cat("--dit-low ", f.dit_low);
  std::error_code ec;
  WAN_CHECK(!fs::equivalent(f.dit_high, f.dit_low, ec), wh, ": the same file as --dit-low");
  CheckpointInfo h = open_dit_file(wh, f.dit_high);
  CheckpointInfo l = open_dit_file(wl, f.dit_low);
  check_expert_name(wh, f.dit_high, true);
  check_expert_name(wl, f.dit_low, false);
  WAN_CHECK(h.dit == l.dit, wh, ": its config differs from --dit-low ", f.dit_low, "'s (",
            dit_config_diff(h.dit, l.dit), ")");
  WAN_CHECK(h.dit.model_type != "ti2v", wh, ": a TI2V-5B model (in_dim 48) has one DiT; pass it with --dit");
  info.dit = h.dit;
  info.dit_prefix = h.dit_prefix;
  info.fp8_scaled = h.fp8_scaled || l.fp8_scaled;
  info.gguf = h.gguf || l.gguf;
  info.components.push_back({Role::DiTHigh, f.dit_high});
  info.components.push_back({Role::DiTLow, f.dit_low});
}

void add_text_encoder(const std::string& path, CheckpointInfo& info) {
  const std::string what = cat("--text-encoder ", path);
  Opened o = open_component(what, path);
  const FileContents& c = o.contents;
  if (!c.t5) wrong_role(what, "a UMT5 text encoder", c);
  WAN_CHECK(!c.t5_not_umt5, what, ": a T5 encoder with one relative-position table (t5xxl, as Flux and SD3 use), ",
            "not UMT5 (a table per block); Wan uses umt5_xxl");
  const std::string p = *c.t5;
  std::string emb = c.t5_official ? "token_embedding.weight" : "shared.weight";
  if (!o.set->contains(p + emb) && !c.t5_official) emb = "encoder.embed_tokens.weight";
  WAN_CHECK(o.set->contains(p + emb), what, ": no token embedding ('", p, emb, "')");
  const Shape s = o.set->info(p + emb).shape;
  WAN_CHECK(s.ndim == 2, what, ": '", p, emb, "' has shape ", s.str());
  WAN_CHECK(s[1] == info.dit.text_dim, what, ": encoder width ", s[1], " differs from the DiT's text_dim ",
            info.dit.text_dim);
  info.t5_naming = {p, c.t5_official, c.fp8_scaled};
  info.components.push_back({Role::TextEncoder, path});
  if (c.fp8_scaled) info.notes.push_back("text encoder: fp8_e4m3fn scaled (weight * scale_weight)");
  if (c.spiece) info.notes.push_back("text encoder: its embedded tokenizer ('spiece_model') is not used; --tokenizer is");
}

void add_vae(const std::string& path, CheckpointInfo& info) {
  const std::string what = cat("--vae ", path);
  Opened o = open_component(what, path);
  const FileContents& c = o.contents;
  if (!c.vae) wrong_role(what, "a Wan VAE", c);
  const int want = info.task == Task::TI2V_5B ? 22 : 21;
  WAN_CHECK(c.vae_version == want, what, ": a Wan ", c.vae_version == 22 ? "2.2" : "2.1", " VAE, but ",
            task_name(info.task), " decodes with the Wan ", want == 22 ? "2.2 VAE (wan2.2_vae.safetensors)"
                                                                       : "2.1 VAE (wan_2.1_vae.safetensors)");
  const std::string z = *c.vae + (c.vae_official ? "conv2.weight" : "post_quant_conv.weight");
  if (o.set->contains(z)) {
    const Shape s = o.set->info(z).shape;
    WAN_CHECK(s.ndim >= 1 && s[0] == info.dit.out_dim, what, ": ", s[0], " latent channels, but the DiT has out_dim ",
              info.dit.out_dim);
  }
  info.vae_version = c.vae_version;
  info.vae_naming = {*c.vae, c.vae_official, c.fp8_scaled};
  info.components.push_back({Role::Vae, path});
}

// The path Tokenizer::load reads: a folder holding spiece.model, or a .model file.
std::string tokenizer_path(const std::string& path) {
  const std::string what = cat("--tokenizer ", path);
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  WAN_CHECK(!ec && fs::exists(st), what, ": no such file or folder");
  const char* need = "the SentencePiece model of google/umt5-xxl, as in a diffusers tokenizer/ or the official "
                     "google/umt5-xxl/ folder";
  if (fs::is_directory(st)) {
    WAN_CHECK(fs::is_regular_file(fs::path(path) / "spiece.model", ec), what, ": no spiece.model in the folder (", need,
              ")");
    return path;
  }
  const std::string name = lower(fs::path(path).filename().string());
  if (ends_with(name, ".model")) return path;
  const fs::path dir = fs::path(path).parent_path();
  if (ends_with(name, ".json") && fs::is_regular_file(dir / "spiece.model", ec)) return dir.empty() ? "." : dir.string();
  WAN_THROW(what, ": not spiece.model nor a folder holding it (", need, ")");
}

}  // namespace

CheckpointInfo detect_components(const ComponentFiles& f, std::optional<Task> task_hint) {
  CheckpointInfo info;
  info.layout = Layout::ComfyUI;
  info.dit_config_from_file = false;
  add_dits(f, info);
  info.root = info.components.front().path;
  info.task = info.dit.model_type == "i2v" ? Task::I2V_A14B : info.dit.model_type == "ti2v" ? Task::TI2V_5B : Task::T2V_A14B;
  info.vae_version = info.task == Task::TI2V_5B ? 22 : 21;
  if (task_hint)
    WAN_CHECK(*task_hint == info.task, "--task ", task_name(*task_hint), ": the DiT file ", info.root, " is ",
              task_name(info.task), " (in_dim ", info.dit.in_dim, ")");
  if (!f.text_encoder.empty()) {
    WAN_CHECK(!f.tokenizer.empty(), "--text-encoder ", f.text_encoder, ": no --tokenizer DIR|FILE (the UMT5 tokenizer: a ",
              "folder with spiece.model, e.g. a diffusers Wan checkpoint's tokenizer/, or the file itself)");
    add_text_encoder(f.text_encoder, info);
  }
  if (!f.vae.empty()) add_vae(f.vae, info);
  if (!f.tokenizer.empty()) info.components.push_back({Role::Tokenizer, tokenizer_path(f.tokenizer)});
  return info;
}

}  // namespace wan
