// How `wan serve` spreads over several GPUs: model instances, each with its own worker on the one job
// queue (jobs.h). Without a layout flag every GPU holds a replica of the model (ResidentRunner on that
// device, models resident between jobs): the most videos per GPU-second, since replicas exchange
// nothing. With --cfg-parallel / --ulysses U / --ring R each instance is that layout's GPUs
// (cfg·U·R of them, consecutive in the device list), and a job runs on it as `wan generate` with the
// same flags does (ParallelRunner: a ParallelSession, whose ranks keep their DiT between jobs): lower
// latency per video for the same GPUs.
// Invariants: the instances partition the listed devices; every check happens before any device work.
#pragma once
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/generate_parallel.h"
#include "runtime/dist/parallel_layout.h"
#include "server/jobs.h"

namespace wan::server {

struct Instances {
  std::vector<std::vector<int>> groups;  // the devices of each instance, in the listed order
  dist::Layout layout;                   // each instance's (world 1: replicas)
  bool active() const { return !groups.empty(); }  // false: neither --gpus nor --devices (one --device)
  std::string describe() const;  // "2 replicas on cuda:0, cuda:1" / "2 instances of cfg 2 x ulysses 1 x ring 1: 0,1 | 2,3"
};

// serve's --gpus / --devices, layout flags and --device as given (generate's ParallelArgs). Throws one
// wan::Error (BadInput) for: --gpus with --devices, either with --device cpu or cuda:i, a layout flag
// without them, a degree that is not a positive integer, and devices the instance size does not divide.
Instances plan_instances(const ParallelArgs& a);

// Runs each job on its instance's GPUs with the layout (pipeline/generate_parallel.h), in this process
// (one thread per GPU), on a ParallelSession made at the first job: the ranks keep their DiT between
// jobs, and a failed job's next one starts the ranks again. The request's checked plan is not used
// (the job is planned for the layout here; each rank checks its share).
class ParallelRunner : public JobRunner {
 public:
  ParallelRunner(std::vector<int> devices, dist::Layout layout);
  ~ParallelRunner() override;
  void run(const GenerateOptions& o, const GeneratePlan* plan, const std::string& video_path,
           const RunHooks& hooks) override;
  // Every rank's DiT for jobs of `o`, and rank 0's text encoder (when it fits) and VAE weights
  // (ParallelSession::preload).
  double preload(const GenerateOptions& o) override;
  // wan_models_built_total, wan_models_reused_total (summed with the replicas' counters).
  std::vector<RunnerCounter> counters() const override;
  ParallelSessionStats stats() const;

 private:
  ParallelSession& planned(const GenerateOptions& o, ParallelRun* run);  // o's plan here, and the session
  std::vector<int> devices_;
  dist::Layout layout_;
  mutable std::mutex mu_;                     // session_'s creation against stats()
  std::unique_ptr<ParallelSession> session_;  // the worker's
};

}  // namespace wan::server
