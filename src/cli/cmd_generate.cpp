// `wan generate`: text (or embeddings) to video with the Wan 2.2 pipeline (src/pipeline).
// Order of work: parse options, check every output path, plan (validates the checkpoint, sizes,
// embeddings, latents and state files and the memory fit: bad input exits 2 before anything heavy),
// run with progress and Ctrl-C support, then write all outputs; a failure or an interrupt removes
// whatever this run already wrote (each writer itself writes a temporary file and renames it), so no
// partial output is left behind. With --stop-after-steps the run writes its state file (and the
// timings) instead of a video; --resume continues it. The summary reports the load / encode /
// denoise / decode seconds, s/step, the peak device memory in use and the peak host RSS, also for
// the whole run when it was resumed. Exit codes: 0, 2 bad input, 1 internal error, 130 interrupted.
// Several GPUs (--gpus N | --devices 0,1,... [--cfg-parallel] [--ulysses U] [--ring R], or one process per
// GPU started by mpirun / srun / WAN_RANK): pipeline/generate_parallel.h runs the ranks; only rank 0's
// process writes the outputs and prints the summary (with every rank's load figures).
#include <chrono>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "pipeline/denoiser.h"
#include "pipeline/files.h"
#include "pipeline/generate_parallel.h"
#include "pipeline/pipeline.h"
#include "formats/video.h"

