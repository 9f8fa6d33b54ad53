// Internal to the pipeline (pipeline.cpp, generate_parallel.cpp, denoiser_gpu.cpp): what the single- and the
// multi-GPU runs share.
//   - StageTimer: the Begin / Advance / End progress events of one stage and its duration. The constructor
//     honours the run's cancel flag (throws Cancelled), so a cancelled run stops at the next stage boundary;
//     hooks without progress or cancel make it a plain timer.
//   - context_batch, uses_expert, expert_roles: the DiT's text batch and the experts a schedule needs.
#pragma once
#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "ckpt/layout.h"
#include "core/tensor.h"
#include "pipeline/pipeline.h"
#include "sampler/sampler.h"

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

// Context batch [B, Lmax, D] of f32 text embeddings [L_b, D] (rows past each prompt's length are zero) and
// the lengths L_b; the widths must agree.
Tensor context_batch(const std::vector<const Tensor*>& embeds, std::vector<int64_t>* lens);

// Whether any step of the schedule runs expert e.
bool uses_expert(const ExpertSchedule& es, Expert e);

// The checkpoint roles of the experts used, high-noise first (a checkpoint with one DiT serves as the
// high-noise expert).
inline std::vector<Role> expert_roles(const CheckpointInfo& ckpt, bool use_high, bool use_low) {
  const bool single = ckpt.has(Role::DiT) && !ckpt.has(Role::DiTHigh);
  std::vector<Role> roles;
  if (use_high) roles.push_back(single ? Role::DiT : Role::DiTHigh);
  if (use_low) roles.push_back(Role::DiTLow);
  return roles;
}

}  // namespace wan::pipeline_detail
