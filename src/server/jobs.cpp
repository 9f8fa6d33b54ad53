// The job queue (see jobs.h). One mutex guards every job; the runners are called without it. The timer
// thread enforces the per-job time limit and the retention; each worker thread takes the oldest queued
// job when its runner is free.
#include "server/jobs.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "formats/output_file.h"
#include "formats/video.h"

namespace wan::server {

namespace fs = std::filesystem;

struct JobQueue::Entry {
  JobInfo info;
  GenerateOptions opts;
  std::shared_ptr<const GeneratePlan> plan;  // the checked plan, until the run takes it
  std::atomic<bool> cancel{false};
  std::string cancel_code;  // why cancel was set: "deleted", "timeout", "server_shutdown"
  std::chrono::steady_clock::time_point accepted, started;
};

const char* state_name(JobState s) {
  switch (s) {
    case JobState::Queued: return "queued";
    case JobState::InProgress: return "in_progress";
    case JobState::Completed: return "completed";
    case JobState::Failed: return "failed";
  }
  return "?";
}

namespace {
JobState state_from_name(const std::string& s) {
  for (JobState st : {JobState::Queued, JobState::InProgress, JobState::Completed, JobState::Failed})
    if (s == state_name(st)) return st;
  throw Error(cat("unknown job state '", s, "'"));
}
}  // namespace

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string new_job_id() {
  static std::mutex mu;
  static std::random_device rd;
  std::lock_guard<std::mutex> lock(mu);
  static const char* hex = "0123456789abcdef";
  std::string id = "video_";
  for (int i = 0; i < 8; ++i) {
    const uint32_t r = rd();
    for (int k = 0; k < 4; ++k) id += hex[(r >> (4 * k)) & 15];
  }
  return id;
}

bool plausible_job_id(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

nlohmann::json job_record(const JobInfo& j) {
  return {{"id", j.id},           {"model", j.model},           {"prompt", j.prompt},
          {"size", j.size},       {"seconds", j.seconds},       {"status", state_name(j.state)},
          {"progress", j.progress}, {"created_at", j.created_at}, {"completed_at", j.completed_at},
          {"expires_at", j.expires_at}, {"error_code", j.error_code}, {"error_message", j.error_message},
          {"video_file", j.video_file}, {"input_file", j.input_file}, {"seq", j.seq},
          {"run_seconds", j.run_seconds}, {"queue_seconds", j.queue_seconds},
          {"first_step_seconds", j.first_step_seconds}, {"stage_seconds", j.stage_seconds},
          {"write_seconds", j.write_seconds}, {"worker", j.worker}};
}

JobInfo job_from_record(const nlohmann::json& r) {
  JobInfo j;
  j.id = r.at("id").get<std::string>();
  WAN_CHECK(plausible_job_id(j.id), "bad job id");
  j.model = r.at("model").get<std::string>();
  j.prompt = r.at("prompt").get<std::string>();
  j.size = r.at("size").get<std::string>();
  j.seconds = r.at("seconds").get<std::string>();
  j.state = state_from_name(r.at("status").get<std::string>());
  j.progress = r.at("progress").get<int>();
  j.created_at = r.at("created_at").get<int64_t>();
  j.completed_at = r.at("completed_at").get<int64_t>();
  j.expires_at = r.at("expires_at").get<int64_t>();
  j.error_code = r.at("error_code").get<std::string>();
  j.error_message = r.at("error_message").get<std::string>();
  j.video_file = r.at("video_file").get<std::string>();
  j.input_file = r.at("input_file").get<std::string>();
  // Record files are ours, but a file name must never leave the output folder.
  for (const std::string* f : {&j.video_file, &j.input_file})
    WAN_CHECK(f->find('/') == std::string::npos && *f != ".." && *f != ".", "bad file name in record");
  j.seq = r.at("seq").get<uint64_t>();
  j.run_seconds = r.at("run_seconds").get<double>();
  // Records written before these existed have none.
  j.queue_seconds = r.value("queue_seconds", -1.0);
  j.first_step_seconds = r.value("first_step_seconds", -1.0);
  j.stage_seconds = r.value("stage_seconds", -1.0);
  j.write_seconds = r.value("write_seconds", -1.0);
  j.worker = r.value("worker", -1);
  return j;
}

ResidentRunner::ResidentRunner(std::string device) : device_(std::move(device)), cache_(std::make_unique<ModelCache>()) {}
ResidentRunner::~ResidentRunner() = default;

ModelCacheStats ResidentRunner::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

std::vector<RunnerCounter> ResidentRunner::counters() const {
  const ModelCacheStats s = stats();
  return {{"wan_models_built_total", "Models (text encoder, DiT, VAE weights) built by jobs.", double(s.built)},
          {"wan_models_reused_total", "Models a job took from the resident ones.", double(s.reused)},
          {"wan_models_evicted_total", "Resident models freed for another job's memory or settings.",
           double(s.evicted)}};
}

GenerateOptions ResidentRunner::on_device(const GenerateOptions& o) const {
  GenerateOptions d = o;
  if (!device_.empty()) d.device = device_;
  return d;
}

double ResidentRunner::preload(const GenerateOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  preload_models(plan_generate(on_device(o)), *cache_);
  std::lock_guard<std::mutex> lk(mu_);
  stats_ = cache_->stats;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ResidentRunner::run(const GenerateOptions& o, const GeneratePlan* checked, const std::string& video_path,
                         const RunHooks& hooks) {
  std::optional<GeneratePlan> own;
  if (checked && !device_.empty() && checked->device != device_) checked = nullptr;  // checked for another GPU
  if (!checked) own = plan_generate(on_device(o));
  const GeneratePlan& plan = checked ? *checked : *own;
  struct Snapshot {  // the stats reach other threads whether the job succeeds or not
    ResidentRunner& r;
    ~Snapshot() {
      std::lock_guard<std::mutex> lk(r.mu_);
      r.stats_ = r.cache_->stats;
    }
  } snapshot{*this};
  const GenerateResult res = run_generate(plan, hooks, true, cache_.get());
  WAN_ASSERT(res.video.defined(), "the run returned no video");
  const Tensor& v = res.video;
  write_video(video_path, v.f32(), static_cast<int>(v.dim(1)), static_cast<int>(v.dim(2)),
              static_cast<int>(v.dim(3)), plan.fps);
}

JobQueue::JobQueue(QueueConfig cfg, std::vector<JobRunner*> runners) : cfg_(std::move(cfg)), runners_(std::move(runners)) {
  WAN_ASSERT(!runners_.empty(), "a job queue without a runner");
  std::error_code ec;
  fs::create_directories(cfg_.dir + "/jobs", ec);
  WAN_CHECK(!ec, "cannot create --output-dir '", cfg_.dir, "/jobs': ", ec.message());
  load_records();
  for (size_t i = 0; i < runners_.size(); ++i) workers_.emplace_back([this, i] { worker(i); });
  timer_ = std::thread([this] { timer(); });
}

std::string JobQueue::runner_metrics() const {
  std::vector<RunnerCounter> sum;
  for (const JobRunner* r : runners_)
    for (const RunnerCounter& c : r->counters()) {
      auto it = std::find_if(sum.begin(), sum.end(), [&](const RunnerCounter& s) { return s.name == c.name; });
      if (it == sum.end()) sum.push_back(c);
      else it->value += c.value;
    }
  std::string out;
  for (const RunnerCounter& c : sum)
    out += cat("# HELP ", c.name, " ", c.help, "\n# TYPE ", c.name, " counter\n", c.name, " ",
               c.value == std::floor(c.value) && std::fabs(c.value) < 1e15 ? cat(static_cast<int64_t>(c.value))
                                                                             : cat(c.value),
               "\n");
  return out;
}

JobQueue::~JobQueue() { shutdown(0); }

void JobQueue::persist(const JobInfo& j) {
  const std::string text = job_record(j).dump(1) + "\n";
  try {
    OutputFile f(cfg_.dir + "/jobs/" + j.id + ".json", "job record");
    f.write(text.data(), text.size());
    f.commit();
  } catch (const std::exception& e) {
    // The job's state in memory stays right; a restart would show its previous record.
    fprintf(stderr, "wan serve: %s\n", e.what());
  }
}

void JobQueue::erase_files(const JobInfo& j) {
  std::error_code ec;
  if (!j.video_file.empty()) fs::remove(path_of(j.video_file), ec);
  if (!j.input_file.empty()) fs::remove(path_of(j.input_file), ec);
  fs::remove(cfg_.dir + "/jobs/" + j.id + ".json", ec);
}

void JobQueue::load_records() {
  const int64_t now = unix_now();
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(cfg_.dir, ec)) {  // temporaries of writes a kill cut short
    const std::string n = de.path().filename().string();
    if (n.size() > 4 && n[0] == '.' && n.ends_with(".tmp")) fs::remove(de.path(), ec);
  }
  for (const auto& de : fs::directory_iterator(cfg_.dir + "/jobs", ec)) {
    if (de.path().extension() != ".json") continue;
    JobInfo j;
    try {
      std::ifstream in(de.path());
      j = job_from_record(nlohmann::json::parse(in));
    } catch (const std::exception& e) {
      notes_.push_back(cat("skipped job record ", de.path().string(), ": ", e.what()));
      continue;
    }
    if (j.state == JobState::Queued || j.state == JobState::InProgress) {
      j.state = JobState::Failed;
      j.error_code = "interrupted";
      j.error_message = "the server stopped before the job finished";
      j.expires_at = now + static_cast<int64_t>(cfg_.retention_s);
    } else if (j.state == JobState::Completed && !fs::exists(path_of(j.video_file))) {
      j.state = JobState::Failed;
      j.error_code = "output_missing";
      j.error_message = "the video file is gone from the output folder";
    }
    if (!j.input_file.empty()) {
      fs::remove(path_of(j.input_file), ec);
      j.input_file.clear();
    }
    persist(j);
    next_seq_ = std::max(next_seq_, j.seq + 1);
    auto e = std::make_shared<Entry>();
    e->info = j;
    jobs_[j.id] = e;
  }
  sweep_expired(now);
}

JobQueue::Submit JobQueue::submit(JobInfo& info, GenerateOptions o, std::shared_ptr<const GeneratePlan> plan,
                                  std::chrono::steady_clock::time_point received) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return Submit::Closed;
  if (queue_.size() >= cfg_.max_queue) {
    ++counters_.rejected_full;
    return Submit::Full;
  }
  if (info.id.empty()) info.id = new_job_id();
  info.state = JobState::Queued;
  info.progress = 0;
  info.seq = next_seq_++;
  info.created_at = unix_now();
  auto e = std::make_shared<Entry>();
  e->accepted = received == std::chrono::steady_clock::time_point{} ? std::chrono::steady_clock::now() : received;
  e->info = info;
  e->opts = std::move(o);
  e->plan = std::move(plan);
  persist(e->info);
  jobs_[info.id] = e;
  queue_.push_back(e);
  ++counters_.accepted;
  cv_.notify_all();
  changed_.notify_all();
  return Submit::Accepted;
}

std::optional<JobInfo> JobQueue::get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return std::nullopt;
  return it->second->info;
}