namespace wan::cli {
namespace {

void print_help() {
  printf(
      "usage: wan generate --model DIR --prompt TEXT [options]\n"
      "       wan generate --weights random [--task t2v-A14B] --prompt TEXT [options]\n"
      "  Text-to-video with Wan 2.2 (CPU float32 reference path, or --device cuda).\n"
      "\n"
      "  --model PATH              checkpoint: official release folder, diffusers folder or ComfyUI file\n"
      "  --weights checkpoint|random  random: every weight drawn from the engine RNG at the real sizes (no\n"
      "                            files needed; the video is noise, for timings). Sizes: --task's (default\n"
      "                            t2v-A14B), --config NAME (make-checkpoint names, e.g. tiny) or --model's,\n"
      "                            whose tokenizer is then used; without one the prompt's UTF-8 bytes stand\n"
      "                            in for the tokens\n"
      "  --weights-seed N          seed of the random weights (default 0)\n"
      "  --config NAME             random weights without --model: t2v-A14B | tiny (default: the task's)\n"
      "  --layers N                random weights without --model: DiT depth override\n"
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
      "  --device DEV              cpu | cuda[:i] (default cpu). cuda runs the text encoder, the DiT (both experts\n"
      "                            resident, CUDA graphs) and the VAE decode on the GPU in bf16; the text\n"
      "                            encoder is freed before the DiT loads\n"
      "  --keep-text-encoder       cuda: keep the text encoder resident next to the DiT (counted in the fit)\n"
      "  --verbose                 print the GPU memory plan\n"
      "  --attention K             GPU attention kernel: auto (default: the engine's own on sm_90, cuDNN\n"
      "                            elsewhere) | own | cudnn\n"
      "  --gpus N | --devices 0,1,...  run on several GPUs (one rank per GPU; implies --device cuda). Also\n"
      "                            one process per GPU started by mpirun / srun / WAN_RANK + WAN_WORLD_SIZE\n"
      "                            (+ WAN_MASTER_ADDR, WAN_MASTER_PORT). The text encoder and the VAE decode\n"
      "                            run on rank 0; each rank loads 1/N of the DiT weights and broadcasts them\n"
      "  --cfg-parallel            cond and uncond on two halves of the GPUs (every step guided)\n"
      "  --ulysses U               all-to-all sequence parallel over U GPUs (U divides the heads)\n"
      "  --ring R                  ring attention over R GPUs. cfg x U x R = the GPUs; none given: automatic\n"
      "  --output FILE             .mp4 | .y4m | .png (PNG: one file per frame, name_00000.png, ...)\n"
      "                            (default output.mp4, or output.y4m in a build without FFmpeg)\n"
      "  --prompt-embeds FILE      prompt embeddings instead of --prompt (see below)\n"
      "  --negative-prompt-embeds FILE  negative prompt embeddings instead of --negative-prompt\n"
      "  --init-latents FILE       initial noise instead of the seeded one; when --size / --frames are\n"
      "                            absent they follow from its shape\n"
      "  --save-latents FILE       also write the final latents (before the VAE)\n"
      "  --timings-json FILE       also write the timings and peak memory as JSON\n"
      "  --save-state FILE --stop-after-steps N\n"
      "                            stop after step N: write the run's state (latents, sampler history, the\n"
      "                            encoded text, the settings' fingerprint, timings) and exit 0, no video\n"
      "  --resume FILE             continue a saved run: give the same options (a state saved with other\n"
      "                            settings is refused); the result equals an uninterrupted run's exactly\n"
      "  --quiet                   no progress and no summary (errors only)\n"
      "\n"
      "Files (safetensors, any float dtype read, float32 written):\n"
      "  embeddings: tensor \"prompt_embeds\" [L, text_dim] (the L real tokens of one prompt, EOS\n"
      "              included, no padding; text_dim 4096 for UMT5-XXL), as `wan encode-prompt` writes\n"
      "              it; the negative prompt's file uses the same name.\n"
      "  latents:    tensor \"latents\" [16, T_lat, H/8, W/8] (T_lat = (frames-1)/4 + 1), normalised\n"
      "              latent space; `wan decode` turns it into a video.\n"
      "  state:      \"latents\", \"state.step\", \"state.fingerprint\", \"sampler.*\", \"prompt_embeds\",\n"
      "              \"negative_prompt_embeds\", \"timings.*\" (src/pipeline/files.h).\n"
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
          "save-latents", "timings-json", "weights", "weights-seed", "config", "layers", "save-state",
          "stop-after-steps", "resume", "attention", "gpus", "devices", "ulysses", "ring"},
         {"quiet", "help", "verbose", "keep-text-encoder", "cfg-parallel"});
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
  o.attention = a.get_or("attention", "auto");
  o.prompt_embeds_file = a.get_or("prompt-embeds", "");
  o.negative_embeds_file = a.get_or("negative-prompt-embeds", "");
  o.init_latents_file = a.get_or("init-latents", "");
  const std::string weights = a.get_or("weights", "checkpoint");
  WAN_CHECK(weights == "checkpoint" || weights == "random", "--weights '", weights, "': expected checkpoint or random");
  o.random_weights = weights == "random";
  if (a.get("weights-seed")) {
    WAN_CHECK(o.random_weights, "--weights-seed needs --weights random");
    const long long s = a.get_int("weights-seed", 0);
    WAN_CHECK(s >= 0, "--weights-seed ", s, ": must be non-negative");
    o.weights_seed = static_cast<uint64_t>(s);
  }
  o.config = a.get_or("config", "");
  if (a.get("layers")) o.layers = to_int(a.get_int("layers", 0), "layers");
  WAN_CHECK(!a.get("layers") || o.layers > 0, "--layers ", o.layers, ": must be positive");
  o.keep_text_encoder = a.flag("keep-text-encoder");
  o.resume_file = a.get_or("resume", "");
  WAN_CHECK(!a.get("resume") || !o.resume_file.empty(), "--resume: empty file name");
  const std::string save_state = a.get_or("save-state", "");
  if (a.get("stop-after-steps")) {
    o.stop_after_steps = to_int(a.get_int("stop-after-steps", 0), "stop-after-steps");
    WAN_CHECK(o.stop_after_steps > 0, "--stop-after-steps ", o.stop_after_steps, ": must be positive");
  }
  WAN_CHECK(save_state.empty() == (o.stop_after_steps == 0),
            "--save-state FILE and --stop-after-steps N go together (the state after step N is written to FILE)");
  const bool stopping = o.stop_after_steps > 0;
  // Several GPUs: checked (flags, layout products) before anything else; sets o.device.
  ParallelArgs pa;
  pa.gpus = a.get_or("gpus", "");
  pa.devices = a.get_or("devices", "");
  pa.cfg = a.flag("cfg-parallel");
  pa.ulysses = a.get("ulysses");
  pa.ring = a.get("ring");
  pa.device = a.get("device");
  const ParallelRequest par = parse_parallel_request(pa, &o);

