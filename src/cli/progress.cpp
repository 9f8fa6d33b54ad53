// Progress bar / plain progress lines and the timing report (see progress.h).
#include "cli/progress.h"

#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

namespace wan::cli {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) s = 0;
  long t = std::lround(s);
  char buf[32];
  if (t >= 3600) snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

ProgressPrinter ProgressPrinter::for_stderr(bool quiet) { return ProgressPrinter(stderr, isatty(2) == 1, quiet); }

void ProgressPrinter::finish_line() {
  if (bar_open_) {
    fputc('\n', out_);
    fflush(out_);
    bar_open_ = false;
  }
}

namespace {
// What a first signal stops after, as the handler says it: set by the progress events (the handler
// may only read an atomic and write fixed strings).
enum Unit : int { kUnitStage, kUnitStep, kUnitChunk };
std::atomic<int> g_unit{kUnitStage};
}  // namespace

void ProgressPrinter::operator()(const ProgressEvent& e) {
  if (e.kind == ProgressEvent::Begin)
    g_unit.store(e.stage == Stage::Denoise ? kUnitStep : e.stage == Stage::Decode ? kUnitChunk : kUnitStage);
  else if (e.kind == ProgressEvent::End)
    g_unit.store(kUnitStage);
  if (quiet_) return;
  const char* name = stage_name(e.stage);
  const bool counted = e.stage == Stage::Denoise || e.stage == Stage::Decode;
  const char* unit = e.stage == Stage::Denoise ? "step" : "chunk";
  switch (e.kind) {
    case ProgressEvent::Begin:
      finish_line();
      if (!counted) fprintf(out_, "%s ...\n", name);
      last_line_s_ = -1e9;
      break;
    case ProgressEvent::Advance: {
      if (!counted) break;
      const double per = e.done > 0 ? e.seconds / e.done : 0;
      const double eta = per * (e.total - e.done);
      if (tty_) {
        constexpr int kWidth = 30;
        int fill = e.total > 0 ? static_cast<int>(static_cast<int64_t>(kWidth) * e.done / e.total) : 0;
        std::string bar(static_cast<size_t>(fill), '=');
        if (fill < kWidth) bar += '>';
        bar.resize(kWidth, ' ');
        fprintf(out_, "\r%-10s [%s] %s %d/%d  %.2f s/%s  ETA %s  %s\033[K", name, bar.c_str(), unit, e.done, e.total,
                per, unit, format_duration(eta).c_str(), e.detail.c_str());
        bar_open_ = true;
      } else if (e.done == 1 || e.done == e.total || e.seconds - last_line_s_ >= 1.0) {
        fprintf(out_, "%s: %s %d/%d  %.2f s/%s  ETA %s%s%s\n", name, unit, e.done, e.total, per, unit,
                format_duration(eta).c_str(), e.detail.empty() ? "" : "  ", e.detail.c_str());
        last_line_s_ = e.seconds;
      }
      fflush(out_);
      break;
    }
    case ProgressEvent::End:
      finish_line();
      fprintf(out_, "%s done in %.2f s\n", name, e.seconds);
      fflush(out_);
      break;
  }
}

