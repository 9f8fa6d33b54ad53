// GPU fast start: everything between the plan and the first denoising step of a `--device cuda` run
// with checkpoint weights, overlapped: one DeviceLoader streams the text encoder and both experts,
// the prompts are encoded as soon as the encoder is resident, then the encoder is freed and the DiT
// warms up (arena, plans, CUDA graphs) while the experts still stream.
//
// Invariants (in full below the namespace line): returns only when every weight is on the device and
// the warm-up has finished; on any error the loader is stopped and quiesced before the models free
// their memory, and the first error propagates; the loader's staging is freed on this thread, never
// while a capture runs; plan_generate chose this path only when its load stage fits.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/denoiser.h"
#include "pipeline/models.h"
#include "pipeline/pipeline.h"
#include "runtime/memory_plan.h"

namespace wan {

// GPU fast start: everything between the plan and the first denoising step of a `--device
// cuda` run with checkpoint weights, overlapped:
//   - one cuda::DeviceLoader streams the text encoder (read first) and both experts from the files
//     to the device (pinned staging ring, conversion on the GPU; runtime/load_gpu.h); the encoder and DiT
//     objects that own the weights are set up on two threads before it starts;
//   - the tokenizer loads on a side thread meanwhile;
//   - once the text encoder's weights are resident the prompts are encoded and the encoder is freed
//     (unless keep_text_encoder);
//   - the DiT's warm-up (Denoiser::warm_up: activation arena, every GEMM / attention plan, CUDA graph
//     capture; graphs record pointers, so the weights may still be streaming) runs on this thread
//     after the encoding, once the encoder is freed (its memory is the arena's), while the experts
//     still stream. (A warm-up on its own thread beside the encoding measured no faster on an H100:
//     the critical path is the load itself; and a cudaFree / cudaFreeHost on one thread, which
//     synchronises the device, invalidates a graph capture running on another.)
// Memory: the text encoder and the experts' weights are resident together (gpu_run_memory's load
// stage; weights + arena is its denoise stage: plan_generate chose this path only when both fit); the
// arena is allocated once the encoder is freed.
// Environment (diagnostics; tests and `wan bench --load --first-step` use it):
//   WAN_STARTUP_TRACE=FILE  writes the start-up's durations and milestones (process ages) as JSON
//                           (kStartupTraceVersion) to FILE when the fast start returns.
// Invariants: returns only when every weight is on the device and the warm-up has finished; on any
// error (or cancellation) the loader is stopped and quiesced before the encoder and the DiT free
// their memory, and the first error propagates (a wan::Error naming the file and tensor, or
// Cancelled). The loader's staging is freed on this thread (finish()), never while a capture runs.
// The VAE is not part of it: its weights are read on the host by the caller meanwhile (its decoder
// is built after the DiT is freed).

// Milestones of one fast start as process ages (seconds since the process started, /proc/self/stat:
// ~10 ms resolution of the start itself); 0 = did not happen (no text encoder, ...).
struct StartupMarks {
  double libraries_loaded = 0;  // static initialisation of the engine (shared libraries mapped)
  double entered = 0;           // gpu_fast_start called (the plan is done)
  double loader_started = 0;    // encoder and DiT objects set up, weights allocated, loader started
  double streaming = 0;         // the first read begins (streams, files, the first pinned buffer ready)
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
  double warm_up = 0;                    // the warm-up's own duration
  double load_wall = 0;                  // start -> every weight resident (and the warm-up done)
  double setup = 0;                      // start -> the loader started (encoder, DiT objects, allocations)
  double loader_setup = 0;               // the load thread's own set-up before the first read (LoadStats)
  double staging_free = 0;               // freeing the loader's staging after the load (LoadStats::free_seconds)
  uint64_t bytes = 0;                    // streamed from the files (and through getters)
  double gb_per_s = 0;                   // bytes / the loader's own wall time
  StartupMarks marks;
};

// The run-level device memory plan of a one-GPU run (runtime/memory_plan.h) from the DiT's share `m`
// and plan's text encoder and VAE: what the load, text encode, denoise and decode stages hold. With
// checkpoint weights it plans the fast start when that load stage (text encoder, experts, staging,
// reserve) fits m.free_bytes (*fast_start true), else the sequential start. Plain arithmetic.
RunMemoryPlan gpu_run_memory(const GeneratePlan& plan, const GpuDiTMemory& m, bool decode, bool* fast_start);
// One rank's share of a run on several GPUs (DiT laid out as `layout`, m planned with it): rank 0 also
// encodes the text (freed before the DiT loads) and decodes; the sequential start (no fast start).
RunMemoryPlan rank_run_memory(const GeneratePlan& plan, const GpuDiTMemory& m, const std::string& device,
                              const dist::Layout& layout, bool rank0, bool decode);
// plan_generate's device step for `--device cuda`: the text encoder's device bytes, then (one GPU) the
// DiT's share and the run-level plan (p.memory, p.dit_memory, p.fast_start), checked against the free
// memory now, then the VAE check. Several GPUs: each rank checks its rank_run_memory before any work on
// its device.
void plan_gpu_run(bool parallel, bool decode, bool keep_text_encoder, GeneratePlan& p);
// What a weight residency (GpuDiTMemory's) adds to a run's time, in seconds, by the plan's arithmetic:
// SwapExperts copies an expert's allocation over PCIe at every change of expert (the first step's
// included, since the fill leaves the last expert on the device); StreamBlocks copies every block every
// forward, hidden behind the other blocks' compute except where a block's copy outlasts a block's compute
// (FLOPs at kResidencyFlops; copies at kResidencyPcie, from disk at kResidencyDisk). Resident: 0. The
// choice among the residencies that fit takes the cheapest (the fastest first on a tie); streaming from
// disk only when no residency in memory fits the device and host budgets, and the spill folder has room.
constexpr double kResidencyPcie = 50e9;      // B/s, pinned host to device (H100, measured ~55 GB/s)
constexpr double kResidencyDisk = 3e9;       // B/s, a spill file read back (an NVMe disk; the page cache is faster)
constexpr double kResidencyFlops = 500e12;   // FLOP/s, a block's bf16 GEMMs and attention (measured ~640)
double residency_cost_seconds(const GeneratePlan& plan, const GpuDiTMemory& m);

// The decode tilings the memory plan may take for p (p.vae_tile): off: untiled; fixed: p.vae_tiling;
// auto: untiled, then square tiles of 512, 384 and 256 pixels with a 1/4 overlap, each only when it cuts
// the frame into more tiles than the one before (largest first: fewer tiles, less overlap recomputed).
std::vector<VaeTiling> vae_tiling_candidates(const GeneratePlan& p);
// Of n candidate decode tilings (largest first), the first whose run plan `run_at(i)` fits `limit` on
// `device`; else the first whose decode stage fits (a smaller tile does not help the other stages); else
// the last. Returns the index; *run gets its plan. choose_residency's step for each residency.
size_t fit_decode_tiling(size_t n, const std::function<RunMemoryPlan(size_t)>& run_at, const std::string& device,
                         size_t limit, RunMemoryPlan* run);

// The host memory a GPU run holds for weights at once (its plan's host_weights_bytes).
int64_t gpu_host_weights_bytes(const GeneratePlan& p);

// `uses`: the (expert, batch) forwards of the run (warm-up). Needs plan.fast_start.
FastStart gpu_fast_start(const GeneratePlan& plan, const DenoiserSpec& spec,
                         const std::vector<std::pair<Expert, int>>& uses, const RunHooks& hooks);

// The JSON written to WAN_STARTUP_TRACE (an object: "version", the durations (*_s), "bytes",
// "gb_per_s" and "marks" {name: process age}); exposed for tests. Version 2: without version 1's
// warm-up order fields ("warm_up_order", "reason", "free_bytes", "need_bytes"), with "staging_free_s".
constexpr int kStartupTraceVersion = 2;
std::string startup_trace_json(const FastStart& fs);

}  // namespace wan