std::optional<JobInfo> JobQueue::wait_change(const std::string& id, const JobInfo& seen, double timeout_s) const {
  std::unique_lock<std::mutex> lock(mu_);
  std::optional<JobInfo> now;
  changed_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] {
    auto it = jobs_.find(id);
    now = it == jobs_.end() ? std::nullopt : std::optional<JobInfo>(it->second->info);
    return !now || now->state != seen.state || now->progress != seen.progress;
  });
  return now;
}

std::vector<JobInfo> JobQueue::list() const {
  std::vector<JobInfo> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, e] : jobs_) out.push_back(e->info);
  }
  std::sort(out.begin(), out.end(), [](const JobInfo& a, const JobInfo& b) { return a.seq < b.seq; });
  return out;
}

bool JobQueue::remove(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return false;
  std::shared_ptr<Entry> e = it->second;
  jobs_.erase(it);
  changed_.notify_all();
  if (std::find(running_.begin(), running_.end(), e) != running_.end()) {  // its worker deletes the files
    e->cancel_code = "deleted";
    e->cancel = true;
    return true;
  }
  for (auto q = queue_.begin(); q != queue_.end(); ++q)
    if (*q == e) {
      queue_.erase(q);
      break;
    }
  erase_files(e->info);
  return true;
}

QueueStats JobQueue::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  QueueStats s = counters_;
  for (JobState st : {JobState::Queued, JobState::InProgress, JobState::Completed, JobState::Failed})
    s.by_state[st] = 0;
  for (const auto& [id, e] : jobs_) ++s.by_state[e->info.state];
  s.queue_depth = queue_.size();
  return s;
}

