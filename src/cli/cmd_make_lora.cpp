// `wan make-lora --config NAME --output FILE [--rank R] [--alpha A] [--format official|kohya|peft]
//  [--all-targets] [--dtype fp32|bf16|fp16] [--seed N] [--layers N]`: writes a random LoRA for a model
//  preset's DiT (testing/make_lora.h), to test and time `--lora` without a real LoRA file.
#include <cstdio>
#include <string>

#include "api/options.h"
#include "ckpt/layout.h"
#include "cli/commands.h"
#include "core/error.h"
#include "testing/make_lora.h"

namespace wan::cli {

const api::CommandSpec& make_lora_spec() {
  static const api::CommandSpec s = [] {
    std::string names;
    for (const std::string& n : model_preset_names()) names += (names.empty() ? "" : " | ") + n;
    api::CommandSpec c;
    c.name = "make-lora";
    c.summary = "write a random LoRA for a model's DiT (official, kohya or PEFT keys)";
    c.usage = {"make-lora --config NAME | --model PATH --output FILE [options]"};
    c.about =
        "Writes deterministic random LoRA factors for every attention and FFN projection of the DiT of a "
        "make-checkpoint config (10 per block: 400 for an A14B expert), in the key format asked for. The same "
        "seed in two formats holds the same delta. PEFT also writes adapter_config.json beside the file.";
    api::Option config = api::option("config", api::Kind::String, "NAME", "", names + " (or --model)");
    api::Option model = api::option("model", api::Kind::Path, "PATH", "", "a checkpoint whose DiT sizes to use");
    api::Option output = api::option("output", api::Kind::Path, "FILE", "", "the .safetensors file to write");
    output.required = true;
    api::Option rank = api::option("rank", api::Kind::Int, "R", "64", "LoRA rank");
    rank.min = 1;
    rank.max = 4096;
    api::Option alpha = api::option("alpha", api::Kind::Float, "A", "", "write .alpha (scale alpha/rank); absent: none");
    alpha.min = 0;
    api::Option format = api::option("format", api::Kind::Enum, "", "official", "key format");
    format.choices = {"official", "kohya", "peft"};
    api::Option dtype = api::option("dtype", api::Kind::Enum, "", "bf16", "factor dtype");
    dtype.choices = {"fp32", "bf16", "fp16"};
    api::Option seed = api::option("seed", api::Kind::Int, "N", "0", "factor seed");
    seed.min = 0;
    api::Option layers = api::option("layers", api::Kind::Int, "N", "", "DiT depth override");
    layers.min = 1;
    layers.max = 1000;
    c.options = {config, model, output, rank, alpha, format,
                 api::flag_option("all-targets", "also the text and time embeddings, time projection and head"),
                 dtype, seed, layers};
    return c;
  }();
  return s;
}

int cmd_make_lora(int argc, char** argv) {
  const api::Values a = api::parse_argv(make_lora_spec(), argc, argv);
  if (api::print_help_if_asked(a, make_lora_spec())) return 0;
  gen::MakeLoraOptions o;
  WAN_CHECK(a.has("config") != a.has("model"), "make-lora: give --config NAME or --model PATH (one of them)");
  if (a.has("model")) {
    WAN_CHECK(!a.has("layers"), "make-lora: --layers goes with --config (a checkpoint has its own depth)");
    o.dit = detect_checkpoint(a.require("model")).dit;
  } else {
    o.dit = model_preset(a.require("config"), static_cast<int>(a.get_int("layers", 0))).dit;
  }
  o.out = a.require("output");
  o.rank = static_cast<int>(a.get_int("rank", 64));
  o.alpha = static_cast<float>(a.get_double("alpha", 0));
  o.format = gen::lora_format_from_name(a.str("format"));
  o.all_targets = a.flag("all-targets");
  const std::string dt = a.str("dtype");
  o.dtype = dt == "fp32" ? DType::F32 : dt == "fp16" ? DType::F16 : DType::BF16;
  o.seed = static_cast<uint64_t>(a.get_int("seed", 0));
  const gen::MakeLoraResult r = gen::make_lora(o);
  std::printf("wrote %s: %d modules, rank %d, %.1f MB\n", o.out.c_str(), r.modules, o.rank,
              static_cast<double>(r.bytes) / 1e6);
  return 0;
}

}  // namespace wan::cli
