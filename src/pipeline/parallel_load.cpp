// The sharded DiT load of a multi-GPU run (make_rank_dit, generate_parallel.h step 2): each rank streams
// its byte range of every expert's allocation from the files, then every range is broadcast from its
// owner; or, with random weights, every rank draws the same values.
#include <chrono>
#include <future>

#include "core/clock.h"
#include "core/error.h"
#include "pipeline/generate_parallel.h"

#ifdef WAN_HAVE_NCCL
#include "ckpt/layout.h"
#include "lora/lora_gpu.h"
#include "pipeline/models.h"
#include "pipeline/parallel_rank.h"
#include "runtime/dist/comm.h"
#include "runtime/load_gpu.h"

namespace wan {

using pipeline_detail::StreamOwner;

std::unique_ptr<cuda::DiTGpu> make_rank_dit(const dist::RankContext& ctx, const GeneratePlan& p,
                                            const cuda::DiTGpu::Options::Parallel& par, bool verbose,
                                            ParallelRankStats* st, std::shared_ptr<const cuda::MemoryPlan> planned) {
  WAN_ASSERT(st != nullptr, "make_rank_dit without stats");
  const Clock::time_point t0 = Clock::now();
  st->rank = ctx.rank;
  st->device = ctx.device;
  const DiTConfig& cfg = p.ckpt.dit;
  const std::vector<Role> roles = pipeline_detail::expert_roles(p);
  WAN_ASSERT(!roles.empty(), "no expert is used");
  std::vector<cuda::DiTWeightSource> sources;
  for (Role role : roles) {
    if (p.random_weights) {
      const bool high = role != Role::DiTLow;
      sources.push_back(cuda::DiTWeightSource::random_weights(random_expert_seed(p.weights_seed, p.task, high)));
      sources.back().merge = cuda::lora_merge_hooks(high ? p.lora_high : p.lora_low);
    } else {
      cuda::DiTWeightSource src;
      src.external = true;  // filled below: this rank's share from the files, the others' by broadcast
      sources.push_back(src);
    }
  }
  cuda::DiTGpu::Options opt;
  opt.device = ctx.device;
  opt.verbose = verbose;
  opt.attention = cuda::DiTGpu::parse_attention(p.attention);
  opt.gemm = cuda::DiTGpu::parse_gemm(p.gemm);
  opt.parallel = par;
  opt.planned = std::move(planned);
  const Shape& ls = p.latent_shape;
  cuda::DiTShape max_shape{2, ls[1], ls[2], ls[3]};
  max_shape.first_frame_t = pipeline_detail::denoiser_spec(p).first_frame_t;
  auto dit = std::make_unique<cuda::DiTGpu>(cuda::DiTGpu::create(cfg, sources, max_shape, opt));
  ctx.check_abort();

  if (p.random_weights) {
    dist::maybe_fail(ctx, "load");
    ctx.barrier();  // as the loading path: every rank's DiT ready, rank 0's text too
    st->dit_s = seconds_since(t0);
    return dit;
  }

  // This rank's share: the tensors of byte range `rank` of each expert's allocation.
  size_t total = 0;
  const std::vector<std::pair<size_t, size_t>> tensors = cuda::DiTGpu::weight_ranges(cfg, &total, opt.gemm);
  const std::vector<std::pair<size_t, size_t>> ranges = shard_ranges(tensors, total, ctx.world);
  const auto [begin, end] = ranges[static_cast<size_t>(ctx.rank)];
  std::vector<std::unique_ptr<WeightStore>> stores;  // open while the loader may call their getters
  std::vector<char*> bases;
  const Clock::time_point t1 = Clock::now();
  {
    cuda::DeviceLoader loader(cuda::LoadOptions::tuned(ctx.device));
    for (size_t i = 0; i < roles.size(); ++i) {
      stores.push_back(open_weights(p.ckpt, roles[i]));
      WeightStore* ws = stores.back().get();
      size_t bytes = 0;
      char* base = static_cast<char*>(dit->weight_allocation(static_cast<int>(i), &bytes));
      WAN_ASSERT(bytes == total, "DiT weight allocation of ", bytes, " bytes, layout of ", total);
      bases.push_back(base);
      st->load_tensors += dit->add_weight_loads(
          static_cast<int>(i), begin, end, [ws](const std::string& name) { return ws->get_f32(name); },
          [ws](const std::string& name) { return ws->raw_span(name); }, loader, static_cast<int>(i),
          cuda::lora_merge_hooks(roles[i] == Role::DiTLow ? p.lora_low : p.lora_high));
    }
    if (loader.size() > 0) {
      loader.start();
      // finish() on a helper thread, so this rank keeps watching the launch: a failure elsewhere cancels
      // the load at once instead of after the whole share.
      std::future<cuda::LoadStats> done = std::async(std::launch::async, [&loader] { return loader.finish(); });
      try {
        while (done.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
          if (ctx.aborted()) loader.cancel();
          else ctx.check_abort();
        }
      } catch (...) {
        loader.cancel();
        throw;  // `done` waits for the cancelled load before the loader goes
      }
      ctx.check_abort();  // a failure elsewhere: its message, not the load's "cancelled"
      const cuda::LoadStats ls = done.get();
      st->load_bytes = ls.bytes + ls.fallback_bytes;
    }
  }
  st->load_s = seconds_since(t1);
  dist::maybe_fail(ctx, "load");
  ctx.barrier();  // every share is on its device (and rank 0's text is encoded)

  // Every share from its owner to every rank, in place.
  const Clock::time_point t2 = Clock::now();
  {
    dist::Comm world(ctx.comm, false);
    StreamOwner stream;
    for (char* base : bases)
      for (int r = 0; r < ctx.world; ++r) {
        const auto [b, e] = ranges[static_cast<size_t>(r)];
        if (e > b) world.broadcast(base + b, e - b, r, stream.s);
      }
    ctx.sync(stream.s);
  }
  st->broadcast_s = seconds_since(t2);
  st->dit_s = seconds_since(t0);
  return dit;
}

}  // namespace wan
#endif  // WAN_HAVE_NCCL