void JobQueue::sweep_expired(int64_t now) {
  std::vector<JobInfo> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      const JobInfo& j = it->second->info;
      const bool finished = j.state == JobState::Completed || j.state == JobState::Failed;
      if (finished && j.expires_at > 0 && j.expires_at <= now) {
        gone.push_back(j);
        it = jobs_.erase(it);
      } else {
        ++it;
      }
    }
    if (!gone.empty()) changed_.notify_all();
  }
  for (const JobInfo& j : gone) erase_files(j);
}

bool JobQueue::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closing_;
}

// Under mu_: the job's final state, its record, and the counters.
void JobQueue::finish(Entry& e, JobState s, const std::string& code, const std::string& message) {
  JobInfo& j = e.info;
  j.state = s;
  j.error_code = code;
  j.error_message = message;
  const int64_t now = unix_now();
  if (s == JobState::Completed) {
    j.progress = 100;
    j.completed_at = now;
  }
  j.expires_at = now + static_cast<int64_t>(cfg_.retention_s);
  std::error_code ec;
  if (!j.input_file.empty()) fs::remove(path_of(j.input_file), ec);
  j.input_file.clear();
  persist(j);
  changed_.notify_all();
}

void JobQueue::run_one(const std::shared_ptr<Entry>& e, size_t worker) {
  RunHooks hooks;
  hooks.cancel = &e->cancel;
  double step_began = 0;  // the denoise stage's clock at the previous step
  using Clock = std::chrono::steady_clock;
  Clock::time_point decoded{};
  double stages = -1;  // the pipeline's stages, end to end (they do not nest); -1: none ended
  auto since_accepted = [&] { return std::chrono::duration<double>(Clock::now() - e->accepted).count(); };
  hooks.progress = [&](const ProgressEvent& ev) {
    if (ev.stage == Stage::Denoise && ev.kind == ProgressEvent::Begin) {
      std::lock_guard<std::mutex> lock(mu_);
      if (e->info.first_step_seconds < 0) {
        e->info.first_step_seconds = since_accepted();
        counters_.first_step_seconds_sum += e->info.first_step_seconds;
        ++counters_.first_step_seconds_count;
      }
    }
    if (ev.stage == Stage::Decode && ev.kind == ProgressEvent::End) decoded = Clock::now();
    if (ev.kind == ProgressEvent::End) stages = std::max(stages, 0.0) + ev.seconds;
    // Denoising is the work that scales with the request: 0-90; the decode ends at 99, completion 100.
    const bool step = ev.stage == Stage::Denoise && ev.kind == ProgressEvent::Advance && ev.total > 0;
    if (ev.stage == Stage::Denoise && ev.kind == ProgressEvent::Begin) step_began = 0;
    const int p = step ? 90 * ev.done / ev.total : ev.stage == Stage::Decode && ev.kind == ProgressEvent::End ? 99 : -1;
    if (p < 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (p > e->info.progress) changed_.notify_all();
    e->info.progress = std::max(e->info.progress, p);
    if (step) {
      counters_.step_seconds_sum += std::max(0.0, ev.seconds - step_began);
      ++counters_.step_seconds_count;
      step_began = ev.seconds;
    }
  };
  const std::string video = path_of(e->info.id + cfg_.video_ext);
  std::string code, message;
  std::shared_ptr<const GeneratePlan> plan;
  {
    std::lock_guard<std::mutex> lock(mu_);
    plan = std::move(e->plan);  // freed when the run ends, not when the record expires
  }
  try {
    runners_[worker]->run(e->opts, plan.get(), video, hooks);
  } catch (const Cancelled&) {
    code = "cancelled";
  } catch (const Error& err) {
    code = err.kind() == ErrorKind::BadInput ? "invalid_request" : "generation_failed";
    message = err.what();
  } catch (const std::exception& err) {
    code = "generation_failed";
    message = cat("internal: ", err.what());
  }
  const Clock::time_point ended = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  e->info.run_seconds = std::chrono::duration<double>(ended - e->started).count();
  if (decoded != Clock::time_point{}) e->info.write_seconds = std::chrono::duration<double>(ended - decoded).count();
  e->info.stage_seconds = stages;
  counters_.job_seconds_sum += e->info.run_seconds;
  ++counters_.job_seconds_count;
  running_.erase(std::find(running_.begin(), running_.end(), e));
  cv_.notify_all();
  if (e->cancel_code == "deleted") {  // DELETE during the run: nothing of it stays
    e->info.video_file = e->info.id + cfg_.video_ext;
    erase_files(e->info);
    return;
  }
  if (code.empty()) {
    e->info.video_file = e->info.id + cfg_.video_ext;
    finish(*e, JobState::Completed, "", "");
  } else if (code == "cancelled") {
    std::error_code ec;
    fs::remove(video, ec);
    const bool timeout = e->cancel_code == "timeout";
    finish(*e, JobState::Failed, timeout ? "timeout" : "server_shutdown",
           timeout ? cat("the job ran longer than the limit of ", cfg_.job_timeout_s, " s")
                   : "the server shut down before the job finished");
  } else {
    finish(*e, JobState::Failed, code, message);
  }
}

void JobQueue::worker(size_t index) {
  for (;;) {
    std::shared_ptr<Entry> e;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return closing_ || !queue_.empty(); });
      if (closing_) return;
      e = queue_.front();
      queue_.pop_front();
      running_.push_back(e);
      e->info.state = JobState::InProgress;
      e->started = std::chrono::steady_clock::now();
      e->info.queue_seconds = std::chrono::duration<double>(e->started - e->accepted).count();
      e->info.worker = static_cast<int>(index);
      persist(e->info);
      changed_.notify_all();
    }
    run_one(e, index);
  }
}

