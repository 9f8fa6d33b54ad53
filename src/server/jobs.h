// The job layer of `wan serve`, apart from HTTP: explicit states (queued -> in_progress -> completed |
// failed), a bounded queue, one worker thread per runner (a model instance: one GPU, or the GPU set of a
// parallel layout) taking jobs in order, cancellation between steps (RunHooks::cancel), a per-job
// time limit, progress 0-100 from the step events, results and job records written atomically under
// the output folder, and a restart that lists finished jobs and marks interrupted ones failed.
// Invariants: every accepted job ends completed (its video exists) or failed with a reason, or is
// deleted by the client; a record on disk always matches the last state change; nothing a request
// sends becomes a path (ids are generated here, files are named after them).
// The worker runs each job through a JobRunner: the seam where resident models plug in.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "pipeline/model_cache.h"
#include "pipeline/pipeline.h"

namespace wan::server {

enum class JobState { Queued, InProgress, Completed, Failed };
const char* state_name(JobState s);  // "queued", "in_progress", "completed", "failed"

// A job as the API shows it and as its record file (<dir>/jobs/<id>.json) keeps it.
struct JobInfo {
  std::string id, model, prompt, size, seconds;
  JobState state = JobState::Queued;
  int progress = 0;                        // 0-100
  int64_t created_at = 0;                  // Unix seconds
  int64_t completed_at = 0, expires_at = 0;  // 0: not yet (null in the API)
  std::string error_code, error_message;   // failed: why
  std::string video_file;                  // file name under the output folder (completed)
  std::string input_file;                  // an uploaded image under the output folder, removed at the end
  uint64_t seq = 0;                        // creation order (lists, "after")
  double run_seconds = 0;                  // in_progress -> finished
  // Where the time went, from the request's arrival (its check and plan included): -> a worker took it,
  // -> the first denoising step began; the pipeline's stages (text, loads, warm-up, denoise, decode:
  // the work itself) and the video written after the decode. The server's overhead is the rest of a
  // client's round trip. -1: not reached. `worker`: the runner that ran it (-1: none yet).
  double queue_seconds = -1, first_step_seconds = -1, stage_seconds = -1, write_seconds = -1;
  int worker = -1;
};
nlohmann::json job_record(const JobInfo& j);
JobInfo job_from_record(const nlohmann::json& r);  // throws on a malformed record

// A runner's own Prometheus counter (summed over the runners by JobQueue::runner_metrics).
struct RunnerCounter {
  std::string name, help;
  double value = 0;
};

// Runs one job. `plan` is the plan the request was checked with (null: plan `o` here); it may name
// another device than the runner's, which then plans again. Throws Cancelled when hooks.cancel became
// true, anything else on failure; the video must be complete at `video_path` when it returns.
// counters() is called from other threads.
class JobRunner {
 public:
  virtual ~JobRunner() = default;
  virtual void run(const GenerateOptions& o, const GeneratePlan* plan, const std::string& video_path,
                   const RunHooks& hooks) = 0;
  // Loads the models a job of `o` would use, before the queue starts; returns the seconds it took.
  // Runners without resident models load nothing.
  virtual double preload(const GenerateOptions& o) {
    (void)o;
    return 0;
  }
  virtual std::vector<RunnerCounter> counters() const { return {}; }
};

// run_generate on the job's plan (plan_generate when it has none) with the server's resident models
// (pipeline/model_cache.h: a job reuses the text encoder, the DiT with its CUDA graphs and the VAE's
// weights of an earlier job built the same way), the video written atomically (formats/video.h).
// `device` (e.g. "cuda:1"; empty: the options' own) is where this runner's jobs run: one runner per GPU
// serves replicas of the model.
class ResidentRunner : public JobRunner {
 public:
  explicit ResidentRunner(std::string device = {});
  ~ResidentRunner() override;
  void run(const GenerateOptions& o, const GeneratePlan* plan, const std::string& video_path,
           const RunHooks& hooks) override;
  // The text encoder, DiT and VAE weights (pipeline/model_cache.h preload_models).
  double preload(const GenerateOptions& o) override;
  // wan_models_built_total, wan_models_reused_total, wan_models_evicted_total.
  std::vector<RunnerCounter> counters() const override;
  ModelCacheStats stats() const;  // as of the last finished job