  // Outputs: checked before any heavy work.
  const std::string output = a.get_or("output", video_have_ffmpeg() ? "output.mp4" : "output.y4m");
  const std::string save_latents = a.get_or("save-latents", "");
  const std::string timings_json = a.get_or("timings-json", "");
  WAN_CHECK(!stopping || (!a.get("output") && save_latents.empty()),
            "--stop-after-steps: the run stops before the end, so there is no video or final latents to write ",
            "(drop --output / --save-latents; they belong to the --resume run)");
  if (stopping) {
    check_output_path(save_state, "--save-state");
    WAN_CHECK(save_state != timings_json, "--save-state and --timings-json name the same file");
  }
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

  ProgressPrinter printer = ProgressPrinter::for_stderr(quiet);
  InterruptGuard interrupt;
  RunHooks hooks;
  hooks.progress = [&](const ProgressEvent& e) { printer(e); };
  hooks.cancel = &interrupt.flag();
  GeneratePlan single;  // one device
  ParallelRun prun;     // several GPUs
  double plan_done_at = 0;  // process start -> plan checked (start-up breakdown)
  GenerateResult res;
  try {
    if (par.active()) {
      prun = run_generate_parallel(o, par, hooks, true, [&](const GeneratePlan& p, const dist::Layout& l) {
        plan_done_at = process_age_seconds();
        if (!quiet) fprintf(stderr, "%s%s", p.describe().c_str(), describe_parallel(par, l, p.random_weights).c_str());
      });
      if (!prun.output_rank) return 0;  // rank 0's process writes the outputs
      res = std::move(prun.result);
    } else {
      single = plan_generate(o);
      plan_done_at = process_age_seconds();
      if (!quiet) fprintf(stderr, "%s", single.describe().c_str());
      res = run_generate(single, hooks);
    }
  } catch (const Cancelled&) {
    printer.finish_line();
    fprintf(stderr, "interrupted: nothing written\n");
    return kExitInterrupted;
  }
  const GeneratePlan& plan = par.active() ? prun.plan : single;