void JobQueue::timer() {
  auto last_sweep = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopped_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    const auto now = std::chrono::steady_clock::now();
    for (const std::shared_ptr<Entry>& r : running_)
      if (cfg_.job_timeout_s > 0 && !r->cancel &&
          std::chrono::duration<double>(now - r->started).count() > cfg_.job_timeout_s) {
        r->cancel_code = "timeout";
        r->cancel = true;
      }
    if (now - last_sweep >= std::chrono::seconds(1)) {
      last_sweep = now;
      lock.unlock();
      sweep_expired(unix_now());
      lock.lock();
    }
  }
}

bool JobQueue::shutdown(double drain_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stopped_) return true;
  closing_ = true;
  for (auto& e : queue_) finish(*e, JobState::Failed, "server_shutdown", "the server shut down before the job started");
  queue_.clear();
  cv_.notify_all();
  const bool drained =
      cv_.wait_for(lock, std::chrono::duration<double>(drain_s), [&] { return running_.empty(); });
  for (const std::shared_ptr<Entry>& r : running_) {
    r->cancel_code = "server_shutdown";
    r->cancel = true;
  }
  cv_.wait(lock, [&] { return running_.empty(); });  // a cancelled run returns at its next step
  stopped_ = true;
  cv_.notify_all();
  lock.unlock();
  for (std::thread& w : workers_)
    if (w.joinable()) w.join();
  if (timer_.joinable()) timer_.join();
  return drained;
}

}  // namespace wan::server
