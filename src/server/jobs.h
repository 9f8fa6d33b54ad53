// The job layer of `wan serve`, apart from HTTP: explicit states (queued -> in_progress -> completed |
// failed), a bounded queue, one worker thread, cancellation between steps (RunHooks::cancel), a per-job
// time limit, progress 0-100 from the step events, results and job records written atomically under
// the output folder, and a restart that lists finished jobs and marks interrupted ones failed.
// Invariants: every accepted job ends completed (its video exists) or failed with a reason, or is
// deleted by the client; a record on disk always matches the last state change; nothing a request
// sends becomes a path (ids are generated here, files are named after them).
// The worker runs each job through a JobRunner: the seam where resident models plug in.
#pragma once
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
};
nlohmann::json job_record(const JobInfo& j);
JobInfo job_from_record(const nlohmann::json& r);  // throws on a malformed record

// Runs one job. `plan` is the plan the request was checked with (null: plan `o` here). Throws Cancelled
// when hooks.cancel became true, anything else on failure; the video must be complete at `video_path`
// when it returns. metrics(): Prometheus lines of the runner's own (called from other threads).
class JobRunner {
 public:
  virtual ~JobRunner() = default;
  virtual void run(const GenerateOptions& o, const GeneratePlan* plan, const std::string& video_path,
                   const RunHooks& hooks) = 0;
  virtual std::string metrics() const { return {}; }
};

// run_generate on the job's plan (plan_generate when it has none) with the server's resident models
// (pipeline/model_cache.h: a job reuses the text encoder, the DiT with its CUDA graphs and the VAE's
// weights of an earlier job built the same way), the video written atomically (formats/video.h).
class ResidentRunner : public JobRunner {
 public:
  ResidentRunner();
  ~ResidentRunner() override;
  void run(const GenerateOptions& o, const GeneratePlan* plan, const std::string& video_path,
           const RunHooks& hooks) override;
  // Loads the models a job of `o` would use (pipeline/model_cache.h preload_models), before the queue
  // starts; returns the seconds it took.
  double preload(const GenerateOptions& o);
  // wan_models_built_total, wan_models_reused_total, wan_models_evicted_total.
  std::string metrics() const override;
  ModelCacheStats stats() const;  // as of the last finished job

 private:
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
  uint64_t accepted = 0, rejected_full = 0;
};

class JobQueue {
 public:
  // Loads the records in cfg.dir/jobs (interrupted jobs become failed) and starts the worker.
  JobQueue(QueueConfig cfg, JobRunner& runner);
  ~JobQueue();  // shutdown(0) if not done
  std::string runner_metrics() const { return runner_.metrics(); }
  JobQueue(const JobQueue&) = delete;
  JobQueue& operator=(const JobQueue&) = delete;

  enum class Submit { Accepted, Full, Closed };
  // info's id, state, seq and created_at are set here; on Accepted `info` holds the queued job. `plan`:
  // the request's checked plan, passed to the runner (null: the runner plans).
  Submit submit(JobInfo& info, GenerateOptions o, std::shared_ptr<const GeneratePlan> plan = nullptr);
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
  // Stops accepting, fails the queued jobs, lets the running one finish within drain_s (then cancels
  // it) and joins the threads. Returns true when the running job (if any) finished on its own.
  bool shutdown(double drain_s);
  bool closed() const;
  const std::vector<std::string>& load_notes() const { return notes_; }  // records skipped at start

 private:
  struct Entry;
  void load_records();
  void worker();
  void timer();
  void run_one(const std::shared_ptr<Entry>& e);
  void persist(const JobInfo& j);  // under mu_
  void erase_files(const JobInfo& j);
  void finish(Entry& e, JobState s, const std::string& code, const std::string& message);

  QueueConfig cfg_;
  JobRunner& runner_;
  mutable std::mutex mu_;
  std::condition_variable cv_;       // queue / running / closing changes
  mutable std::condition_variable changed_;  // any job's state or progress, or its removal (wait_change)
  std::map<std::string, std::shared_ptr<Entry>> jobs_;
  std::deque<std::shared_ptr<Entry>> queue_;
  std::shared_ptr<Entry> running_;
  bool closing_ = false, stopped_ = false;
  uint64_t next_seq_ = 1;
  QueueStats counters_;
  std::vector<std::string> notes_;
  std::thread worker_, timer_;
};

// "video_" and 32 random hex digits.
std::string new_job_id();
// Whether `id` could be one of ours (letters, digits, '_'; bounded): anything else is 404 at once.
bool plausible_job_id(const std::string& id);
int64_t unix_now();

}  // namespace wan::server