  // Outputs, all or nothing.
  PendingOutputs pending;
  const auto t_write = std::chrono::steady_clock::now();
  const Tensor& v = res.video;
  int F = 0, H = 0, W = 0;
  if (res.state) {
    write_run_state(save_state, *res.state,
                    {{"task", task_name(plan.task)},
                     {"step", std::to_string(res.state->step)},
                     {"steps", std::to_string(plan.sampler.steps)},
                     {"weights", plan.weights},
                     {"fingerprint", plan.fingerprint}});
    pending.add(save_state);
  } else {
    F = static_cast<int>(v.dim(1));
    H = static_cast<int>(v.dim(2));
    W = static_cast<int>(v.dim(3));
    write_video(output, v.f32(), F, H, W, plan.fps);
    if (format == VideoFormat::Png) {
      for (const std::string& p : png_sequence_paths(output, F)) pending.add(p);
    } else {
      pending.add(output);
    }
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
  rep.output = res.state ? save_state : output;
  rep.peak_rss_bytes = peak_rss_bytes();
  rep.total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  // The whole run when it was resumed: this process plus the saved ones (their load/encode/steps).
  const Timings whole = merge_timings(res.earlier, res.timings);
  const int64_t whole_peak_device = std::max(res.earlier_peak_device_bytes, res.peak_device_bytes);
  const int64_t whole_peak_rss = std::max(res.earlier_peak_rss_bytes, rep.peak_rss_bytes);
  if (!timings_json.empty()) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(format_timings_json(rep));
    j["weights"] = plan.random_weights ? "random" : "checkpoint";
    if (plan.random_weights) j["weights_seed"] = plan.weights_seed;
    j["text_encoder"] = plan.text_on_gpu ? (plan.keep_text_encoder ? "gpu (kept)" : "gpu") : plan.needs_text_encoder ? "cpu" : "none";
    j["device_bytes_at_start"] = res.device_bytes_at_start;
    j["peak_device_bytes"] = res.peak_device_bytes;
    j["peak_device_gib"] = static_cast<double>(res.peak_device_bytes) / (1024.0 * 1024.0 * 1024.0);
    j["plan_done_at_s"] = plan_done_at;
    if (res.load_bytes > 0) {
      j["load_bytes"] = res.load_bytes;
      j["load_gb_per_s"] = res.load_gb_per_s;
      j["load_setup_s"] = res.load_setup_s;
    }
    j["first_step"] = res.first_step;
    j["last_step"] = res.first_step + static_cast<int>(res.timings.step_seconds.size());
    if (res.state) j["state"] = save_state;
    if (plan.resume) j["resumed_from"] = plan.resume_file;
    if (par.active()) {
      nlohmann::ordered_json pj, ranks = nlohmann::ordered_json::array();
      pj["gpus"] = par.world;
      pj["launch"] = par.where();
      pj["cfg"] = prun.layout.cfg;
      pj["ulysses"] = prun.layout.ulysses;
      pj["ring"] = prun.layout.ring;
      for (const ParallelRankStats& k : prun.ranks)
        ranks.push_back({{"rank", k.rank}, {"device", k.device}, {"load_bytes", k.load_bytes},
                         {"load_tensors", k.load_tensors}, {"load_s", k.load_s}, {"broadcast_s", k.broadcast_s},
                         {"dit_ready_s", k.dit_s}, {"peak_device_bytes", k.peak_device_bytes}});
      pj["ranks"] = ranks;
      j["parallel"] = pj;
    }
    nlohmann::ordered_json w;
    w["load_text_encoder_s"] = whole.load_text_encoder;
    w["text_encode_s"] = whole.text_encode;
    w["load_dit_s"] = whole.load_dit;
    w["load_vae_s"] = whole.load_vae;
    w["warm_up_s"] = whole.warm_up;
    w["denoise_s"] = whole.denoise;
    w["steps"] = whole.step_seconds.size();
    w["mean_step_s"] = whole.mean_step();
    w["vae_decode_s"] = whole.vae_decode;
    w["peak_device_bytes"] = whole_peak_device;
    w["peak_rss_bytes"] = whole_peak_rss;
    j["whole_run"] = w;
    write_text_file(timings_json, j.dump(2) + "\n");
    pending.add(timings_json);
  }
  if (interrupt.interrupted()) {  // Ctrl-C while writing: honour it, leave nothing behind
    pending.rollback();
    fprintf(stderr, "interrupted: outputs removed\n");
    return kExitInterrupted;
  }
  pending.commit();
  if (!quiet) {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    if (res.state)
      printf("stopped after step %d of %d: wrote %s (continue with the same options and --resume %s)\n",
             res.state->step, plan.sampler.steps, save_state.c_str(), save_state.c_str());
    else
      printf("wrote %s (%d frames, %dx%d, %d fps)\n", output.c_str(), F, W, H, plan.fps);
    if (!save_latents.empty()) printf("wrote %s (latents %s)\n", save_latents.c_str(), res.latents.shape().str().c_str());
    if (!timings_json.empty()) printf("wrote %s\n", timings_json.c_str());
    printf("%s", format_summary(rep).c_str());
    if (res.load_bytes > 0)
      printf("weights streamed to the GPU%s: %.2f GB at %.2f GB/s\n", par.active() ? "s (all ranks, slowest share)" : "",
             static_cast<double>(res.load_bytes) / 1e9, res.load_gb_per_s);
    if (par.active()) printf("%s", prun.describe().c_str());
    if (parse_device(plan.device) >= 0)
      printf("peak device memory %.2f GiB in use (cudaMemGetInfo at stage ends and steps; %.2f GiB before the run)\n",
             static_cast<double>(res.peak_device_bytes) / gib, static_cast<double>(res.device_bytes_at_start) / gib);
    if (plan.resume) {
      printf("whole run (steps 1-%d in earlier processes, %d-%d here):\n", res.first_step, res.first_step + 1,
             res.first_step + static_cast<int>(res.timings.step_seconds.size()));
      printf("  load %.2f s, text encoding %.2f s, denoising %.2f s (%zu steps, %.3f s/step), VAE decode %.2f s\n",
             whole.load(), whole.text_encode, whole.denoise, whole.step_seconds.size(), whole.mean_step(),
             whole.vae_decode);
      if (parse_device(plan.device) >= 0)
        printf("  peak device memory %.2f GiB, peak host RSS %.1f MiB\n", static_cast<double>(whole_peak_device) / gib,
               static_cast<double>(whole_peak_rss) / (1024.0 * 1024.0));
      else
        printf("  peak host RSS %.1f MiB\n", static_cast<double>(whole_peak_rss) / (1024.0 * 1024.0));
    }
    if (plan.random_weights) printf("note: random weights (--weights random): the video is noise\n");
  }
  return 0;
}

}  // namespace wan::cli
