// The tables of generate, decode, encode-prompt, forward and inspect, and generate's translation into
// GenerateOptions (see commands.h). Defaults in the tables are documentation where the pipeline decides.
#include "api/commands.h"

#include <cmath>
#include <cstdlib>
#include <utility>

#include "formats/video.h"
#include "models/config.h"
#include "sampler/presets.h"
#include "sampler/sampler.h"

namespace wan::api {
namespace {

constexpr double kIntMax = 2147483647.0;  // values stored as int

// A check through one of the engine's name parsers: its message, with the option named first.
template <typename F>
std::function<std::string(const std::string&)> names(F parse) {
  return [parse](const std::string& s) -> std::string {
    try {
      (void)parse(s);
      return "";
    } catch (const Error& e) {
      return cat("{}: ", e.what());
    }
  };
}

std::string four_n_plus_one(const std::string& s) {
  const long long n = std::stoll(s);
  return (n - 1) % 4 == 0 ? "" : cat("{}: must be 4n+1, got ", n);
}

const char* kFilesHelp =
    "Files (safetensors, any float dtype read, float32 written):\n"
    "  embeddings: tensor \"prompt_embeds\" [L, text_dim] (the L real tokens of one prompt, EOS\n"
    "              included, no padding; text_dim 4096 for UMT5-XXL), as `wan encode-prompt` writes\n"
    "              it; the negative prompt's file uses the same name.\n"
    "  latents:    tensor \"latents\" [16, T_lat, H/8, W/8] (T_lat = (frames-1)/4 + 1), normalised\n"
    "              latent space; `wan decode` turns it into a video.\n"
    "  state:      \"latents\", \"state.step\", \"state.fingerprint\", \"sampler.*\", \"prompt_embeds\",\n"
    "              \"negative_prompt_embeds\", \"timings.*\" (src/pipeline/files.h).\n"
    "Seeded noise: element i (C-order) of the initial latents is philox_normal(seed, i).\n"
    "Exit codes: 0 ok, 1 runtime failure, 2 bad input or a request that cannot fit, 130 / 143 stopped by\n"
    "SIGINT (Ctrl-C) / SIGTERM (outputs already complete, such as --save-latents written before the decode,\n"
    "are kept; nothing partial is).\n";

// PNG output into a folder that already holds frames of the same name: refused unless asked for.
Option overwrite_frames_option() {
  return flag_option("overwrite-frames",
                     ".png output: replace the frames name_NNNNN.png already in the folder (those the new "
                     "sequence does not reach are removed); without it such a folder is refused");
}

// ComfyUI component files, instead of --model.
void add_component_rows(std::vector<Option>& t) {
  t.push_back(option("dit-high", Kind::Path, "FILE", "",
                     "instead of --model, ComfyUI files: the high-noise expert (A14B), e.g. "
                     "wan2.2_t2v_high_noise_14B_fp16.safetensors (fp16, bf16 or fp8_scaled)"));
  t.push_back(option("dit-low", Kind::Path, "FILE", "", "the low-noise expert (A14B)"));
  t.push_back(option("dit", Kind::Path, "FILE", "", "a one-model DiT (ti2v-5B), e.g. wan2.2_ti2v_5B_fp16.safetensors"));
  t.push_back(option("text-encoder", Kind::Path, "FILE", "",
                     "umt5_xxl_fp16.safetensors or umt5_xxl_fp8_e4m3fn_scaled.safetensors (needs --tokenizer)"));
  t.push_back(option("vae", Kind::Path, "FILE", "", "wan_2.1_vae.safetensors (A14B) or wan2.2_vae.safetensors (5B)"));
  t.push_back(option("tokenizer", Kind::Path, "DIR|FILE", "",
                     "the UMT5 tokenizer: a folder with spiece.model (and tokenizer.json), or the .model file"));
}

// --lora*, --preset, --timesteps, --sampler, --schedule.
void add_lora_and_sampler_rows(std::vector<Option>& t) {
  auto lora_row = [](const char* name, const char* help) {
    Option l = option(name, Kind::String, "PATH[:SCALE]", "", help);
    l.repeatable = true;
    l.check = [name](const std::string& s) {
      (void)parse_lora_arg(s, LoraExpert::All, name);
      return std::string();
    };
    return l;
  };
  t.push_back(lora_row("lora",
                       "a LoRA for every DiT (repeatable; they stack; scale default 1): official/ComfyUI, kohya, "
                       "diffusers/PEFT or full-delta (.diff) safetensors, recognised from the keys"));
  t.push_back(lora_row("lora-high", "a LoRA for the high-noise expert only (A14B; repeatable)"));
  t.push_back(lora_row("lora-low", "a LoRA for the low-noise expert only (A14B; repeatable)"));
  Option preset = option("preset", Kind::String, "NAME", "",
                         "a named sampling recipe (steps, timesteps, shift, guide, solver), e.g. lightning-4step with "
                         "the Lightning LoRAs; options given explicitly win. 'wan presets' lists them");
  preset.check = names(find_preset);
  t.push_back(preset);
  Option timesteps = option("timesteps", Kind::String, "LIST", "",
                            "explicit timesteps, e.g. 1000,750,500,250 (unshifted, as LightX2V's "
                            "denoising_step_list; the experts still switch by boundary); without --sampler: "
                            "step-distill");
  timesteps.check = [](const std::string& s) {
    (void)parse_timesteps(s);
    return std::string();
  };
  t.push_back(timesteps);
  Option sampler = option("sampler", Kind::String, "NAME", "unipc", "unipc | dpm++ | euler | step-distill");
  sampler.check = names(solver_from_name);
  t.push_back(sampler);
  Option schedule =
      option("schedule", Kind::String, "NAME", "official", "official | diffusers | lightning sigma grid");
  schedule.check = names(schedule_from_name);
  t.push_back(schedule);
}

std::vector<Option> generate_options_table() {
  std::vector<Option> t;
  t.push_back(
      option("model", Kind::Path, "PATH", "", "checkpoint: official release folder, diffusers folder or ComfyUI file"));
  add_component_rows(t);
  Option w =
      option("weights", Kind::Enum, "checkpoint|random", "checkpoint",
             "random: every weight drawn from the engine RNG at the real sizes (no files needed; the video is "
             "noise, for timings). Sizes: --task's (default t2v-A14B), --config NAME (make-checkpoint names, e.g. "
             "tiny) or --model's, whose tokenizer is then used; without one the prompt's UTF-8 bytes stand in "
             "for the tokens");
  w.choices = {"checkpoint", "random"};
  t.push_back(w);
  Option ws = option("weights-seed", Kind::Int, "N", "0", "seed of the random weights");
  ws.min = 0;
  t.push_back(ws);
  t.push_back(option("config", Kind::String, "NAME", "the task's", "random weights without --model: t2v-A14B | tiny"));
  Option layers = option("layers", Kind::Int, "N", "", "random weights without --model: DiT depth override");
  layers.min = 1;
  layers.max = kIntMax;
  t.push_back(layers);
  t.push_back(option("prompt", Kind::String, "TEXT", "", "the prompt (or --prompt-embeds FILE)"));
  t.push_back(
      option("negative-prompt", Kind::String, "TEXT", "", "empty or absent: the official default negative prompt"));
  Option task = option("task", Kind::String, "NAME", "the checkpoint's task", "t2v-A14B | i2v-A14B | ti2v-5B");
  task.check = names(task_from_name);
  t.push_back(task);
  t.push_back(option("image", Kind::Path, "FILE",
                     "", "the first frame (PNG, JPEG, WebP, ...): i2v-A14B needs one; ti2v-5B animates it when given"));
  t.push_back(option("last-image", Kind::Path, "FILE", "", "i2v-A14B: the last frame too"));
  t.push_back(option("size", Kind::Size, "WxH", "1280x720 (ti2v-5B: 1280x704)",
                     "e.g. 1280x720 or 1280*720 (multiples of 16; ti2v-5B: 32). i2v-A14B without it: the image's "
                     "aspect ratio at 1280x720's area; ti2v-5B with an image: the area, the image's aspect ratio"));
  Option frames = option("frames", Kind::Int, "N", "81 (ti2v-5B: 121)", "4n+1");
  frames.min = 1;
  frames.max = kIntMax;
  frames.check = four_n_plus_one;
  t.push_back(frames);
  Option steps = option("steps", Kind::Int, "N", "40 (ti2v-5B: 50)", "sampling steps");
  steps.min = 1;
  steps.max = kIntMax;
  t.push_back(steps);
  t.push_back(option("shift", Kind::Float, "S", "12 (i2v-A14B, ti2v-5B: 5)",
                     "sigma shift (with --schedule diffusers the checkpoint's scheduler flow_shift when it has one)"));
  Option g = option("guide-scale", Kind::String, "G|GL,GH", "3,4 (i2v-A14B: 3.5; ti2v-5B: 5)",
                    "guidance scale, one for both experts or low-noise,high-noise");
  g.check = [](const std::string& s) {
    (void)parse_guide_scale(s);
    return std::string();
  };
  t.push_back(g);
  add_lora_and_sampler_rows(t);
  t.push_back(option("seed", Kind::Int, "N", "", "noise seed (absent or negative: random, printed)"));
  t.push_back(option("device", Kind::Device, "DEV", "cpu",
                     "cpu | cuda[:i]. cuda runs the text encoder, the DiT (both experts resident, CUDA graphs) and the "
                     "VAE decode on the GPU in bf16; the text encoder is freed before the DiT loads"));
  t.push_back(
      flag_option("keep-text-encoder", "cuda: keep the text encoder resident next to the DiT (counted in the fit)"));
  t.push_back(flag_option("verbose", "print the GPU memory plan"));
  Option att = option("attention", Kind::Enum, "K", "auto",
                      "GPU attention kernel: auto (the engine's own on sm_90, cuDNN elsewhere) | own | cudnn | own-fp8 "
                      "(the own kernel with e4m3 Q/K/V/P, sm_90, opt-in, lossy; --precision fp8 picks it)");
  att.choices = {"auto", "own", "cudnn", "own-fp8"};
  t.push_back(att);
  add_gemm_rows(t);
  add_memory_budget_rows(t);
  add_vae_tile_row(t);
  Option gpus =
      option("gpus", Kind::String, "N", "",
             "run on several GPUs (one rank per GPU; implies --device cuda). Also one process per GPU started "
             "by mpirun / srun / WAN_RANK + WAN_WORLD_SIZE (+ WAN_MASTER_ADDR, WAN_MASTER_PORT). The text "
             "encoder and the VAE decode run on rank 0; each rank loads 1/N of the DiT weights and "
             "broadcasts them");
  gpus.synopsis = "--gpus N | --devices 0,1,...";
  t.push_back(gpus);
  Option devices = option("devices", Kind::String, "0,1,...", "", "");
  devices.hidden = true;  // documented in the --gpus row
  t.push_back(devices);
  t.push_back(flag_option("cfg-parallel", "cond and uncond on two halves of the GPUs (every step guided)"));
  t.push_back(
      option("ulysses", Kind::String, "U", "", "all-to-all sequence parallel over U GPUs (U divides the heads)"));
  t.push_back(option("ring", Kind::String, "R", "",
                     "ring attention over R GPUs. cfg x U x R = the GPUs; none given: automatic"));
  t.push_back(option("output", Kind::Path, "FILE", "output.mp4, or output.y4m in a build without FFmpeg",
                     ".mp4 | .y4m | .png (PNG: one file per frame, name_00000.png, ...)"));
  t.push_back(overwrite_frames_option());
  t.push_back(option("prompt-embeds", Kind::Path, "FILE", "", "prompt embeddings instead of --prompt (see below)"));
  t.push_back(option("negative-prompt-embeds", Kind::Path, "FILE", "",
                     "negative prompt embeddings instead of --negative-prompt"));
  t.push_back(option("init-latents", Kind::Path, "FILE", "",
                     "initial noise instead of the seeded one; when --size / --frames are absent they follow from its "
                     "shape"));
  t.push_back(option("save-latents", Kind::Path, "FILE", "",
                     "also write the final latents (written before the VAE decode starts, kept if it fails)"));
  Option json = option("json", Kind::Path, "FILE", "", "also write the timings and peak memory as JSON");
  json.aliases = {"timings-json"};
  t.push_back(json);
  Option save = option("save-state", Kind::Path, "FILE", "",
                       "stop after step N: write the run's state (latents, sampler history, the encoded text, the "
                       "settings' fingerprint, timings) and exit 0, no video");
  save.synopsis = "--save-state FILE --stop-after-steps N";
  t.push_back(save);
  Option stop = option("stop-after-steps", Kind::Int, "N", "", "");
  stop.min = 1;
  stop.max = kIntMax;
  stop.hidden = true;  // documented in the --save-state row
  t.push_back(stop);
  t.push_back(option("resume", Kind::Path, "FILE", "",
                     "continue a saved run: give the same options (a state saved with other settings is refused); the "
                     "result equals an uninterrupted run's exactly"));
  t.push_back(flag_option("quiet", "no progress and no summary (errors only)"));
  return t;
}

}  // namespace

std::string default_video_output() { return video_have_ffmpeg() ? "output.mp4" : "output.y4m"; }

const CommandSpec& generate_spec() {
  static const CommandSpec s = [] {
    CommandSpec c;
    c.name = "generate";
    c.summary = "text to video (Wan 2.2 T2V-A14B) on the CPU or GPUs";
    c.usage = {"generate --model DIR --prompt TEXT [options]",
               "generate --weights random [--task t2v-A14B] --prompt TEXT [options]"};
    c.about = "Text-to-video with Wan 2.2 (CPU float32 reference path, or --device cuda).";
    c.options = generate_options_table();
    c.epilog = kFilesHelp;
    return c;
  }();
  return s;
}

const CommandSpec& decode_spec() {
  static const CommandSpec s = [] {
    CommandSpec c;
    c.name = "decode";
    c.summary = "decode a latents file into a video with the VAE";
    c.usage = {"decode --model DIR --latents FILE --output FILE [options]"};
    c.about = "Decodes latents with the checkpoint's VAE and writes the video.";
    Option model = option("model", Kind::Path, "PATH", "", "checkpoint with a VAE (official or diffusers)");
    model.required = true;
    Option latents =
        option("latents", Kind::Path, "FILE", "",
               "safetensors with tensor \"latents\" [z, T_lat, H_lat, W_lat] (z = 16 for the Wan 2.1 VAE); "
               "frames = 4 (T_lat - 1) + 1, size 8 W_lat x 8 H_lat");
    latents.required = true;
    Option output = option("output", Kind::Path, "FILE", "", ".mp4 | .y4m | .png");
    output.required = true;
    Option fps = option("fps", Kind::Int, "N", "the task's, 16 for A14B, 24 for TI2V-5B", "frame rate");
    fps.min = 1;
    fps.max = 1000;
    Option json = option("json", Kind::Path, "FILE", "", "also write the timings and peak memory as JSON");
    json.aliases = {"timings-json"};
    c.options = {model,
                 latents,
                 output,
                 overwrite_frames_option(),
                 fps,
                 option("device", Kind::Device, "DEV", "cpu", "cpu | cuda[:i] (cuda decodes the Wan 2.1 VAE in bf16)"),
                 json,
                 flag_option("quiet", "no progress and no summary")};
    return c;
  }();
  return s;
}

const CommandSpec& encode_prompt_spec() {
  static const CommandSpec s = [] {
    CommandSpec c;
    c.name = "encode-prompt";
    c.summary = "encode a prompt into an embeddings file";
    c.usage = {"encode-prompt --model DIR (--prompt TEXT | --default-negative) --output FILE.safetensors"};
    c.about = "Encodes one prompt with the checkpoint's UMT5 text encoder (CPU, float32).";
    Option model = option("model", Kind::Path, "PATH", "",
                          "checkpoint with a text encoder and tokenizer (official or "
                          "diffusers)");
    model.required = true;
    Option output = option("output", Kind::Path, "FILE", "", "embeddings file to write");
    output.required = true;
    c.options = {model,
                 option("prompt", Kind::String, "TEXT", "",
                        "the text to encode (taken literally; \"\" encodes the empty prompt)"),
                 flag_option("default-negative", "encode the official default negative prompt instead"), output,
                 flag_option("quiet", "print nothing but errors")};
    c.epilog =
        "Output: safetensors with tensor \"prompt_embeds\" [L, text_dim] float32: the encoder output of the\n"
        "L real tokens (EOS included, at most 512, no padding); metadata \"prompt\" holds the text.\n"
        "Use it with `wan generate --prompt-embeds FILE` or `--negative-prompt-embeds FILE`.\n";
    return c;
  }();
  return s;
}

const CommandSpec& forward_spec() {
  static const CommandSpec s = [] {
    CommandSpec c;
    c.name = "forward";
    c.summary = "run one DiT forward pass on the CPU on random inputs";
    c.usage = {"forward --model PATH [options]"};
    c.about = "One DiT forward pass on the CPU (float32 reference) on random inputs.";
    Option model =
        option("model", Kind::Path, "PATH", "", "checkpoint folder or file (official, diffusers or ComfyUI)");
    model.required = true;
    Option expert = option("expert", Kind::Enum, "high|low", "high", "A14B expert to run");
    expert.choices = {"high", "low"};
    Option frames = option("frames", Kind::Int, "F", "5", "pixel frames, 4n+1");
    frames.min = 1;
    frames.check = four_n_plus_one;
    Option seed = option("seed", Kind::Int, "N", "0", "RNG seed for latents, timestep and context");
    seed.min = 0;
    Option output =
        option("output", Kind::Path, "FILE", "", "save x, t, context and the velocity to a .safetensors file");
    output.aliases = {"out"};
    c.options = {model,
                 expert,
                 frames,
                 option("size", Kind::Size, "WxH", "128x128", "pixel size; multiple of 16 (A14B) or 32 (TI2V-5B)"),
                 seed,
                 option("prompt-len", Kind::Int, "N", "16", "real text tokens, 1..text_len"),
                 option("layers", Kind::Int, "N", "", "run only the first N blocks (memory-limited smoke tests)"),
                 output};
    return c;
  }();
  return s;
}

const CommandSpec& inspect_spec() {
  static const CommandSpec s = [] {
    CommandSpec c;
    c.name = "inspect";
    c.summary = "show layout, task, components, config and tensors of a checkpoint";
    c.usage = {"inspect PATH [--json FILE]"};
    c.about =
        "PATH: an official Wan2.2 folder, a diffusers folder, a diffusers transformer folder, an official expert "
        "folder, or a ComfyUI .safetensors DiT file. Prints the layout, task, DiT config and each component's "
        "tensors; DiT tensors are checked against the official names and shapes (missing / unexpected / shape "
        "mismatches).";
    c.options = {option("json", Kind::Path, "FILE", "",
                        "write the machine-readable report (JSON, the full lists) to FILE; - prints it instead of "
                        "the text")};
    c.max_positional = 1;
    c.positional_name = "PATH";
    return c;
  }();
  return s;
}

const char* const kPrecisionFp8Note =
    "note: --precision fp8 runs the DiT blocks' GEMMs and attention in FP8 (e4m3): faster, not the reference's "
    "numbers (error bounds: bench/results/fp8-*.json)";

void add_gemm_rows(std::vector<Option>& t) {
  Option gemm = option("gemm", Kind::Enum, "G", "bf16",
                       "DiT GEMMs (cuda): bf16 (exact, the reference's) | fp8 (the blocks' 7 GEMMs with e4m3 "
                       "weights quantised per output channel as they load and inputs per token; sm_90, opt-in)");
  gemm.choices = {"bf16", "fp8"};
  t.push_back(gemm);
  Option precision = option("precision", Kind::Enum, "P", "exact",
                            "exact (bf16 GEMMs and attention) | fp8 (= --gemm fp8 --attention own-fp8)");
  precision.choices = {"exact", "fp8"};
  t.push_back(precision);
}

int64_t parse_memory_size(const std::string& s, const std::string& key) {
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  std::string unit = end ? std::string(end) : "";
  if (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  double scale = 0;
  const std::pair<const char*, double> units[] = {
      {"", 1},         {"B", 1},          {"K", 1024.0},     {"KiB", 1024.0},  {"M", 1048576.0}, {"MiB", 1048576.0},
      {"G", 1073741824.0}, {"GiB", 1073741824.0}, {"T", 1099511627776.0}, {"TiB", 1099511627776.0}, {"kB", 1e3},
      {"KB", 1e3},     {"MB", 1e6},       {"GB", 1e9},       {"TB", 1e12}};
  for (const auto& [u, f] : units)
    if (unit == u) scale = f;
  const double bytes = x * scale;
  if (s.empty() || end == s.c_str() || scale == 0 || !std::isfinite(bytes) || bytes < 1 || bytes > 9e18)
    throw OptionError(key, cat("{}: expected a size such as 24GiB, 24G, 16000MiB or 24GB, got '", s, "'"));
  return static_cast<int64_t>(bytes);
}

void add_memory_budget_rows(std::vector<Option>& t) {
  auto size_row = [&t](const std::string& name, const std::string& def, const std::string& help) {
    Option o = option(name, Kind::String, "SIZE", def, help);
    o.check = [name](const std::string& s) {
      (void)parse_memory_size(s, name);
      return std::string();
    };
    t.push_back(o);
  };
  size_row("memory-budget", "the device's free memory",
           "cuda, one GPU: the most device memory in use during the run, e.g. 24GiB (what the device holds "
           "before it, such as the CUDA context, counts). The plan keeps both experts resident "
           "when they fit, else takes the cheaper that fits of one expert at a time (swapped from pinned host "
           "memory when the expert changes) and the DiT blocks streamed from pinned host memory while the others "
           "compute (same latents, bit for bit); --verbose prints the choice. A budget nothing fits is refused, "
           "naming the smallest that works");
  size_row("host-memory-budget", "the machine's memory",
           "the pinned host memory the --memory-budget plan may hold for the experts' weights (swapped or "
           "streamed); a plan that needs more is not chosen. When none in memory fits, the blocks stream from "
           "a spill file in $TMPDIR (default /tmp; it needs room for every expert's blocks and is removed "
           "with the process), read back through the page cache each step, without CUDA graphs");
}

VaeTileRequest parse_vae_tile(const std::string& s, const std::string& key) {
  VaeTileRequest r;
  if (s == "auto") return r;
  if (s == "off") {
    r.mode = VaeTileRequest::Off;
    return r;
  }
  const size_t x = s.find('x');
  const std::string ws = s.substr(0, x), hs = x == std::string::npos ? ws : s.substr(x + 1);
  auto number = [](const std::string& d) -> int64_t {
    if (d.empty() || d.size() > 6 || d.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stoll(d);
  };
  r.mode = VaeTileRequest::Fixed;
  r.width = number(ws);
  r.height = number(hs);
  for (int64_t v : {r.width, r.height})
    if (v < 128 || v % 64 != 0)
      throw OptionError(key, cat("{}: expected auto, off or a pixel tile WxH (or N) of multiples of 64, at least 128, "
                                 "got '", s, "'"));
  return r;
}

void add_vae_tile_row(std::vector<Option>& t) {
  Option o = option("vae-tile", Kind::String, "auto|off|WxH", "auto",
                    "decode the video in overlapping spatial tiles (pixels, multiples of 64; N for NxN), blended "
                    "over a 1/4 overlap, so the GPU decoder's memory follows the tile, not the frame (slightly "
                    "different video). auto: untiled unless the --memory-budget plan needs it, then the largest of "
                    "512, 384, 256 that fits; off: never");
  o.check = [](const std::string& s) {
    (void)parse_vae_tile(s, "vae-tile");
    return std::string();
  };
  t.push_back(o);
}

std::string gemm_from(const Values& v) {
  const std::string precision = v.str("precision"), gemm = v.str("gemm");
  const std::string from_precision = precision == "fp8" ? "fp8" : "bf16";
  if (v.has("gemm") && v.has("precision") && gemm != from_precision)
    throw OptionError("gemm", cat("{} ", gemm, " contradicts --precision ", precision));
  return v.has("gemm") ? gemm : from_precision;
}

std::string attention_from(const Values& v) {
  const std::string precision = v.str("precision"), attention = v.str("attention");
  if (precision != "fp8") return attention;
  if (v.has("attention") && attention != "own-fp8")
    throw OptionError("attention", cat("{} ", attention, " contradicts --precision fp8 (FP8 attention: own-fp8)"));
  return "own-fp8";
}

GenerateOptions generate_options(const Values& v, ParallelArgs* parallel) {
  GenerateOptions o;
  o.model = v.get_or("model", "");
  o.components.dit = v.get_or("dit", "");
  o.components.dit_high = v.get_or("dit-high", "");
  o.components.dit_low = v.get_or("dit-low", "");
  o.components.text_encoder = v.get_or("text-encoder", "");
  o.components.vae = v.get_or("vae", "");
  o.components.tokenizer = v.get_or("tokenizer", "");
  o.prompt = v.get("prompt");
  o.negative_prompt = v.get("negative-prompt");
  if (auto t = v.get("task")) o.task = task_from_name(*t);
  if (v.has("size")) {
    const auto [w, h] = v.size("size");
    o.width = w;
    o.height = h;
  }
  if (v.has("frames")) o.frames = static_cast<int>(v.get_int("frames", 0));
  if (v.has("steps")) o.steps = static_cast<int>(v.get_int("steps", 0));
  if (v.has("shift")) o.shift = v.get_double("shift", 0);
  if (auto g = v.get("guide-scale")) std::tie(o.guide_low, o.guide_high) = parse_guide_scale(*g);
  if (auto s = v.get("sampler")) o.solver = solver_from_name(*s);
  if (auto s = v.get("schedule")) o.schedule = schedule_from_name(*s);
  o.preset = v.get_or("preset", "");
  if (auto s = v.get("timesteps")) o.timesteps = parse_timesteps(*s);
  if (v.has("seed") && v.get_int("seed", -1) >= 0) o.seed = static_cast<uint64_t>(v.get_int("seed", -1));
  o.device = v.str("device");
  o.verbose = v.flag("verbose");
  o.attention = attention_from(v);
  o.gemm = gemm_from(v);
  o.prompt_embeds_file = v.get_or("prompt-embeds", "");
  o.negative_embeds_file = v.get_or("negative-prompt-embeds", "");
  o.init_latents_file = v.get_or("init-latents", "");
  o.image_file = v.get_or("image", "");
  o.last_image_file = v.get_or("last-image", "");
  for (const auto& [name, expert] : {std::pair<const char*, LoraExpert>{"lora", LoraExpert::All},
                                     {"lora-high", LoraExpert::High},
                                     {"lora-low", LoraExpert::Low}})
    for (const std::string& s : v.all(name)) o.loras.push_back(parse_lora_arg(s, expert, name));
  o.random_weights = v.str("weights") == "random";
  if (v.has("weights-seed")) {
    if (!o.random_weights) throw OptionError("weights-seed", "{} needs --weights random");
    o.weights_seed = static_cast<uint64_t>(v.get_int("weights-seed", 0));
  }
  o.config = v.get_or("config", "");
  if (v.has("layers")) o.layers = static_cast<int>(v.get_int("layers", 0));
  o.keep_text_encoder = v.flag("keep-text-encoder");
  if (auto b = v.get("memory-budget")) o.memory_budget = parse_memory_size(*b, "memory-budget");
  if (auto b = v.get("host-memory-budget")) o.host_memory_budget = parse_memory_size(*b, "host-memory-budget");
  if (auto b = v.get("vae-tile")) o.vae_tile = parse_vae_tile(*b, "vae-tile");
  o.resume_file = v.get_or("resume", "");
  if (v.has("resume") && o.resume_file.empty()) throw OptionError("resume", "{}: empty file name");
  if (v.has("stop-after-steps")) o.stop_after_steps = static_cast<int>(v.get_int("stop-after-steps", 0));
  WAN_CHECK(v.get_or("save-state", "").empty() == (o.stop_after_steps == 0),
            "--save-state FILE and --stop-after-steps N go together (the state after step N is written to FILE)");
  if (parallel) {
    parallel->gpus = v.get_or("gpus", "");
    parallel->devices = v.get_or("devices", "");
    parallel->cfg = v.flag("cfg-parallel");
    parallel->ulysses = v.get("ulysses");
    parallel->ring = v.get("ring");
    parallel->device = v.get("device");
  }
  return o;
}

}  // namespace wan::api
