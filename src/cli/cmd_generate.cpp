// `wan generate`: text (or embeddings) to video with the Wan 2.2 pipeline (src/pipeline).
// Order of work: parse options, check every output path, plan (validates the checkpoint, sizes,
// embeddings and latents files: bad input exits 2 before anything heavy), run with progress and
// Ctrl-C support, then write all outputs; a failure or an interrupt removes whatever this run
// already wrote (each writer itself writes a temporary file and renames it), so no partial output
// is left behind. Exit codes: 0, 2 bad input, 1 internal error, 130 interrupted.
#include <chrono>
#include <cstdio>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "pipeline/files.h"
#include "pipeline/pipeline.h"
#include "video/video.h"

namespace wan::cli {
namespace {

void print_help() {
  printf(
      "usage: wan generate --model DIR --prompt TEXT [options]\n"
      "  Text-to-video with Wan 2.2 on the CPU (float32 reference path).\n"
      "\n"
      "  --model PATH              checkpoint: official release folder, diffusers folder or ComfyUI file\n"
      "  --prompt TEXT             the prompt (or --prompt-embeds FILE)\n"
      "  --negative-prompt TEXT    empty or absent: the official default negative prompt\n"
      "  --task NAME               t2v-A14B | i2v-A14B | ti2v-5B (default: the checkpoint's task;\n"
      "                            only t2v-A14B is implemented so far)\n"
      "  --size WxH                e.g. 1280x720 or 1280*720 (default 1280x720; multiples of 16)\n"
      "  --frames N                4n+1 (default 81)\n"
      "  --steps N                 sampling steps (default 40)\n"
      "  --shift S                 sigma shift (default 12; with --schedule diffusers the checkpoint's\n"
      "                            scheduler flow_shift when it has one)\n"
      "  --guide-scale G|GL,GH     guidance scale, one for both experts or low-noise,high-noise\n"
      "                            (default 3,4)\n"
      "  --sampler NAME            unipc | dpm++ | euler (default unipc)\n"
      "  --schedule NAME           official | diffusers sigma grid (default official)\n"
      "  --seed N                  noise seed (default or negative: random, printed)\n"
      "  --device DEV              cpu | cuda[:i] (default cpu). cuda runs the DiT on the GPU in bf16 (both experts\n"
      "                            resident, CUDA graphs); the text encoder and the VAE still run on the CPU\n"
      "  --verbose                 print the GPU memory plan\n"
      "  --output FILE             .mp4 | .y4m | .png (PNG: one file per frame, name_00000.png, ...)\n"
      "                            (default output.mp4, or output.y4m in a build without FFmpeg)\n"
      "  --prompt-embeds FILE      prompt embeddings instead of --prompt (see below)\n"
      "  --negative-prompt-embeds FILE  negative prompt embeddings instead of --negative-prompt\n"
      "  --init-latents FILE       initial noise instead of the seeded one; when --size / --frames are\n"
      "                            absent they follow from its shape\n"
      "  --save-latents FILE       also write the final latents (before the VAE)\n"
      "  --timings-json FILE       also write the timings and peak memory as JSON\n"
      "  --quiet                   no progress and no summary (errors only)\n"
      "\n"
      "Files (safetensors, any float dtype read, float32 written):\n"
      "  embeddings: tensor \"prompt_embeds\" [L, text_dim] (the L real tokens of one prompt, EOS\n"
      "              included, no padding; text_dim 4096 for UMT5-XXL), as `wan encode-prompt` writes\n"
      "              it; the negative prompt's file uses the same name.\n"
      "  latents:    tensor \"latents\" [16, T_lat, H/8, W/8] (T_lat = (frames-1)/4 + 1), normalised\n"
      "              latent space; `wan decode` turns it into a video.\n"
      "Seeded noise: element i (C-order) of the initial latents is philox_normal(seed, i).\n"
      "Exit codes: 0 ok, 2 bad input, 1 internal error, 130 interrupted (Ctrl-C; outputs removed).\n");
}

int to_int(long long v, const char* opt) {
  WAN_CHECK(v >= -2147483647LL && v <= 2147483647LL, "option --", opt, ": ", v, " is out of range");
  return static_cast<int>(v);
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  const auto t_start = std::chrono::steady_clock::now();
  Args a(argc, argv,
         {"model", "prompt", "negative-prompt", "task", "size", "frames", "steps", "shift", "guide-scale", "sampler",
          "schedule", "seed", "device", "output", "prompt-embeds", "negative-prompt-embeds", "init-latents",
          "save-latents", "timings-json"},
         {"quiet", "help", "verbose"});
  if (a.flag("help")) {
    print_help();
    return 0;
  }
  WAN_CHECK(a.positional().empty(), "unexpected argument '", a.positional().empty() ? "" : a.positional()[0],
            "' (options start with --; see --help)");
  const bool quiet = a.flag("quiet");

  GenerateOptions o;
  o.model = a.get_or("model", "");
  o.prompt = a.get("prompt");
  o.negative_prompt = a.get("negative-prompt");
  if (auto t = a.get("task")) o.task = task_from_name(*t);
  if (auto s = a.get("size")) {
    int w = 0, h = 0;
    parse_size(*s, &w, &h);
    o.width = w;
    o.height = h;
  }
  if (a.get("frames")) o.frames = to_int(a.get_int("frames", 0), "frames");
  if (a.get("steps")) o.steps = to_int(a.get_int("steps", 0), "steps");
  if (a.get("shift")) o.shift = a.get_double("shift", 0);
  if (auto g = a.get("guide-scale")) {
    float lo = 0, hi = 0;
    parse_guide_scale(*g, &lo, &hi);
    o.guide_low = lo;
    o.guide_high = hi;
  }
  if (auto s = a.get("sampler")) o.solver = solver_from_name(*s);
  if (auto s = a.get("schedule")) o.schedule = schedule_from_name(*s);
  if (a.get("seed")) {
    long long s = a.get_int("seed", -1);
    if (s >= 0) o.seed = static_cast<uint64_t>(s);
  }
  o.device = a.get_or("device", "cpu");
  o.verbose = a.flag("verbose");
  o.prompt_embeds_file = a.get_or("prompt-embeds", "");
  o.negative_embeds_file = a.get_or("negative-prompt-embeds", "");
  o.init_latents_file = a.get_or("init-latents", "");

  // Outputs: checked before any heavy work.
  const std::string output = a.get_or("output", video_have_ffmpeg() ? "output.mp4" : "output.y4m");
  const std::string save_latents = a.get_or("save-latents", "");
  const std::string timings_json = a.get_or("timings-json", "");
  check_output_path(output, "--output");
  const VideoFormat format = video_format_from_path(output);
  WAN_CHECK(format != VideoFormat::Mp4 || video_have_ffmpeg(), "--output ", output,
            ": this build has no FFmpeg for .mp4; use .y4m or .png");
  if (!save_latents.empty()) {
    check_output_path(save_latents, "--save-latents");
    WAN_CHECK(save_latents != output, "--save-latents and --output name the same file");
  }
  if (!timings_json.empty()) {
    check_output_path(timings_json, "--timings-json");
    WAN_CHECK(timings_json != output && timings_json != save_latents,
              "--timings-json names the same file as another output");
  }

  const GeneratePlan plan = plan_generate(o);
  if (!quiet) fprintf(stderr, "%s", plan.describe().c_str());

  ProgressPrinter printer = ProgressPrinter::for_stderr(quiet);
  InterruptGuard interrupt;
  RunHooks hooks;
  hooks.progress = [&](const ProgressEvent& e) { printer(e); };
  hooks.cancel = &interrupt.flag();
  GenerateResult res;
  try {
    res = run_generate(plan, hooks);
  } catch (const Cancelled&) {
    printer.finish_line();
    fprintf(stderr, "interrupted: nothing written\n");
    return kExitInterrupted;
  }

  // Outputs, all or nothing.
  PendingOutputs pending;
  const auto t_write = std::chrono::steady_clock::now();
  const Tensor& v = res.video;
  const int F = static_cast<int>(v.dim(1)), H = static_cast<int>(v.dim(2)), W = static_cast<int>(v.dim(3));
  write_video(output, v.f32(), F, H, W, plan.fps);
  if (format == VideoFormat::Png) {
    for (const std::string& p : png_sequence_paths(output, F)) pending.add(p);
  } else {
    pending.add(output);
  }
  if (!save_latents.empty()) {
    std::map<std::string, std::string> meta = {
        {"task", task_name(plan.task)},
        {"width", std::to_string(plan.width)},
        {"height", std::to_string(plan.height)},
        {"frames", std::to_string(plan.frames)},
        {"steps", std::to_string(plan.sampler.steps)},
        {"sampler", solver_name(plan.sampler.solver)},
        {"schedule", schedule_name(plan.sampler.schedule)},
        {"shift", cat(plan.sampler.shift)},
        {"guide_scale", cat(plan.guide_low, ",", plan.guide_high)},
        {"seed", plan.init_latents.defined() ? "init-latents" : std::to_string(plan.seed)},
    };
    write_latents(save_latents, res.latents, meta);
    pending.add(save_latents);
  }
  RunReport rep;
  rep.timings = res.timings;
  rep.write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_write).count();
  rep.command = "generate";
  rep.task = task_name(plan.task);
  rep.device = o.device;
  rep.width = plan.width;
  rep.height = plan.height;
  rep.frames = plan.frames;
  rep.steps = plan.sampler.steps;
  rep.sampler = solver_name(plan.sampler.solver);
  rep.schedule = schedule_name(plan.sampler.schedule);
  rep.seed = plan.seed;
  rep.has_seed = !plan.init_latents.defined();
  rep.output = output;
  rep.peak_rss_bytes = peak_rss_bytes();
  rep.total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  if (!timings_json.empty()) {
    write_text_file(timings_json, format_timings_json(rep));
    pending.add(timings_json);
  }
  if (interrupt.interrupted()) {  // Ctrl-C while writing: honour it, leave nothing behind
    pending.rollback();
    fprintf(stderr, "interrupted: outputs removed\n");
    return kExitInterrupted;
  }
  pending.commit();
  if (!quiet) {
    printf("wrote %s (%d frames, %dx%d, %d fps)\n", output.c_str(), F, W, H, plan.fps);
    if (!save_latents.empty()) printf("wrote %s (latents %s)\n", save_latents.c_str(), res.latents.shape().str().c_str());
    if (!timings_json.empty()) printf("wrote %s\n", timings_json.c_str());
    printf("%s", format_summary(rep).c_str());
  }
  return 0;
}

}  // namespace wan::cli