namespace {
std::atomic<bool> g_interrupted{false};
std::atomic<int> g_signal{0};
struct sigaction g_old_int, g_old_term;

void say(const char* s) {
  ssize_t ignored = write(2, s, std::strlen(s));
  (void)ignored;
}

extern "C" void on_signal(int sig) {
  if (g_interrupted.exchange(true)) {
    // A second signal: its default action (terminate) right away.
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  g_signal.store(sig);
  say(sig == SIGTERM ? "\nterminated: " : "\ninterrupted: ");
  const int unit = g_unit.load();
  say(unit == kUnitStep    ? "stopping after the current step"
      : unit == kUnitChunk ? "stopping after the current VAE chunk"
                           : "stopping when the current stage ends");
  say(sig == SIGTERM ? " (again to abort at once)\n" : " (Ctrl-C again to abort at once)\n");
}
}  // namespace

InterruptGuard::InterruptGuard() {
  g_interrupted.store(false);
  g_signal.store(0);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

const std::atomic<bool>& InterruptGuard::flag() const { return g_interrupted; }

int InterruptGuard::exit_code() const { return 128 + (g_signal.load() == SIGTERM ? SIGTERM : SIGINT); }

std::string format_summary(const RunReport& r) {
  const Timings& t = r.timings;
  char buf[1024];
  std::string s = "timings:\n";
  auto line = [&](const char* what, double sec, const std::string& extra = "") {
    snprintf(buf, sizeof buf, "  %-14s %9.2f s%s\n", what, sec, extra.c_str());
    s += buf;
  };
  char parts[200];
  if (t.load_wall > 0)  // fast start: the loads overlap each other, the encoding and the warm-up
    snprintf(parts, sizeof parts,
             "  (streamed together: text encoder resident after %.2f s, DiT after %.2f s; VAE read meanwhile %.2f s)",
             t.load_text_encoder, t.load_dit, t.load_vae);
  else
    snprintf(parts, sizeof parts, "  (text encoder %.2f s, DiT %.2f s, VAE %.2f s)", t.load_text_encoder, t.load_dit,
             t.load_vae);
  line("load", t.load(), parts);
  line("warm-up", t.warm_up, t.load_wall > 0 ? "  (plans and CUDA graphs, during the load)" : "");
  line("text encoding", t.text_encode, t.load_wall > 0 ? "  (during the load)" : "");
  if (t.image_encode > 0) line("image encoding", t.image_encode);
  if (t.startup > 0) line("to first step", t.startup, "  (from the start of the process)");
  char per[64];
  snprintf(per, sizeof per, "  (%zu steps, %.3f s/step)", t.step_seconds.size(), t.mean_step());
  line("denoising", t.denoise, per);
  line("VAE decode", t.vae_decode);
  line("writing", r.write_s);
  line("total", r.total_s);
  snprintf(buf, sizeof buf, "peak memory      %.1f MiB (max resident set)\n",
           static_cast<double>(r.peak_rss_bytes) / (1024.0 * 1024.0));
  s += buf;
  return s;
}

std::string format_timings_json(const RunReport& r) {
  nlohmann::ordered_json j;
  auto put_str = [&](const char* k, const std::string& v) {
    if (!v.empty()) j[k] = v;
  };
  put_str("command", r.command);
  put_str("task", r.task);
  put_str("device", r.device);
  if (r.width > 0) {
    j["width"] = r.width;
    j["height"] = r.height;
  }
  if (r.frames > 0) j["frames"] = r.frames;
  if (r.steps > 0) j["steps"] = r.steps;
  put_str("sampler", r.sampler);
  put_str("schedule", r.schedule);
  if (r.has_seed) j["seed"] = r.seed;
  put_str("output", r.output);
  const Timings& t = r.timings;
  nlohmann::ordered_json tj;
  tj["load_s"] = t.load();
  tj["load_text_encoder_s"] = t.load_text_encoder;
  tj["load_dit_s"] = t.load_dit;
  tj["load_vae_s"] = t.load_vae;
  tj["load_overlapped"] = t.load_wall > 0;
  tj["warm_up_s"] = t.warm_up;
  tj["text_encode_s"] = t.text_encode;
  tj["image_encode_s"] = t.image_encode;
  tj["startup_to_first_step_s"] = t.startup;
  tj["denoise_s"] = t.denoise;
  tj["steps"] = t.step_seconds.size();
  tj["mean_step_s"] = t.mean_step();
  tj["step_s"] = t.step_seconds;
  tj["vae_decode_s"] = t.vae_decode;
  tj["write_s"] = r.write_s;
  tj["total_s"] = r.total_s;
  j["timings"] = tj;
  j["peak_rss_bytes"] = r.peak_rss_bytes;
  j["peak_rss_mib"] = static_cast<double>(r.peak_rss_bytes) / (1024.0 * 1024.0);
  return j.dump(2) + "\n";
}

}  // namespace wan::cli
