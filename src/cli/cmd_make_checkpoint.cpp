// `wan make-checkpoint --config NAME --layout official|diffusers --out DIR [--layers N]
//  [--dtype fp32|bf16] [--seed N] [--force] [--dit-only]`: writes a random-weight checkpoint
//  (see gen/make_checkpoint.h).
#include <cstdio>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "testing/make_checkpoint.h"

namespace wan::cli {
namespace {

void usage() {
  std::string names;
  for (const std::string& n : model_preset_names()) names += (names.empty() ? "" : "|") + n;
  std::printf(
      "usage: wan make-checkpoint --config %s\n"
      "                           --layout official|diffusers --out DIR\n"
      "                           [--layers N] [--dtype fp32|bf16] [--seed N] [--force] [--dit-only]\n\n"
      "Writes every component of the task (DiT expert(s), UMT5 text encoder, VAE, tokenizer, configs)\n"
      "with deterministic random weights in the real tensor names and shapes.\n"
      "  --layers N   DiT depth override (the text encoder and VAE keep theirs)\n"
      "  --dtype      DiT weight dtype (default fp32); the text encoder is bf16 and the VAE fp32 as released\n"
      "  --seed N     weight seed (default 0); the same arguments give byte-identical files\n"
      "  --force      replace DIR if it exists and is not empty\n"
      "  --dit-only   write only the (high-noise) DiT and its config (transformer/ or high_noise_model/)\n",
      names.c_str());
}

}  // namespace

int cmd_make_checkpoint(int argc, char** argv) {
  Args a(argc, argv, {"config", "layout", "out", "layers", "dtype", "seed"}, {"force", "help", "dit-only"});
  if (a.flag("help")) {
    usage();
    return 0;
  }
  WAN_CHECK(a.positional().empty(), "make-checkpoint: unexpected argument '", a.positional()[0], "'");
  gen::MakeCheckpointOptions o;
  o.config = a.require("config");
  const std::string layout = a.require("layout");
  if (layout == "official")
    o.layout = Layout::Official;
  else if (layout == "diffusers")
    o.layout = Layout::Diffusers;
  else
    WAN_THROW("unknown --layout '", layout, "' (valid: official, diffusers)");
  o.out = a.require("out");
  const long long layers = a.get_int("layers", 0);
  WAN_CHECK(!a.get("layers") || (layers >= 1 && layers <= 1000), "--layers ", layers, ": expected 1..1000");
  o.layers = static_cast<int>(layers);
  const std::string dtype = a.get_or("dtype", "fp32");
  if (dtype == "fp32")
    o.dtype = DType::F32;
  else if (dtype == "bf16")
    o.dtype = DType::BF16;
  else
    WAN_THROW("unknown --dtype '", dtype, "' (valid: fp32, bf16)");
  const long long seed = a.get_int("seed", 0);
  WAN_CHECK(seed >= 0, "--seed ", seed, ": expected a non-negative integer");
  o.seed = static_cast<uint64_t>(seed);
  o.force = a.flag("force");
  o.dit_only = a.flag("dit-only");

  const gen::MakeCheckpointResult r = gen::make_checkpoint(o);
  std::printf("wrote %s: %zu files, %.1f MB (%s layout, %s, seed %llu)\n", r.root.c_str(), r.files.size(),
              static_cast<double>(r.bytes) / 1e6, layout.c_str(), o.config.c_str(),
              static_cast<unsigned long long>(o.seed));
  return 0;
}

}  // namespace wan::cli
