// GPU fast start (issue 6): everything between the plan and the first denoising step of a `--device
// cuda` run with checkpoint weights, overlapped:
//   - one cuda::DeviceLoader streams the text encoder (read first) and both experts from the files
//     to the device (pinned staging ring, conversion on the GPU; cuda/load_gpu.h); the encoder and DiT
//     objects that own the weights are set up on two threads before it starts;
//   - the tokenizer loads on a side thread meanwhile;
//   - once the text encoder's weights are resident the prompts are encoded and the encoder is freed
//     (unless keep_text_encoder), then the DiT's activation arena is allocated and every plan built
//     and CUDA graph captured (Denoiser::warm_up) while the experts are still streaming in.
// Memory: the text encoder and the experts' weights are resident together, the DiT's arena only after
// the encoder is freed; plan_generate checked both phases (gpu_concurrent_load_fits and
// check_gpu_denoiser) before any work and chose this path only when both fit.
// Invariants: returns only when every weight is on the device; on any error (or cancellation) the
// loader is stopped and quiesced before the encoder and the DiT free their memory, and the error
// propagates (a wan::Error naming the file and tensor, or Cancelled). The VAE is not part of it: its
// weights are read on the host by the caller meanwhile (its decoder is built after the DiT is freed).
#pragma once
#include <memory>
#include <utility>
#include <vector>

#include "pipeline/denoiser.h"
#include "pipeline/models.h"
#include "pipeline/pipeline.h"

namespace wan {

struct FastStart {
  std::unique_ptr<Denoiser> dit;         // weights resident, arena allocated, graphs captured
  std::unique_ptr<GpuTextEncoder> text;  // only with keep_text_encoder
  Tensor cond, uncond;                   // [L, text_dim] f32: the encoded (or given) prompts
  double load_text_encoder = 0;          // start -> text encoder weights resident (0: none)
  double text_encode = 0;
  double warm_up = 0;
  double load_wall = 0;                  // start -> every weight resident
  double setup = 0;                      // start -> the loader started (encoder, DiT objects, allocations)
  uint64_t bytes = 0;                    // streamed from the files (and through getters)
  double gb_per_s = 0;                   // bytes / the loader's own wall time
};

// `uses`: the (expert, batch) forwards of the run (warm-up). Needs plan.fast_start.
FastStart gpu_fast_start(const GeneratePlan& plan, const DenoiserSpec& spec,
                         const std::vector<std::pair<Expert, int>>& uses, const RunHooks& hooks);

}  // namespace wan
