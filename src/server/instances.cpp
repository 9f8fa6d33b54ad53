// serve's model instances over several GPUs (see instances.h).
#include "server/instances.h"

#include <chrono>

#include "formats/video.h"
#include "runtime/dist/launch.h"

namespace wan::server {

namespace {
int degree(const std::optional<std::string>& v, const char* opt) {
  if (!v) return 1;
  const std::string& s = *v;
  WAN_CHECK(!s.empty() && s.size() <= 4 && s.find_first_not_of("0123456789") == std::string::npos && std::stoi(s) >= 1,
            opt, ": '", s, "' is not a positive integer");
  return std::stoi(s);
}

std::string device_list(const std::vector<int>& g) {
  std::string s;
  for (int d : g) s += cat(s.empty() ? "" : ",", d);
  return s;
}
}  // namespace

std::string Instances::describe() const {
  if (!layout.active()) {
    std::string s = cat(groups.size(), groups.size() == 1 ? " replica on " : " replicas on ");
    for (size_t i = 0; i < groups.size(); ++i) s += cat(i ? ", " : "", "cuda:", groups[i][0]);
    return s;
  }
  std::string s = cat(groups.size(), groups.size() == 1 ? " instance of " : " instances of ", dist::describe(layout),
                      ": devices ");
  for (size_t i = 0; i < groups.size(); ++i) s += cat(i ? " | " : "", device_list(groups[i]));
  return s;
}

Instances plan_instances(const ParallelArgs& a) {
  Instances in;
  const bool listed = !a.gpus.empty() || !a.devices.empty();
  const bool layout_given = a.cfg || a.ulysses || a.ring;
  in.layout = dist::Layout{a.cfg ? 2 : 1, degree(a.ulysses, "--ulysses"), degree(a.ring, "--ring")};
  if (!listed) {
    WAN_CHECK(!layout_given, "--cfg-parallel / --ulysses / --ring split each job over several GPUs: add --gpus N or "
              "--devices 0,1,...");
    return in;
  }
  const dist::LaunchOptions lo = dist::parse_launch_options(a.gpus, a.devices);
  const std::string dev = a.device.value_or("");
  WAN_CHECK(dev.empty() || dev == "cuda", "--device ", dev, " and ", !a.gpus.empty() ? "--gpus" : "--devices",
            " both choose where the models run: give one of them");
  const int n = static_cast<int>(lo.devices.size());
  const int size = in.layout.world();
  WAN_CHECK(n % size == 0, "each instance of ", dist::describe(in.layout), " takes ", size, " GPUs, which does not "
            "divide the ", n, " GPUs given");
  for (int i = 0; i < n; i += size)
    in.groups.emplace_back(lo.devices.begin() + i, lo.devices.begin() + i + size);
  return in;
}

ParallelRunner::ParallelRunner(std::vector<int> devices, dist::Layout layout)
    : devices_(std::move(devices)), layout_(layout) {}

ParallelRunner::~ParallelRunner() = default;

ParallelSession& ParallelRunner::planned(const GenerateOptions& o, ParallelRun* run) {
  GenerateOptions g = o;
  g.plan_as_owner = false;
  ParallelArgs a;
  a.devices = device_list(devices_);
  a.cfg = layout_.cfg > 1;
  a.ulysses = std::to_string(layout_.ulysses);
  a.ring = std::to_string(layout_.ring);
  // The ranks are this process's threads: no launcher's environment applies.
  const ParallelRequest r = parse_parallel_request(a, &g, [](const char*) -> const char* { return nullptr; });
  *run = plan_parallel(g, r, true);
  std::lock_guard<std::mutex> lock(mu_);
  if (!session_) session_ = std::make_unique<ParallelSession>(r);
  return *session_;
}

double ParallelRunner::preload(const GenerateOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  ParallelRun plan;
  planned(o, &plan).preload(plan.plan, plan.layout);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ParallelRunner::run(const GenerateOptions& o, const GeneratePlan*, const std::string& video_path,
                         const RunHooks& hooks) {
  ParallelRun plan;
  ParallelSession& session = planned(o, &plan);
  const GenerateResult result = session.run(plan.plan, plan.layout, hooks, true);
  const Tensor& v = result.video;
  WAN_ASSERT(v.defined(), "the parallel run returned no video");
  write_video(video_path, v.f32(), static_cast<int>(v.dim(1)), static_cast<int>(v.dim(2)), static_cast<int>(v.dim(3)),
              plan.plan.fps);
}

ParallelSessionStats ParallelRunner::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return session_ ? session_->stats() : ParallelSessionStats{};
}

std::vector<RunnerCounter> ParallelRunner::counters() const {
  const ParallelSessionStats s = stats();
  return {{"wan_models_built_total", "Models (text encoder, DiT, VAE weights) built by jobs.", double(s.built)},
          {"wan_models_reused_total", "Models a job took from the resident ones.", double(s.reused)}};
}

}  // namespace wan::server