 private:
  GenerateOptions on_device(const GenerateOptions& o) const;
  std::string device_;
  std::unique_ptr<ModelCache> cache_;  // the worker's only
  mutable std::mutex mu_;
  ModelCacheStats stats_;              // a copy for other threads, under mu_
};

struct QueueConfig {
  std::string dir;              // output folder (created); records under dir/jobs
  size_t max_queue = 16;        // queued jobs at most (the running one not counted)
  double retention_s = 86400;   // finished jobs are removed this long after they finish
  double job_timeout_s = 0;     // > 0: a running job is cancelled and failed after this long
  std::string video_ext = ".mp4";
};

struct QueueStats {
  std::map<JobState, int> by_state;
  size_t queue_depth = 0;
  double job_seconds_sum = 0;   // finished runs since start
  uint64_t job_seconds_count = 0;
  double step_seconds_sum = 0;  // denoising steps since start
  uint64_t step_seconds_count = 0;
  double first_step_seconds_sum = 0;  // accepted -> first denoising step, since start
  uint64_t first_step_seconds_count = 0;
  uint64_t accepted = 0, rejected_full = 0;
};

class JobQueue {
 public:
  // Loads the records in cfg.dir/jobs (interrupted jobs become failed) and starts one worker per runner
  // (at least one; the runners outlive the queue).
  JobQueue(QueueConfig cfg, std::vector<JobRunner*> runners);
  JobQueue(QueueConfig cfg, JobRunner& runner) : JobQueue(std::move(cfg), std::vector<JobRunner*>{&runner}) {}
  ~JobQueue();  // shutdown(0) if not done
  // The runners' counters, each summed over the runners, in Prometheus text.
  std::string runner_metrics() const;
  size_t workers() const { return runners_.size(); }
  JobQueue(const JobQueue&) = delete;
  JobQueue& operator=(const JobQueue&) = delete;

  enum class Submit { Accepted, Full, Closed };
  // info's id, state, seq and created_at are set here; on Accepted `info` holds the queued job. `plan`:
  // the request's checked plan, passed to the runner (null: the runner plans). `received`: when the
  // request arrived (the job's timings start there; default: now).
  Submit submit(JobInfo& info, GenerateOptions o, std::shared_ptr<const GeneratePlan> plan = nullptr,
                std::chrono::steady_clock::time_point received = {});
  std::optional<JobInfo> get(const std::string& id) const;
  std::vector<JobInfo> list() const;  // creation order
  // Cancels a queued or running job and deletes its record and files; false when unknown.
  bool remove(const std::string& id);
  // Waits up to timeout_s for the job's state or progress to differ from `seen` (or for it to go).
  // nullopt: the job is gone (deleted or expired); else the job now, which may still equal `seen`.
  std::optional<JobInfo> wait_change(const std::string& id, const JobInfo& seen, double timeout_s) const;
  std::string path_of(const std::string& file) const { return cfg_.dir + "/" + file; }
  QueueStats stats() const;
  // Removes finished jobs whose expires_at <= now (also done by the timer every second).
  void sweep_expired(int64_t now);
  // Stops accepting, fails the queued jobs, lets the running ones finish within drain_s (then cancels
  // them) and joins the threads. Returns true when every running job finished on its own.
  bool shutdown(double drain_s);
  bool closed() const;
  const std::vector<std::string>& load_notes() const { return notes_; }  // records skipped at start

 private:
  struct Entry;
  void load_records();
  void worker(size_t index);
  void timer();
  void run_one(const std::shared_ptr<Entry>& e, size_t worker);
  void persist(const JobInfo& j);  // under mu_
  void erase_files(const JobInfo& j);
  void finish(Entry& e, JobState s, const std::string& code, const std::string& message);

  QueueConfig cfg_;
  std::vector<JobRunner*> runners_;
  mutable std::mutex mu_;
  std::condition_variable cv_;       // queue / running / closing changes
  mutable std::condition_variable changed_;  // any job's state or progress, or its removal (wait_change)
  std::map<std::string, std::shared_ptr<Entry>> jobs_;
  std::deque<std::shared_ptr<Entry>> queue_;
  std::vector<std::shared_ptr<Entry>> running_;  // one per busy worker
  bool closing_ = false, stopped_ = false;
  uint64_t next_seq_ = 1;
  QueueStats counters_;
  std::vector<std::string> notes_;
  std::vector<std::thread> workers_;
  std::thread timer_;
};

// "video_" and 32 random hex digits.
std::string new_job_id();
// Whether `id` could be one of ours (letters, digits, '_'; bounded): anything else is 404 at once.
bool plausible_job_id(const std::string& id);
int64_t unix_now();

}  // namespace wan::server
