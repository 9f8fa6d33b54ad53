// The NCCL sub-communicators of a parallel layout (parallel_layout.h), split from the world
// communicator, and the DiTGpu::Options::Parallel view of them (src/models/dit/dit_gpu.h).
//
// Invariants: make_groups() is collective over the world communicator (every rank calls it with the
// same layout); groups of degree 1 are not created (null); the sequence group is a separate
// communicator only for a 2D layout (Ulysses > 1 and Ring > 1), else it is the Ulysses or the Ring
// group. When `adopt` is given (RankContext::register_comm) the launcher owns the communicators and
// aborts them on failure; else the Comm objects own them.
#pragma once
#ifdef WAN_HAVE_NCCL
#include <nccl.h>

#include <functional>
#include <memory>

#include "models/dit/dit_gpu.h"
#include "runtime/dist/comm.h"
#include "runtime/dist/parallel_layout.h"

namespace wan::dist {

struct ParallelGroups {
  Layout layout;
  RankCoords me;
  std::unique_ptr<Comm> cfg, ulysses, ring, seq2d;
  cuda::DiTGpu::Options::Parallel view() const;
};

ParallelGroups make_groups(ncclComm_t world, const Layout& layout,
                           const std::function<void(ncclComm_t)>& adopt = {});

}  // namespace wan::dist
#endif  // WAN_HAVE_NCCL
