// Internal to the pipeline (pipeline.cpp, generate_parallel.cpp): the Begin / Advance / End progress events
// of one stage and its duration. The constructor honours the run's cancel flag (throws Cancelled), so a
// cancelled run stops at the next stage boundary; hooks without progress or cancel make it a plain timer.
#pragma once
#include <atomic>
#include <chrono>
#include <string>

#include "pipeline/pipeline.h"

namespace wan::pipeline_detail {

class StageTimer {
 public:
  using Clock = std::chrono::steady_clock;
  StageTimer(const RunHooks& h, Stage s, int total = 0) : h_(h), s_(s), total_(total), t0_(Clock::now()) {
    if (h_.cancel && h_.cancel->load(std::memory_order_relaxed)) throw Cancelled();
    emit(ProgressEvent::Begin, 0, "");
  }
  void advance(int done, const std::string& detail = "") { emit(ProgressEvent::Advance, done, detail); }
  double end() {
    const double s = elapsed();
    emit(ProgressEvent::End, total_, "");
    return s;
  }
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

 private:
  void emit(ProgressEvent::Kind k, int done, const std::string& detail) {
    if (!h_.progress) return;
    ProgressEvent e;
    e.kind = k;
    e.stage = s_;
    e.done = done;
    e.total = total_;
    e.seconds = elapsed();
    e.detail = detail;
    h_.progress(e);
  }
  const RunHooks& h_;
  Stage s_;
  int total_;
  Clock::time_point t0_;
};

}  // namespace wan::pipeline_detail
