// Sub-communicators of a parallel layout (see parallel_groups.h).
#ifdef WAN_HAVE_NCCL
#include "pipeline/parallel_groups.h"

#include "core/error.h"
#include "kernels/check.h"

namespace wan::dist {

cuda::DiTGpu::Options::Parallel ParallelGroups::view() const {
  cuda::DiTGpu::Options::Parallel p;
  p.cfg = cfg.get();
  p.ulysses = ulysses.get();
  p.ring = ring.get();
  p.seq = seq2d ? seq2d.get() : (ulysses ? ulysses.get() : ring.get());
  return p;
}

ParallelGroups make_groups(ncclComm_t world, const Layout& layout, const std::function<void(ncclComm_t)>& adopt) {
  int rank = 0, size = 0;
  NCCL_CHECK(ncclCommUserRank(world, &rank));
  NCCL_CHECK(ncclCommCount(world, &size));
  WAN_CHECK(layout.world() == size, "parallel layout ", describe(layout), " needs ", layout.world(),
            " ranks, the launch has ", size);
  ParallelGroups g;
  g.layout = layout;
  g.me = coords(layout, rank);
  const Comm w(world, false);
  const int U = layout.ulysses, R = layout.ring;
  // Every rank makes the same splits in the same order (each is collective over the world).
  if (U > 1) g.ulysses = w.split(g.me.cfg * R + g.me.ring, g.me.ulysses, adopt);
  if (R > 1) g.ring = w.split(g.me.cfg * U + g.me.ulysses, g.me.ring, adopt);
  if (U > 1 && R > 1) g.seq2d = w.split(g.me.cfg, g.me.seq, adopt);
  if (layout.cfg > 1) g.cfg = w.split(g.me.seq, g.me.cfg, adopt);
  WAN_ASSERT((!g.ulysses || g.ulysses->rank() == g.me.ulysses) && (!g.ring || g.ring->rank() == g.me.ring) &&
                 (!g.seq2d || g.seq2d->rank() == g.me.seq) && (!g.cfg || g.cfg->rank() == g.me.cfg),
             "NCCL split ranks differ from the layout's");
  return g;
}

}  // namespace wan::dist
#endif  // WAN_HAVE_NCCL
