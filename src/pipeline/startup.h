// GPU fast start (issue 6): everything between the plan and the first denoising step of a `--device
// cuda` run with checkpoint weights, overlapped:
//   - one cuda::DeviceLoader streams the text encoder (read first) and both experts from the files
//     to the device (pinned staging ring, conversion on the GPU; cuda/load_gpu.h); the encoder and DiT
//     objects that own the weights are set up on two threads before it starts;
//   - the tokenizer loads on a side thread meanwhile;
//   - once the text encoder's weights are resident the prompts are encoded and the encoder is freed
//     (unless keep_text_encoder);
//   - the DiT's warm-up (Denoiser::warm_up: activation arena, every GEMM / attention plan, CUDA graph
//     capture; graphs record pointers, so the weights may still be streaming) runs in one of two orders:
//       concurrent: on its own thread (the DiT's own stream) from the moment the loader starts, beside
//         the encoder's wait and the encoding, when the arena fits next to everything else resident at
//         that point (below): the warm-up is then off the critical path, which is the load itself;
//       sequential: on this thread after the encoder is freed (its memory is the arena's), still
//         while the experts stream.
// Memory: the text encoder and the experts' weights are resident together (plan_generate checked that
// phase, gpu_concurrent_load_fits, and the later one, weights + arena, check_gpu_denoiser, and chose
// this path only when both fit). The concurrent order is chosen after the encoder, the experts'
// weights (and the encoder's arena) are allocated, from cudaMemGetInfo's free bytes then: it needs
//   the DiT's arena + its reserve (Denoiser::warm_up_device_bytes)
//   + the encoder's headroom (plan.t5_device_bytes - its weights: its arena, already allocated and so
//     counted twice, conservatively, + its reserve)
//   + the loader's device staging (allocated by the load thread after the check).
// Either order gives bit-identical results (the same plans and graphs on the same arena layout).
// Environment (diagnostics; tests and `wan bench --load --first-step` use them):
//   WAN_FAST_START_SEQUENTIAL=0  the order chosen by memory as above (opt-in); 1, unset or empty: always the
//                                sequential order (the default: on the H100 the concurrent order measured no
//                                faster, 0.835 vs 0.805 s and 1.046 vs 1.043 s to the first step; the load is
//                                the critical path). In the concurrent order the encoder is freed only after
//                                the warm-up: a cudaFree during the graph capture on the warm-up thread
//                                invalidated the capture (a cuBLAS internal error in one CLI run);
//   WAN_STARTUP_TRACE=FILE       writes the start-up's milestones (process ages) and the order chosen
//                                as JSON (kStartupTraceVersion) to FILE when the fast start returns.
// Invariants: returns only when every weight is on the device and the warm-up has finished; on any
// error (or cancellation) the warm-up thread is joined and the loader stopped and quiesced before the
// encoder and the DiT free their memory, and the first error propagates (a wan::Error naming the file
// and tensor, or Cancelled). The VAE is not part of it: its weights are read on the host by the caller
// meanwhile (its decoder is built after the DiT is freed).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/denoiser.h"
#include "pipeline/models.h"
#include "pipeline/pipeline.h"

namespace wan {

// Milestones of one fast start as process ages (seconds since the process started, /proc/self/stat:
// ~10 ms resolution of the start itself); 0 = did not happen (no text encoder, ...).
struct StartupMarks {
  double libraries_loaded = 0;  // static initialisation of the engine (shared libraries mapped)
  double entered = 0;           // gpu_fast_start called (the plan is done)
  double loader_started = 0;    // encoder and DiT objects set up, weights allocated, loader started
  double streaming = 0;         // the load thread's staging (pinned ring, streams) ready: reads begin
  double text_resident = 0;     // the text encoder's weights on the device
  double text_encoded = 0;      // both prompts encoded
  double warm_up_done = 0;      // arena, plans and graphs ready
  double weights_resident = 0;  // every weight on the device (the loader's own end)
  double returned = 0;          // gpu_fast_start returns (all of the above joined)
};

struct FastStart {
  std::unique_ptr<Denoiser> dit;         // weights resident, arena allocated, graphs captured
  std::unique_ptr<GpuTextEncoder> text;  // only with keep_text_encoder
  Tensor cond, uncond;                   // [L, text_dim] f32: the encoded (or given) prompts
  double load_text_encoder = 0;          // start -> text encoder weights resident (0: none)
  double text_encode = 0;
  double warm_up = 0;                    // the warm-up's own duration (in either order)
  double load_wall = 0;                  // start -> every weight resident (and the warm-up done)
  double setup = 0;                      // start -> the loader started (encoder, DiT objects, allocations)
  double loader_setup = 0;               // the load thread's own set-up before the first read (LoadStats)
  uint64_t bytes = 0;                    // streamed from the files (and through getters)
  double gb_per_s = 0;                   // bytes / the loader's own wall time
  // The warm-up's order (see above) and the memory numbers it was chosen from.
  bool warm_up_concurrent = false;
  std::string warm_up_order_reason;      // "fits", "forced (WAN_FAST_START_SEQUENTIAL=1)", "memory: ..."
  size_t free_bytes_at_choice = 0, concurrent_need_bytes = 0;
  StartupMarks marks;
};

// `uses`: the (expert, batch) forwards of the run (warm-up). Needs plan.fast_start.
FastStart gpu_fast_start(const GeneratePlan& plan, const DenoiserSpec& spec,
                         const std::vector<std::pair<Expert, int>>& uses, const RunHooks& hooks);

// WAN_FAST_START_SEQUENTIAL: true for "1", unset or empty (the default), false for "0"; anything else
// throws one clear wan::Error.
bool fast_start_forced_sequential();

// The JSON written to WAN_STARTUP_TRACE (an object: "version", "warm_up_order", "reason",
// "free_bytes", "need_bytes", the durations and "marks" {name: process age}); exposed for tests.
constexpr int kStartupTraceVersion = 1;
std::string startup_trace_json(const FastStart& fs);

}  // namespace wan
