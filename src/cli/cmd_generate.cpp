// `wan generate`: text (or embeddings) to video with the Wan 2.2 pipeline (src/pipeline).
// Order of work: parse options, check every output path, plan (validates the checkpoint, sizes,
// embeddings, latents and state files and the memory fit: bad input exits 2 before anything heavy),
// run with progress and Ctrl-C support. Each output is committed on its own (a temporary file renamed
// into place) and never removed again: the latents are written before the decode starts, so a failed
// or interrupted decode or video write keeps them; the video (encoded on a thread while the decode
// produces its frames, formats/video_stream.h), then the --json report, follow. With
// --stop-after-steps the run writes its state file (and the timings) instead of a video; --resume
// continues it. The summary reports the load / encode /
// denoise / decode seconds, s/step, the peak device memory in use and the peak host RSS, also for
// the whole run when it was resumed. Exit codes: 0, 2 bad input, 1 internal error, 130 / 143 on SIGINT / SIGTERM.
// Several GPUs (--gpus N | --devices 0,1,... [--cfg-parallel] [--ulysses U] [--ring R], or one process per
// GPU started by mpirun / srun / WAN_RANK): pipeline/generate_parallel.h runs the ranks; only rank 0's
// process writes the outputs and prints the summary (with every rank's load figures).
#include <chrono>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "api/commands.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "pipeline/denoiser.h"
#include "pipeline/files.h"
#include "pipeline/generate_parallel.h"
#include "pipeline/pipeline.h"
#include "formats/video.h"
#include "formats/video_stream.h"

