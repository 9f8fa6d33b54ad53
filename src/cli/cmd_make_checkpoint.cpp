// `wan make-checkpoint --config NAME --layout official|diffusers|comfyui --output DIR [--layers N]
//  [--dtype fp32|bf16|fp16|fp8_scaled] [--seed N] [--force] [--dit-only]`: writes a random-weight checkpoint
//  (see testing/make_checkpoint.h). The option table lives here: its --config names come from the
//  checkpoint writer, which only this front end links. --out is the older spelling of --output.
#include <cstdio>
#include <string>

#include "api/options.h"
#include "cli/commands.h"
#include "testing/make_checkpoint.h"

namespace wan::cli {

const api::CommandSpec& make_checkpoint_spec() {
  static const api::CommandSpec s = [] {
    std::string names;
    for (const std::string& n : model_preset_names()) names += (names.empty() ? "" : " | ") + n;
    api::CommandSpec c;
    c.name = "make-checkpoint";
    c.summary = "write a random-weight checkpoint in a real layout";
    c.usage = {"make-checkpoint --config NAME --layout official|diffusers|comfyui --output DIR [options]"};
    c.about =
        "Writes every component of the task (DiT expert(s), UMT5 text encoder, VAE, tokenizer, configs) with "
        "deterministic random weights in the real tensor names and shapes. comfyui writes ComfyUI's separate "
        "files (diffusion_models/, text_encoders/, vae/) under Comfy-Org's names, plus a tokenizer/ folder.";
    api::Option config = api::option("config", api::Kind::String, "NAME", "", names);
    config.required = true;
    api::Option layout = api::option("layout", api::Kind::Enum, "", "", "the folder layout to write");
    layout.choices = {"official", "diffusers", "comfyui"};
    layout.required = true;
    api::Option output = api::option("output", api::Kind::Path, "DIR", "", "the folder to write");
    output.aliases = {"out"};
    output.required = true;
    api::Option layers =
        api::option("layers", api::Kind::Int, "N", "", "DiT depth override (the text encoder and VAE keep theirs)");
    layers.min = 1;
    layers.max = 1000;
    api::Option dtype = api::option("dtype", api::Kind::Enum, "", "",
                                    "DiT weight dtype (default fp32; comfyui: fp16); the text encoder is bf16 and "
                                    "the VAE fp32 as released (comfyui: fp16; fp16 and fp8_scaled are comfyui only, "
                                    "fp8_scaled also quantises the text encoder)");
    dtype.choices = {"fp32", "bf16", "fp16", "fp8_scaled"};
    api::Option seed =
        api::option("seed", api::Kind::Int, "N", "0", "weight seed; the same arguments give byte-identical files");
    seed.min = 0;
    api::Option force = api::option("force", api::Kind::Flag, "", "", "replace DIR if it exists and is not empty");
    api::Option dit_only =
        api::option("dit-only", api::Kind::Flag, "", "",
                    "write only the (high-noise) DiT and its config (transformer/ or high_noise_model/)");
    c.options = {config, layout, output, layers, dtype, seed, force, dit_only};
    return c;
  }();
  return s;
}

int cmd_make_checkpoint(int argc, char** argv) {
  const api::Values a = api::parse_argv(make_checkpoint_spec(), argc, argv);
  if (api::print_help_if_asked(a, make_checkpoint_spec())) return 0;
  gen::MakeCheckpointOptions o;
  o.config = a.require("config");
  const std::string layout = a.require("layout");
  o.layout = layout == "official" ? Layout::Official : layout == "diffusers" ? Layout::Diffusers : Layout::ComfyUI;
  o.out = a.require("output");
  o.layers = static_cast<int>(a.get_int("layers", 0));
  const std::string dt = a.str("dtype");
  o.dtype = dt == "bf16"         ? DType::BF16
            : dt == "fp16"       ? DType::F16
            : dt == "fp8_scaled" ? DType::F8E4M3
            : dt == "fp32"       ? DType::F32
            : o.layout == Layout::ComfyUI ? DType::F16 : DType::F32;
  o.seed = static_cast<uint64_t>(a.get_int("seed", 0));
  o.force = a.flag("force");
  o.dit_only = a.flag("dit-only");

  const gen::MakeCheckpointResult r = gen::make_checkpoint(o);
  std::printf("wrote %s: %zu files, %.1f MB (%s layout, %s, seed %llu)\n", r.root.c_str(), r.files.size(),
              static_cast<double>(r.bytes) / 1e6, layout.c_str(), o.config.c_str(),
              static_cast<unsigned long long>(o.seed));
  return 0;
}

}  // namespace wan::cli
