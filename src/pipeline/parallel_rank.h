// The rank code of a multi-GPU run that run_generate_parallel (one job per launch) and ParallelSession
// (jobs in turn on one launch) share: internal to pipeline/generate_parallel.cpp, parallel_load.cpp and
// parallel_session.cpp. One rank's job (rank_job) is steps 0-6 of generate_parallel.h; what a rank keeps
// from one job to the next (RankKeep) makes the difference between the two.
#pragma once
#ifdef WAN_HAVE_NCCL
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/check.h"
#include "pipeline/generate_parallel.h"
#include "pipeline/model_cache.h"
#include "pipeline/parallel_groups.h"
#include "pipeline/pipeline_internal.h"

namespace wan::pipeline_detail {

struct StreamOwner {
  cudaStream_t s = nullptr;
  StreamOwner() { CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~StreamOwner() {
    if (s) cudaStreamDestroy(s);
  }
  StreamOwner(const StreamOwner&) = delete;
  StreamOwner& operator=(const StreamOwner&) = delete;
};

struct DeviceBytes {
  void* p = nullptr;
  explicit DeviceBytes(size_t n) { CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 16))); }
  ~DeviceBytes() {
    if (p) cudaFree(p);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
};

// The experts a plan's schedule uses, high-noise first (the DiT's expert order).
inline std::vector<Role> expert_roles(const GeneratePlan& p) {
  return expert_roles(p.ckpt, uses_expert(p.experts, Expert::High), uses_expert(p.experts, Expert::Low));
}

// What one rank keeps between jobs of one launch. groups: made by the first job (after its memory
// check), for the launch's layout. With keep_dit (a session) the rank's DiT stays after the job under
// its key (dit_cache_key) and the latent elements it was planned for; a later job reuses it when every
// rank's kept DiT serves it (the same key, a latent no larger), else every rank frees its own and
// builds anew. Declared after groups: the DiT uses them and goes first.
struct RankKeep {
  std::optional<dist::ParallelGroups> groups;
  bool keep_dit = false;
  std::unique_ptr<cuda::DiTGpu> dit;
  std::string key;
  int64_t latent = 0;
  // Rank 0 of a session: the text encoder and the VAE's host weights, under their model_cache.h keys.
  ModelCache models;
  void drop_dit() {
    dit.reset();
    key.clear();
    latent = 0;
  }
};

// Thrown on every rank at the same step boundary when a rank saw the job's cancel flag (the ranks agree
// before each step): nothing is in flight, so a session keeps its launch and its DiT.
struct StepsStopped : Error {
  StepsStopped() : Error("interrupted (Ctrl-C)", ErrorKind::Internal) {}
};

// What rank 0 hands back to its caller. built / reused: models this job built (DiT, text encoder, VAE
// weights) or took from the ranks' keep.
struct RankZeroOut {
  GenerateResult result;
  std::vector<ParallelRankStats> ranks;
  int built = 0, reused = 0;
};

// One job of plan `p` on this rank (generate_parallel.h, steps 0-6). Collective: every rank of ctx
// calls it with the same plan, layout, decode and load_only, and the same keep state. `out` is written
// on rank 0. load_only (a session's preload, keep.keep_dit): steps 0 and 2 only, the DiT kept for the
// plan's later jobs; nothing is encoded, sampled or decoded.
void rank_job(dist::RankContext& ctx, const GeneratePlan& p, const dist::Layout& layout, const RunHooks& caller,
              bool decode, RankKeep& keep, RankZeroOut* out, bool load_only = false);

}  // namespace wan::pipeline_detail
#endif  // WAN_HAVE_NCCL
