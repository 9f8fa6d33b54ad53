// Multi-GPU `wan generate`, host part (see generate_parallel.h; every build): the request's option
// checks, the layout's resolution, shard arithmetic and the run's descriptions.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "pipeline/denoiser.h"
#include "pipeline/generate_parallel.h"
#include "pipeline/pipeline.h"

#ifdef WAN_HAVE_CUDA
#include "kernels/rng.h"  // device_count
#endif

namespace wan {

namespace {


int parse_degree(const std::optional<std::string>& v, const char* opt) {
  if (!v) return 0;
  const std::string& s = *v;
  WAN_CHECK(!s.empty() && s.size() <= 4 && s.find_first_not_of("0123456789") == std::string::npos, opt, ": '", s,
            "' is not a positive integer");
  const int d = std::stoi(s);
  WAN_CHECK(d >= 1, opt, ": '", s, "' is not a positive integer");
  return d;
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += cat(s.empty() ? "" : ",", x);
  return s;
}

std::string human_gb(double bytes) {
  char buf[32];
  snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  return buf;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Options

std::string ParallelRequest::where() const {
  if (launcher) return cat("one process per rank, ", launcher_name, " launcher environment");
  return cat("in-process, devices ", join(launch.devices));
}

ParallelRequest parse_parallel_request(const ParallelArgs& a, GenerateOptions* o, const dist::EnvLookup& env_in,
                                       int visible_gpus) {
  WAN_ASSERT(o != nullptr, "parse_parallel_request without options");
  ParallelRequest r;
  r.cfg = a.cfg;
  r.ulysses = parse_degree(a.ulysses, "--ulysses");
  r.ring = parse_degree(a.ring, "--ring");
  r.launch = dist::parse_launch_options(a.gpus, a.devices);
  const bool listed = !a.gpus.empty() || !a.devices.empty();
  const dist::EnvLookup env = env_in ? env_in : dist::EnvLookup([](const char* n) { return std::getenv(n); });
  const std::optional<dist::LauncherEnv> le = dist::parse_launcher_env(env);
  if (le && le->world > 1) {
    r.launcher = true;
    r.launcher_name = le->source;
    r.rank = le->rank;
    r.world = le->world;
  } else {
    r.world = listed ? static_cast<int>(r.launch.devices.size()) : 1;
  }
  const std::string listed_as = !a.gpus.empty() ? cat("--gpus ", a.gpus) : cat("--devices ", a.devices);
  // dist::launch follows a launcher's environment even for one rank: it would not start threads.
  WAN_CHECK(!(le && le->world == 1 && r.world > 1), listed_as, ": this process was started as the only rank of a ",
            le ? le->source : "", " launch (world size 1); drop the launcher's variables to use several GPUs in one "
            "process, or start one process per GPU");
  const std::string dev = a.device.value_or("");
  if (!dev.empty()) (void)parse_device(dev);  // a malformed --device is its own error
  const bool layout_given = r.cfg || a.ulysses || a.ring;

  // Where the run goes.
  if (dev == "cpu" && (r.world > 1 || listed || layout_given)) {
    const std::string why = r.launcher ? cat("started as rank ", r.rank, " of ", r.world, " by ", r.launcher_name)
                            : listed   ? listed_as
                                       : std::string("--cfg-parallel / --ulysses / --ring");
    WAN_THROW("--device cpu cannot run on several GPUs (", why, "); drop --device cpu or use --device cuda");
  }
  if (dev.rfind("cuda:", 0) == 0) {
    WAN_CHECK(!listed, "--device ", dev, " and ", listed_as, " both choose the GPUs: give --devices alone (e.g. --devices ",
              dev.substr(5), ",...)");
    WAN_CHECK(!r.launcher, "--device ", dev, ": with one process per GPU (", r.launcher_name,
              " launcher) each rank's GPU follows its local rank; map local ranks to GPUs with --devices");
  }
  if (r.world <= 1) {
    WAN_CHECK(!(r.cfg || r.ulysses > 1 || r.ring > 1), "--cfg-parallel / --ulysses / --ring split a run over several ",
              "GPUs, but ", listed ? cat(listed_as, " gives one") : std::string("none were given"),
              ": add --gpus N or --devices 0,1,... (or start one process per GPU with mpirun, srun or WAN_RANK)");
    if (listed) {  // --gpus 1 / --devices d: the single-GPU run on that device
      r.device = r.launch.devices[0];
      o->device = cat("cuda:", r.device);
    }
    return r;
  }

  // Several GPUs: what the layout's products allow (the heads and CFG are checked with the plan).
  const int c = r.cfg ? 2 : 1;
  WAN_CHECK(!r.cfg || r.world % 2 == 0, "--cfg-parallel needs an even number of GPUs, got ", r.world);
  const int rem = r.world / c;
  const char* per = r.cfg ? " GPUs per CFG half" : " GPUs";
  if (r.ulysses > 0 && r.ring > 0) {
    WAN_CHECK(c * r.ulysses * r.ring == r.world, "parallel layout ", dist::describe(dist::Layout{c, r.ulysses, r.ring}),
              " needs ", c * r.ulysses * r.ring, " GPUs, but ", r.world, " are used");
  } else if (r.ulysses > 0) {
    WAN_CHECK(rem % r.ulysses == 0, "--ulysses ", r.ulysses, " does not divide the ", rem, per);
  } else if (r.ring > 0) {
    WAN_CHECK(rem % r.ring == 0, "--ring ", r.ring, " does not divide the ", rem, per);
  }
  WAN_CHECK(!o->keep_text_encoder, "--keep-text-encoder: not with several GPUs (the text encoder runs once on rank 0 ",
            "and is freed before its DiT loads)");

  // This process's first GPU, as dist::launch decides it.
  if (!r.launcher) {
    r.device = r.launch.devices[0];
  } else if (!r.launch.devices.empty()) {
    WAN_CHECK(le->local_rank < static_cast<int>(r.launch.devices.size()), "local rank ", le->local_rank,
              " has no device in ", listed_as, " (", r.launch.devices.size(), " given)");
    r.device = r.launch.devices[static_cast<size_t>(le->local_rank)];
  } else {
    int visible = visible_gpus;
#ifdef WAN_HAVE_CUDA
    if (visible < 0) visible = cuda::device_count();
#endif
    r.device = visible == 1 ? 0 : le->local_rank;
  }
  o->device = cat("cuda:", r.device);
  o->parallel = true;
  return r;
}

dist::Layout resolve_parallel_layout(const ParallelRequest& r, const GeneratePlan& p) {
  bool every_step_guided = true;
  for (const ExpertStep& s : p.experts.steps) every_step_guided = every_step_guided && s.guide != 1.0f;
  WAN_CHECK(!r.cfg || every_step_guided, "--cfg-parallel needs classifier-free guidance on every step (guide scales ",
            p.guide_low, ",", p.guide_high, "; a scale of 1 runs the conditional half alone)");
  return dist::resolve_layout(r.world, p.ckpt.dit.num_heads, r.cfg, r.ulysses, r.ring, every_step_guided);
}

std::vector<std::pair<size_t, size_t>> shard_ranges(const std::vector<std::pair<size_t, size_t>>& tensors, size_t total,
                                                    int world) {
  WAN_ASSERT(world >= 1, "shard_ranges: world ", world);
  std::vector<size_t> cut(static_cast<size_t>(world) + 1, total);
  cut[0] = 0;
  int next = 1;  // the next cut to place
  size_t prev_end = 0;
  for (const auto& [off, bytes] : tensors) {
    WAN_ASSERT(off >= prev_end && off + bytes <= total, "shard_ranges: tensor at ", off, " (", bytes,
               " bytes) overlaps the previous one or passes the end ", total);
    prev_end = off + bytes;
    const long double mid = static_cast<long double>(off) + static_cast<long double>(bytes) / 2;
    const int owner = std::min(world - 1, static_cast<int>(mid * world / static_cast<long double>(total)));
    while (next <= owner) cut[static_cast<size_t>(next++)] = off;
  }
  std::vector<std::pair<size_t, size_t>> ranges;
  for (int r = 0; r < world; ++r) ranges.emplace_back(cut[static_cast<size_t>(r)], cut[static_cast<size_t>(r) + 1]);
  return ranges;
}

// ---------------------------------------------------------------------------------------------------
// Descriptions

std::string describe_parallel(const ParallelRequest& r, const dist::Layout& l, bool random_weights) {
  return cat("gpus     ", r.world, " (", r.where(), "): ", dist::describe(l),
             "; text encoding and VAE decode on rank 0; ",
             random_weights ? "random weights drawn on every rank"
                            : cat("each rank streams 1/", r.world, " of the DiT weights, then every share is broadcast"),
             "\n");
}

std::string ParallelRun::describe() const {
  std::string s;
  for (const ParallelRankStats& k : ranks) {
    s += cat("rank ", k.rank, " (cuda:", k.device, "): ");
    if (k.load_tensors > 0 || k.load_bytes > 0) {
      char buf[160];
      snprintf(buf, sizeof buf, "streamed %s (%d tensors) in %.2f s, broadcasts %.2f s, DiT ready after %.2f s",
               human_gb(static_cast<double>(k.load_bytes)).c_str(), k.load_tensors, k.load_s, k.broadcast_s, k.dit_s);
      s += buf;
    } else {
      char buf[96];
      snprintf(buf, sizeof buf, "DiT ready after %.2f s (%s)", k.dit_s,
               plan.random_weights ? "random weights drawn" : "no share of the weights");
      s += buf;
    }
    char buf[64];
    snprintf(buf, sizeof buf, "; peak device memory %.2f GiB\n",
             static_cast<double>(k.peak_device_bytes) / (1024.0 * 1024.0 * 1024.0));
    s += buf;
  }
  return s;
}

}  // namespace wan
