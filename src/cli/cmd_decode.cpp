// `wan decode`: a latents file ("latents" [z, T_lat, H_lat, W_lat], as `wan generate
// --save-latents` writes it; see src/pipeline/files.h) through the checkpoint's VAE into a video.
// Same rules as generate: the outputs are checked (writable, not an input, PNG frames) before the VAE
// loads, Ctrl-C stops between latent frames (exit 130, nothing written), each output appears only when
// complete, and a video once written is kept (a Ctrl-C during the write skips only the --json report).
#include <chrono>
#include <cstdio>
#include <string>

#include "api/commands.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "ckpt/layout.h"
#include "pipeline/files.h"
#include "pipeline/models.h"
#include "pipeline/pipeline.h"
#include "formats/video.h"
#include "formats/video_stream.h"

namespace wan::cli {

int cmd_decode(int argc, char** argv) {
  const auto t_start = std::chrono::steady_clock::now();
  const api::Values a = api::parse_argv(api::decode_spec(), argc, argv);
  if (api::print_help_if_asked(a, api::decode_spec())) return 0;
  const bool quiet = a.flag("quiet");
  const std::string model = a.require("model");
  const std::string latents_file = a.require("latents");
  const std::string output = a.require("output");
  const std::string timings_json = a.get_or("json", "");
  const bool overwrite_frames = a.flag("overwrite-frames");
  (void)check_video_output(output, "--output", overwrite_frames);
  if (!timings_json.empty()) check_output_path(timings_json, "--json");
  check_outputs_distinct({{"--output", output}, {"--json", timings_json}}, {});
  const long long fps_arg = a.get_int("fps", 0);

  Tensor latents;
  WAN_WITH_CONTEXT("--latents", latents = read_latents(latents_file));
  const CheckpointInfo info = detect_checkpoint(model);
  WAN_CHECK(info.has(Role::Vae), info.root, ": checkpoint has no VAE");
  const VaeConfig vae = vae_config_for(info);
  WAN_CHECK(latents.dim(0) == vae.z_dim, "--latents ", latents_file, ": ", latents.dim(0), " channels but the VAE of ",
            info.root, " has z_dim ", vae.z_dim);
  std::vector<NamedFile> inputs = checkpoint_input_files(info);
  inputs.push_back({"--latents", latents_file});
  const int frames = static_cast<int>((latents.dim(1) - 1) * vae_temporal_factor(vae) + 1);
  std::vector<NamedFile> outputs = video_output_files({"--output", output}, frames);
  outputs.push_back({"--json", timings_json});
  check_outputs_distinct(outputs, inputs);
  const int fps = a.get("fps") ? static_cast<int>(fps_arg) : task_fps(info.task);

  ProgressPrinter printer = ProgressPrinter::for_stderr(quiet);
  InterruptGuard interrupt;
  RunHooks hooks;
  hooks.progress = [&](const ProgressEvent& e) { printer(e); };
  hooks.cancel = &interrupt.flag();
  // The video is encoded while the decode runs (RunHooks::video_begin); an error or Ctrl-C before the
  // last frame aborts the stream, which leaves no file.
  VideoWriteOptions vo;
  vo.overwrite_frames = overwrite_frames;
  VideoStreamWriter stream(output, vo);
  int F = 0, H = 0, W = 0;
  hooks.video_begin = [&](int frames_, int height, int width) {
    F = frames_;
    H = height;
    W = width;
    return stream.begin(frames_, height, width, fps);
  };
  hooks.video_ready = [&](int n) { stream.ready(n); };
  RunReport rep;
  try {
    (void)decode_latents(info, vae, latents, hooks, &rep.timings, a.str("device"));
  } catch (const Cancelled&) {
    stream.abort();
    printer.finish_line();
    fprintf(stderr, "interrupted: nothing written\n");
    return interrupt.exit_code();
  }

  const auto t_write = std::chrono::steady_clock::now();
  stream.finish();  // the tail of the encode that overlapped the decode
  rep.write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_write).count();
  rep.command = "decode";
  rep.task = task_name(info.task);
  rep.width = W;
  rep.height = H;
  rep.frames = F;
  rep.output = output;
  rep.peak_rss_bytes = peak_rss_bytes();
  rep.total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  if (interrupt.interrupted()) {  // Ctrl-C while writing: the video is complete and kept; stop here
    fprintf(stderr, "interrupted: kept %s%s\n", output.c_str(), timings_json.empty() ? "" : "; --json not written");
    return interrupt.exit_code();
  }
  if (!timings_json.empty()) write_text_file(timings_json, format_timings_json(rep));
  if (!quiet) {
    printf("wrote %s (%d frames, %dx%d, %d fps)\n", output.c_str(), F, W, H, fps);
    printf("%s", format_summary(rep).c_str());
  }
  return 0;
}

}  // namespace wan::cli
