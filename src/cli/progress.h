// Progress display of the pipeline commands on stderr: on a terminal a live bar for the denoising
// steps and VAE chunks ("[=====>    ] step 3/40  2.31 s/step  ETA 1:23", redrawn in place), and
// otherwise plain lines, one per stage and at most about one per second for steps (logs stay
// short but a stalled run is visible). Quiet mode prints nothing.
// Also the final timing summary and its JSON form (--timings-json).
#pragma once
#include <atomic>
#include <cstdio>
#include <string>

#include "pipeline/pipeline.h"

namespace wan::cli {

class ProgressPrinter {
 public:
  // tty: redraw in place; otherwise plain lines. quiet: print nothing.
  ProgressPrinter(FILE* out, bool tty, bool quiet) : out_(out), tty_(tty), quiet_(quiet) {}
  // For stderr, decided from isatty().
  static ProgressPrinter for_stderr(bool quiet);
  void operator()(const ProgressEvent& e);
  // Ends a half-drawn bar line (before an error message or a summary).
  void finish_line();

 private:
  FILE* out_;
  bool tty_, quiet_;
  bool bar_open_ = false;
  double last_line_s_ = -1e9;
};

// Ctrl-C (SIGINT) and SIGTERM handling while it lives: the first signal sets flag() (the pipeline
// stops after the current step, VAE chunk or stage, as the message printed then says, and the command
// removes its unfinished outputs; exit_code() 130 for SIGINT, 143 for SIGTERM); a second one terminates
// the process at once (default action). One guard at a time.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
  const std::atomic<bool>& flag() const;
  bool interrupted() const { return flag().load(); }
  int exit_code() const;  // 128 + the signal that set flag()
};

// "1:23" / "1:02:03" for a duration in seconds.
std::string format_duration(double s);

// Everything the summary and --timings-json report.
struct RunReport {
  Timings timings;
  double write_s = 0;
  double total_s = 0;
  int64_t peak_rss_bytes = 0;
  // Settings echoed in the JSON (empty / zero fields are left out).
  std::string command, task, output, sampler, schedule, device;
  int width = 0, height = 0, frames = 0, steps = 0;
  uint64_t seed = 0;
  bool has_seed = false;
};
std::string format_summary(const RunReport& r);  // human, several lines
// {"command": .., "task": .., ..., "timings": {"load_s": .., "load_text_encoder_s": .., "load_dit_s": ..,
//  "load_vae_s": .., "load_overlapped": bool, "warm_up_s": .., "text_encode_s": ..,
//  "startup_to_first_step_s": .., "denoise_s": .., "steps": N, "mean_step_s": .., "step_s": [..],
//  "vae_decode_s": .., "write_s": .., "total_s": ..}, "peak_rss_bytes": .., "peak_rss_mib": ..}
// (load_overlapped: the GPU fast start, load_s is the load's wall time, see pipeline.h Timings)
std::string format_timings_json(const RunReport& r);

}  // namespace wan::cli