namespace wan::cli {

namespace {

// The --json document: the run report, then the plan's and this run's own figures, and the whole run's
// when it was resumed.
std::string timings_document(const RunReport& rep, const GeneratePlan& plan, const GenerateResult& res,
                             const std::string& save_state, const ParallelRequest& par, const ParallelRun& prun,
                             double plan_done_at) {
  const Timings whole = merge_timings(res.earlier, res.timings);
  const int64_t whole_peak_device = std::max(res.earlier_peak_device_bytes, res.peak_device_bytes);
  const int64_t whole_peak_rss = std::max(res.earlier_peak_rss_bytes, rep.peak_rss_bytes);
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(format_timings_json(rep));
  j["weights"] = plan.random_weights ? "random" : "checkpoint";
  if (plan.random_weights) j["weights_seed"] = plan.weights_seed;
  j["text_encoder"] = plan.text_on_gpu          ? (plan.keep_text_encoder ? "gpu (kept)" : "gpu")
                      : plan.needs_text_encoder ? "cpu"
                                                : "none";
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
  w["image_encode_s"] = whole.image_encode;
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
  return j.dump(2) + "\n";
}

struct OutputPaths {
  std::string output, save_state, save_latents, json;  // empty: not written by this run
};

std::vector<NamedFile> output_files(const OutputPaths& out) {
  return {{"--output", out.output}, {"--save-state", out.save_state}, {"--save-latents", out.save_latents},
          {"--json", out.json}};
}

// The summary on stdout: what was written, the timings, the load speed, the device memory and, for a
// resumed run, the whole run's figures.
void print_summary(const RunReport& rep, const GeneratePlan& plan, const GenerateResult& res,
                   const ParallelRequest& par, const ParallelRun& prun, const OutputPaths& out, int F, int W, int H) {
  // The whole run when it was resumed: this process plus the saved ones (their load/encode/steps).
  const Timings whole = merge_timings(res.earlier, res.timings);
  const int64_t whole_peak_device = std::max(res.earlier_peak_device_bytes, res.peak_device_bytes);
  const int64_t whole_peak_rss = std::max(res.earlier_peak_rss_bytes, rep.peak_rss_bytes);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  if (res.state)
    printf("stopped after step %d of %d: wrote %s (continue with the same options and --resume %s)\n",
           res.state->step, plan.sampler.steps, out.save_state.c_str(), out.save_state.c_str());
  else
    printf("wrote %s (%d frames, %dx%d, %d fps)\n", out.output.c_str(), F, W, H, plan.fps);
  if (!out.save_latents.empty())
    printf("wrote %s (latents %s)\n", out.save_latents.c_str(), res.latents.shape().str().c_str());
  if (!out.json.empty()) printf("wrote %s\n", out.json.c_str());
  printf("%s", format_summary(rep).c_str());
  if (res.load_bytes > 0)
    printf("weights streamed to the GPU%s: %.2f GB at %.2f GB/s\n", par.active() ? "s (all ranks, slowest share)" : "",
           static_cast<double>(res.load_bytes) / 1e9, res.load_gb_per_s);
  if (par.active()) printf("%s", prun.describe().c_str());
  if (api::parse_device(plan.device) >= 0)
    printf("peak device memory %.2f GiB in use (cudaMemGetInfo at stage ends and steps; %.2f GiB before the run)\n",
           static_cast<double>(res.peak_device_bytes) / gib, static_cast<double>(res.device_bytes_at_start) / gib);
  if (plan.resume) {
    printf("whole run (steps 1-%d in earlier processes, %d-%d here):\n", res.first_step, res.first_step + 1,
           res.first_step + static_cast<int>(res.timings.step_seconds.size()));
    printf("  load %.2f s, text encoding %.2f s, denoising %.2f s (%zu steps, %.3f s/step), VAE decode %.2f s\n",
           whole.load(), whole.text_encode, whole.denoise, whole.step_seconds.size(), whole.mean_step(),
           whole.vae_decode);
    if (api::parse_device(plan.device) >= 0)
      printf("  peak device memory %.2f GiB, peak host RSS %.1f MiB\n", static_cast<double>(whole_peak_device) / gib,
             static_cast<double>(whole_peak_rss) / (1024.0 * 1024.0));
    else
      printf("  peak host RSS %.1f MiB\n", static_cast<double>(whole_peak_rss) / (1024.0 * 1024.0));
  }
  if (plan.random_weights) printf("note: random weights (--weights random): the video is noise\n");
}

// Checks every output path before any heavy work: their sets (a stopping run writes only its state
// and the timings), that each can be written now (a temporary file is created and removed), that no
// two are one file, and the video's format and PNG frames. The plan then checks them against the inputs.
OutputPaths check_outputs(const api::Values& a, bool stopping) {
  OutputPaths out;
  out.save_state = a.get_or("save-state", "");
  out.output = a.get_or("output", api::default_video_output());
  out.save_latents = a.get_or("save-latents", "");
  out.json = a.get_or("json", "");
  WAN_CHECK(!stopping || (!a.get("output") && out.save_latents.empty()),
            "--stop-after-steps: the run stops before the end, so there is no video or final latents to write ",
            "(drop --output / --save-latents; they belong to the --resume run)");
  if (stopping) {
    check_output_path(out.save_state, "--save-state");
    out.output.clear();  // not written by this run
  } else {
    (void)check_video_output(out.output, "--output", a.flag("overwrite-frames"));
  }
  if (!out.save_latents.empty()) check_output_path(out.save_latents, "--save-latents");
  if (!out.json.empty()) check_output_path(out.json, "--json");
  check_outputs_distinct(output_files(out), {});
  return out;
}

// A finished run: its plan (one device, or the ranks' on several GPUs) and its result.
struct GenerateRun {
  GeneratePlan single;                // one device
  ParallelRun prun;                   // several GPUs
  const GeneratePlan* plan = nullptr;  // the one in use, once planned
  double plan_done_at = 0;            // process start -> plan checked (start-up breakdown)
  GenerateResult res;
  bool latents_written = false;  // --save-latents is on disk (written before the decode)
  // The video, encoded while the decode still runs (RunHooks::video_begin); unused when the run hands
  // back a whole video instead (several GPUs), and aborted, leaving no file, if the run fails.
  std::unique_ptr<VideoStreamWriter> stream;
};

void write_final_latents(const GeneratePlan& plan, const Tensor& latents, const std::string& path) {
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
  write_latents(path, latents, meta);
}

// Plans and runs the generation with progress on stderr and Ctrl-C support; --save-latents is written
// as soon as the latents exist (RunHooks::latents_done), before the decode. Returns the exit code when
// the command ends here (interrupted, or a rank whose process writes nothing), else nullopt.
std::optional<int> run_pipeline(const GenerateOptions& o, const ParallelRequest& par, const OutputPaths& out,
                                bool overwrite_frames, bool quiet, ProgressPrinter& printer,
                                const InterruptGuard& interrupt, GenerateRun& run) {
  RunHooks hooks;
  hooks.progress = [&](const ProgressEvent& e) { printer(e); };
  hooks.cancel = &interrupt.flag();
  hooks.latents_done = [&](const Tensor& latents) {
    if (out.save_latents.empty()) return;
    WAN_ASSERT(run.plan != nullptr, "latents before the plan");
    write_final_latents(*run.plan, latents, out.save_latents);
    run.latents_written = true;
  };
  if (!out.output.empty()) {
    VideoWriteOptions vo;
    vo.overwrite_frames = overwrite_frames;
    run.stream = std::make_unique<VideoStreamWriter>(out.output, vo);
    hooks.video_begin = [&](int frames, int height, int width) {
      WAN_ASSERT(run.plan != nullptr, "video before the plan");
      return run.stream->begin(frames, height, width, run.plan->fps);
    };
    hooks.video_ready = [&](int n) { run.stream->ready(n); };
  }
  const std::string kept = cat("kept --save-latents ", out.save_latents);
  try {
    if (par.active()) {
      run.prun = run_generate_parallel(o, par, hooks, true, [&](const GeneratePlan& p, const dist::Layout& l) {
        run.plan = &p;
        run.plan_done_at = process_age_seconds();
        if (!quiet) fprintf(stderr, "%s%s", p.describe().c_str(), describe_parallel(par, l, p.random_weights).c_str());
      });
      if (!run.prun.output_rank) return 0;  // rank 0's process writes the outputs
      run.res = std::move(run.prun.result);
      run.plan = &run.prun.plan;
    } else {
      run.single = plan_generate(o);
      run.plan = &run.single;
      run.plan_done_at = process_age_seconds();
      if (!quiet) fprintf(stderr, "%s", run.single.describe().c_str());
      run.res = run_generate(run.single, hooks);
    }
  } catch (const Cancelled&) {
    printer.finish_line();
    if (run.stream) run.stream->abort();
    const std::string what = run.latents_written ? kept + "; nothing else written" : "nothing written";
    fprintf(stderr, "interrupted: %s\n", what.c_str());
    return interrupt.exit_code();
  } catch (const Error&) {
    printer.finish_line();
    if (run.stream) run.stream->abort();
    if (run.latents_written) fprintf(stderr, "%s (written before the failure)\n", kept.c_str());
    throw;
  }
  return std::nullopt;
}

// The state file of a stopped run, or the video (one file, or a PNG sequence); sets the video's frames
// and size (0 for a state file).
void write_main_output(const GeneratePlan& plan, GenerateRun& run, const OutputPaths& out, bool overwrite_frames,
                       int& F, int& H, int& W) {
  const GenerateResult& res = run.res;
  if (res.state) {
    write_run_state(out.save_state, *res.state,
                    {{"task", task_name(plan.task)},
                     {"step", std::to_string(res.state->step)},
                     {"steps", std::to_string(plan.sampler.steps)},
                     {"weights", plan.weights},
                     {"fingerprint", plan.fingerprint}});
    return;
  }
  if (!res.video.defined() && run.stream && run.stream->started()) {  // encoded during the decode: the tail
    run.stream->finish();
    F = run.stream->frames();
    H = run.stream->height();
    W = run.stream->width();
    return;
  }
  if (run.stream) run.stream->abort();  // not started: nothing to remove
  const Tensor& v = res.video;
  F = static_cast<int>(v.dim(1));
  H = static_cast<int>(v.dim(2));
  W = static_cast<int>(v.dim(3));
  VideoWriteOptions vo;
  vo.overwrite_frames = overwrite_frames;
  write_video(out.output, v.f32(), F, H, W, plan.fps, vo);
}

RunReport make_report(const GeneratePlan& plan, const GenerateResult& res, const GenerateOptions& o,
                      const OutputPaths& out, double write_s, std::chrono::steady_clock::time_point t_start) {
  RunReport rep;
  rep.timings = res.timings;
  rep.write_s = write_s;
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
  rep.output = res.state ? out.save_state : out.output;
  rep.peak_rss_bytes = peak_rss_bytes();
  rep.total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return rep;
}

// Writes the video (or the state), then the --json report. Every output is kept once complete: a Ctrl-C
// during the write lets the video finish, keeps it and skips the report. Prints the summary unless
// quiet; returns the exit code.
int write_outputs(GenerateRun& run, const GeneratePlan& plan, const GenerateOptions& o,
                  const ParallelRequest& par, const OutputPaths& out, bool overwrite_frames,
                  const InterruptGuard& interrupt, bool quiet, std::chrono::steady_clock::time_point t_start) {
  const GenerateResult& res = run.res;
  const auto t_write = std::chrono::steady_clock::now();
  int F = 0, H = 0, W = 0;
  write_main_output(plan, run, out, overwrite_frames, F, H, W);
  const double write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_write).count();
  const RunReport rep = make_report(plan, res, o, out, write_s, t_start);
  if (interrupt.interrupted()) {  // Ctrl-C while writing: stop here, keep what is complete
    const std::string kept = (res.state ? out.save_state : out.output) +
                             (run.latents_written ? " and " + out.save_latents : std::string()) +
                             (out.json.empty() ? "" : "; --json not written");
    fprintf(stderr, "interrupted: kept %s\n", kept.c_str());
    return interrupt.exit_code();
  }
  if (!out.json.empty())
    write_text_file(out.json, timings_document(rep, plan, res, out.save_state, par, run.prun, run.plan_done_at));
  if (!quiet) print_summary(rep, plan, res, par, run.prun, out, F, W, H);
  return 0;
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  const auto t_start = std::chrono::steady_clock::now();
  const api::Values a = api::parse_argv(api::generate_spec(), argc, argv);
  if (api::print_help_if_asked(a, api::generate_spec())) return 0;
  const bool quiet = a.flag("quiet");
  ParallelArgs pa;
  GenerateOptions o = api::generate_options(a, &pa);
  // (on the CPU the plan refuses FP8 in one line of its own)
  if (a.str("precision") == "fp8" && !quiet && o.device != "cpu") fprintf(stderr, "%s\n", api::kPrecisionFp8Note);
  const bool stopping = o.stop_after_steps > 0;
  // Several GPUs: checked (flags, layout products) before anything else; sets o.device.
  const ParallelRequest par = parse_parallel_request(pa, &o);
  const OutputPaths out = check_outputs(a, stopping);
  o.outputs = output_files(out);  // the plan refuses any that is one of its inputs

  ProgressPrinter printer = ProgressPrinter::for_stderr(quiet);
  InterruptGuard interrupt;
  GenerateRun run;
  const bool overwrite_frames = a.flag("overwrite-frames");
  if (const std::optional<int> code = run_pipeline(o, par, out, overwrite_frames, quiet, printer, interrupt, run))
    return *code;
  const int code = write_outputs(run, *run.plan, o, par, out, overwrite_frames, interrupt, quiet, t_start);
  // A one-process GPU run that has written everything ends here: tearing down the CUDA context, the
  // library handles and what is still allocated is work the driver and the OS do anyway at exit, and
  // it cost ~0.1 s of wall time after the video was written (the 720p run's wall minus its in-process
  // total went from 0.35 to 0.25 s). Several processes (MPI) exit normally.
  if (code == 0 && !par.active() && run.plan->device != "cpu") {
    std::fflush(nullptr);
    std::_Exit(0);
  }
  return code;
}

}  // namespace wan::cli
