// The job layer of `wan serve` (src/server/jobs.h) with a scripted runner (no model): states and
// progress, the bounded queue, DELETE of queued and running jobs, failures, the per-job time limit,
// drain and cancel on shutdown, records that survive a restart (interrupted jobs failed with a
// reason), retention, the checked plan handed to the runner, wait_change (the events stream's wait),
// several workers (one per model instance) on one queue with their summed counters, the jobs' timings,
// and how serve's --gpus / --devices / layout flags become instances (server/instances.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "formats/output_file.h"
#include "server/instances.h"
#include "server/jobs.h"

namespace {

namespace fs = std::filesystem;
using namespace wan;
using namespace wan::server;

// Runs 4 "steps"; the prompt says how: "fail" throws, "hold" waits until released (or cancelled).
class ScriptedRunner : public JobRunner {
 public:
  std::atomic<bool> release{false};
  std::atomic<int> started{0}, cancelled{0};
  std::atomic<uint64_t> plan_seed{0};  // the seed of the last plan handed over (0: none)
  std::vector<RunnerCounter> counters() const override {
    return {{"scripted_runs_total", "Runs started.", static_cast<double>(started.load())}};
  }
  void run(const GenerateOptions& o, const GeneratePlan* plan, const std::string& path, const RunHooks& hooks) override {
    ++started;
    hooks.progress({ProgressEvent::Begin, Stage::Denoise, 0, 4, 0, ""});
    plan_seed = plan ? plan->seed : 0;
    const std::string p = o.prompt.value_or("");
    if (p == "fail") throw Error("scripted failure", ErrorKind::BadInput);
    while (p == "hold" && !release) {
      if (*hooks.cancel) {
        ++cancelled;
        throw Cancelled();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (int i = 1; i <= 4; ++i) {
      if (*hooks.cancel) {
        ++cancelled;
        throw Cancelled();
      }
      hooks.progress({ProgressEvent::Advance, Stage::Denoise, i, 4, 0.5 * i, ""});  // 0.5 s a step
    }
    hooks.progress({ProgressEvent::End, Stage::Decode, 1, 1, 0, ""});
    OutputFile f(path, "video");
    f.write("VIDEO", 5);
    f.commit();
  }
};

struct Dir {
  std::string path;
  Dir() {
    path = (fs::temp_directory_path() / ("wan_serve_jobs_" + new_job_id())).string();
    fs::create_directories(path);
  }
  ~Dir() { fs::remove_all(path); }
};

QueueConfig config(const Dir& d, size_t max_queue = 4) {
  QueueConfig c;
  c.dir = d.path;
  c.max_queue = max_queue;
  c.retention_s = 3600;
  c.video_ext = ".mp4";
  return c;
}

JobInfo job(const std::string& prompt) {
  JobInfo j;
  j.model = "m";
  j.prompt = prompt;
  j.size = "64x64";
  j.seconds = "0.25";
  return j;
}

GenerateOptions opts(const std::string& prompt) {
  GenerateOptions o;
  o.prompt = prompt;
  return o;
}

// Waits up to 5 s for `pred`.
template <typename F>
bool eventually(F pred) {
  for (int i = 0; i < 1000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

JobState state_of(JobQueue& q, const std::string& id) { return q.get(id).value().state; }

// Submits a job with `prompt` and waits until it reaches `until` (throws, failing the test, if it never does).
JobInfo submit_until(JobQueue& q, const std::string& prompt, JobState until) {
  JobInfo j = job(prompt);
  if (q.submit(j, opts(prompt)) != JobQueue::Submit::Accepted) throw std::runtime_error("not accepted");
  if (!eventually([&] { return state_of(q, j.id) == until; })) throw std::runtime_error("state never reached");
  return j;
}

// A job held running ("hold") and a job queued behind it.
std::pair<JobInfo, JobInfo> held_and_queued(JobQueue& q) {
  const JobInfo a = submit_until(q, "hold", JobState::InProgress);
  JobInfo b = job("go");
  if (q.submit(b, opts("go")) != JobQueue::Submit::Accepted) throw std::runtime_error("not accepted");
  return {a, b};
}

TEST(ServeJobs, RunsAJobToCompletedWithItsFileAndRecord) {
  Dir d;
  ScriptedRunner r;
  JobQueue q(config(d), r);
  JobInfo j = job("go");
  ASSERT_EQ(q.submit(j, opts("go")), JobQueue::Submit::Accepted);
  EXPECT_EQ(j.state, JobState::Queued);
  EXPECT_TRUE(plausible_job_id(j.id));
  ASSERT_TRUE(eventually([&] { return state_of(q, j.id) == JobState::Completed; }));
  const JobInfo done = *q.get(j.id);
  EXPECT_EQ(done.progress, 100);
  EXPECT_GT(done.completed_at, 0);
  EXPECT_GE(done.expires_at, done.completed_at + 3599);
  EXPECT_TRUE(fs::exists(q.path_of(done.video_file)));
  std::ifstream in(d.path + "/jobs/" + j.id + ".json");
  EXPECT_EQ(nlohmann::json::parse(in)["status"], "completed");
  const QueueStats s = q.stats();
  EXPECT_EQ(s.by_state.at(JobState::Completed), 1);
  EXPECT_EQ(s.job_seconds_count, 1u);
  EXPECT_EQ(s.step_seconds_count, 4u);
  EXPECT_DOUBLE_EQ(s.step_seconds_sum, 2.0);
  EXPECT_EQ(r.plan_seed, 0u);  // no plan handed over: the runner plans
  // Where the time went, from acceptance: queued, then the first step, then the file after the decode.
  EXPECT_GE(done.queue_seconds, 0.0);
  EXPECT_GE(done.first_step_seconds, done.queue_seconds);
  EXPECT_EQ(done.stage_seconds, 0.0);  // the scripted decode's End event says 0 s
  EXPECT_GE(done.write_seconds, 0.0);
  EXPECT_LE(done.write_seconds, done.run_seconds);
  EXPECT_EQ(done.worker, 0);
  EXPECT_EQ(s.first_step_seconds_count, 1u);
  EXPECT_EQ(q.runner_metrics(), "# HELP scripted_runs_total Runs started.\n# TYPE scripted_runs_total counter\n"
                                "scripted_runs_total 1\n");
}

// One worker per runner: two held jobs run at once, on different workers; a third waits for a free one;
// the counters are summed over the runners; shutdown cancels every running job.
TEST(ServeJobs, EachRunnerHasAWorkerAndTheyShareOneQueue) {
  Dir d;
  ScriptedRunner a, b;
  JobQueue q(config(d), std::vector<JobRunner*>{&a, &b});
  EXPECT_EQ(q.workers(), 2u);
  const JobInfo x = submit_until(q, "hold", JobState::InProgress);
  const JobInfo y = submit_until(q, "hold", JobState::InProgress);
  ASSERT_TRUE(eventually([&] { return a.started + b.started == 2; }));  // in_progress comes first
  EXPECT_EQ(a.started, 1);
  EXPECT_NE(q.get(x.id)->worker, q.get(y.id)->worker);
  JobInfo z = job("go");
  ASSERT_EQ(q.submit(z, opts("go")), JobQueue::Submit::Accepted);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(state_of(q, z.id), JobState::Queued);  // both workers busy
  EXPECT_EQ(q.stats().by_state.at(JobState::InProgress), 2);
  EXPECT_NE(q.runner_metrics().find("scripted_runs_total 2\n"), std::string::npos) << q.runner_metrics();
  EXPECT_FALSE(q.shutdown(0.05));  // both held runs are cancelled
  EXPECT_EQ(a.cancelled + b.cancelled, 2);
  for (const JobInfo& j : {x, y, z}) {
    EXPECT_EQ(state_of(q, j.id), JobState::Failed);
    EXPECT_EQ(q.get(j.id)->error_code, "server_shutdown");
  }
}

TEST(ServeInstances, ReplicasPerGpuOrLayoutsOfConsecutiveGpus) {
  ParallelArgs a;
  EXPECT_FALSE(plan_instances(a).active());  // one --device: the single worker
  a.gpus = "3";
  Instances in = plan_instances(a);
  ASSERT_EQ(in.groups.size(), 3u);
  EXPECT_FALSE(in.layout.active());
  EXPECT_EQ(in.groups[2], std::vector<int>{2});
  EXPECT_EQ(in.describe(), "3 replicas on cuda:0, cuda:1, cuda:2");
  a.gpus.clear();
  a.devices = "4,5,6,7";
  a.ulysses = "2";
  in = plan_instances(a);
  ASSERT_EQ(in.groups.size(), 2u);
  EXPECT_EQ(in.groups[1], (std::vector<int>{6, 7}));
  EXPECT_EQ(in.layout, (dist::Layout{1, 2, 1}));
  EXPECT_EQ(in.describe(), "2 instances of cfg 1 x ulysses 2 x ring 1: devices 4,5 | 6,7");
  a.cfg = true;
  in = plan_instances(a);
  ASSERT_EQ(in.groups.size(), 1u);
  EXPECT_EQ(in.layout.world(), 4);
  a.device = "cuda";  // --device cuda is where the instances are anyway
  EXPECT_NO_THROW(plan_instances(a));
  auto refused = [](ParallelArgs b, const std::string& needle) {
    try {
      (void)plan_instances(b);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::BadInput);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  ParallelArgs b;
  b.gpus = "3";
  b.cfg = true;
  refused(b, "does not divide the 3 GPUs");
  b.gpus.clear();
  refused(b, "add --gpus N");
  b.gpus = "2";
  b.cfg = false;
  b.devices = "0,1";
  refused(b, "cannot be given together");
  b.devices.clear();
  b.device = "cpu";
  refused(b, "both choose where the models run");
  b.device = "cuda:1";
  refused(b, "both choose where the models run");
  b.device.reset();
  b.ring = "x";
  refused(b, "--ring: 'x' is not a positive integer");
}

TEST(ServeJobs, TheRunnerGetsThePlanTheRequestWasCheckedWith) {
  Dir d;
  ScriptedRunner r;
  JobQueue q(config(d), r);
  auto plan = std::make_shared<GeneratePlan>();
  plan->seed = 4242;
  JobInfo j = job("go");
  ASSERT_EQ(q.submit(j, opts("go"), plan), JobQueue::Submit::Accepted);
  ASSERT_TRUE(eventually([&] { return state_of(q, j.id) == JobState::Completed; }));
  EXPECT_EQ(r.plan_seed, 4242u);
  EXPECT_TRUE(eventually([&] { return plan.use_count() == 1; }));  // the queue lets go of it after the run
}

TEST(ServeJobs, WaitChangeReturnsOnEachStateOrProgressChangeAndWhenDeleted) {
  Dir d;
  ScriptedRunner r;
  JobQueue q(config(d), r);
  const JobInfo held = submit_until(q, "hold", JobState::InProgress);
  JobInfo seen = *q.get(held.id);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(q.wait_change(held.id, seen, 0.2)->state, JobState::InProgress);  // nothing changed: the timeout
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(150));
  r.release = true;
  std::vector<int> progress;
  while (seen.state != JobState::Completed) {
    seen = q.wait_change(held.id, seen, 5).value();
    progress.push_back(seen.progress);
  }
  EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
  EXPECT_EQ(progress.back(), 100);
  r.release = false;
  const JobInfo gone = submit_until(q, "hold", JobState::InProgress);
  std::thread del([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    q.remove(gone.id);
  });
  EXPECT_FALSE(q.wait_change(gone.id, *q.get(gone.id), 5).has_value());
  del.join();
}

TEST(ServeJobs, BoundedQueueRefusesWhenFullAndCountsIt) {
  Dir d;
  ScriptedRunner r;
  JobQueue q(config(d, 2), r);
  JobInfo a = job("hold"), b = job("go"), c = job("go"), e = job("go");
  ASSERT_EQ(q.submit(a, opts("hold")), JobQueue::Submit::Accepted);
  ASSERT_TRUE(eventually([&] { return state_of(q, a.id) == JobState::InProgress; }));
  EXPECT_EQ(q.submit(b, opts("go")), JobQueue::Submit::Accepted);
  EXPECT_EQ(q.submit(c, opts("go")), JobQueue::Submit::Accepted);
  EXPECT_EQ(q.submit(e, opts("go")), JobQueue::Submit::Full);
  QueueStats s = q.stats();
  EXPECT_EQ(s.queue_depth, 2u);
  EXPECT_EQ(s.by_state.at(JobState::Queued), 2);
  EXPECT_EQ(s.by_state.at(JobState::InProgress), 1);
  EXPECT_EQ(s.rejected_full, 1u);
  r.release = true;
  ASSERT_TRUE(eventually([&] { return state_of(q, c.id) == JobState::Completed; }));
  EXPECT_EQ(state_of(q, a.id), JobState::Completed);
  EXPECT_EQ(state_of(q, b.id), JobState::Completed);
}

TEST(ServeJobs, DeleteCancelsTheRunningJobAndRemovesQueuedOnes) {
  Dir d;
  ScriptedRunner r;
  JobQueue q(config(d), r);
  const auto [a, b] = held_and_queued(q);
  EXPECT_TRUE(q.remove(b.id));  // queued: gone at once, never run
  EXPECT_FALSE(q.get(b.id));
  EXPECT_FALSE(fs::exists(d.path + "/jobs/" + b.id + ".json"));
  EXPECT_TRUE(q.remove(a.id));  // running: cancelled between steps
  EXPECT_FALSE(q.get(a.id));
  ASSERT_TRUE(eventually([&] { return r.cancelled == 1; }));
  ASSERT_TRUE(eventually([&] { return !fs::exists(d.path + "/jobs/" + a.id + ".json"); }));
  EXPECT_FALSE(fs::exists(d.path + "/" + a.id + ".mp4"));
  EXPECT_EQ(r.started, 1);
  EXPECT_FALSE(q.remove(a.id));
  EXPECT_FALSE(q.remove("video_unknown"));
}

TEST(ServeJobs, AFailingRunEndsFailedWithTheReason) {
  Dir d;
  ScriptedRunner r;
  JobQueue q(config(d), r);
  const JobInfo j = submit_until(q, "fail", JobState::Failed);
  const JobInfo f = *q.get(j.id);
  EXPECT_EQ(f.error_code, "invalid_request");
  EXPECT_NE(f.error_message.find("scripted failure"), std::string::npos);
  EXPECT_EQ(f.completed_at, 0);
  EXPECT_GT(f.expires_at, 0);
}

TEST(ServeJobs, AJobOverTheTimeLimitIsCancelledAndFailed) {
  Dir d;
  ScriptedRunner r;
  QueueConfig c = config(d);
  c.job_timeout_s = 0.2;
  JobQueue q(c, r);
  const JobInfo j = submit_until(q, "hold", JobState::Failed);
  EXPECT_EQ(q.get(j.id)->error_code, "timeout");
  EXPECT_EQ(r.cancelled, 1);
  EXPECT_FALSE(fs::exists(d.path + "/" + j.id + ".mp4"));
}

TEST(ServeJobs, ShutdownLetsTheRunningJobFinishWithinTheDrainTime) {
  Dir d;
  ScriptedRunner r;
  JobQueue q(config(d), r);
  const auto [a, b] = held_and_queued(q);
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    r.release = true;
  });
  EXPECT_TRUE(q.shutdown(10));
  releaser.join();
  EXPECT_EQ(state_of(q, a.id), JobState::Completed);
  EXPECT_EQ(state_of(q, b.id), JobState::Failed);  // queued jobs do not start after the signal
  EXPECT_EQ(q.get(b.id)->error_code, "server_shutdown");
  EXPECT_TRUE(q.closed());
  JobInfo c = job("go");
  EXPECT_EQ(q.submit(c, opts("go")), JobQueue::Submit::Closed);
}

TEST(ServeJobs, ShutdownCancelsARunLongerThanTheDrainTime) {
  Dir d;
  ScriptedRunner r;
  JobQueue q(config(d), r);
  const JobInfo a = submit_until(q, "hold", JobState::InProgress);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(q.shutdown(0.1));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);
  EXPECT_EQ(state_of(q, a.id), JobState::Failed);
  EXPECT_EQ(q.get(a.id)->error_code, "server_shutdown");
  EXPECT_EQ(r.cancelled, 1);
}

TEST(ServeJobs, ARestartListsFinishedJobsAndFailsInterruptedOnes) {
  Dir d;
  std::string done_id, failed_id;
  {
    ScriptedRunner r;
    JobQueue q(config(d), r);
    JobInfo a = job("go");
    ASSERT_EQ(q.submit(a, opts("go")), JobQueue::Submit::Accepted);
    ASSERT_TRUE(eventually([&] { return state_of(q, a.id) == JobState::Completed; }));
    done_id = a.id;
  }
  // What a killed server leaves: a job in progress, a completed job whose video is gone, a broken record.
  JobInfo running = job("x");
  running.id = "video_interrupted";
  running.state = JobState::InProgress;
  running.seq = 40;
  running.input_file = "video_interrupted.input.png";
  std::ofstream(d.path + "/" + running.input_file) << "png";
  std::ofstream(d.path + "/jobs/video_interrupted.json") << job_record(running).dump();
  JobInfo lost = job("y");
  lost.id = "video_lost";
  lost.state = JobState::Completed;
  lost.video_file = "video_lost.mp4";
  lost.seq = 41;
  std::ofstream(d.path + "/jobs/video_lost.json") << job_record(lost).dump();
  std::ofstream(d.path + "/jobs/video_broken.json") << "{not json";
  std::ofstream(d.path + "/.video_x.mp4.abcdef.tmp") << "partial";

  ScriptedRunner r;
  JobQueue q(config(d), r);
  ASSERT_EQ(q.list().size(), 3u);
  EXPECT_EQ(state_of(q, done_id), JobState::Completed);
  EXPECT_EQ(state_of(q, "video_interrupted"), JobState::Failed);
  EXPECT_EQ(q.get("video_interrupted")->error_code, "interrupted");
  EXPECT_FALSE(fs::exists(d.path + "/video_interrupted.input.png"));
  EXPECT_EQ(q.get("video_lost")->error_code, "output_missing");
  EXPECT_EQ(q.load_notes().size(), 1u);
  EXPECT_FALSE(fs::exists(d.path + "/.video_x.mp4.abcdef.tmp"));
  JobInfo next = job("go");
  ASSERT_EQ(q.submit(next, opts("go")), JobQueue::Submit::Accepted);
  EXPECT_EQ(next.seq, 42u);  // after every recorded job
  EXPECT_EQ(q.list().back().id, next.id);
}

TEST(ServeJobs, FinishedJobsExpireWithTheirFiles) {
  Dir d;
  ScriptedRunner r;
  JobQueue q(config(d), r);
  const JobInfo a = submit_until(q, "go", JobState::Completed);
  const std::string video = q.path_of(q.get(a.id)->video_file);
  q.sweep_expired(unix_now() + 60);  // not yet
  EXPECT_TRUE(q.get(a.id));
  q.sweep_expired(unix_now() + 3601);
  EXPECT_FALSE(q.get(a.id));
  EXPECT_FALSE(fs::exists(video));
  EXPECT_FALSE(fs::exists(d.path + "/jobs/" + a.id + ".json"));
}

TEST(ServeJobs, RecordsRoundTripAndRefusePathsInFileNames) {
  JobInfo j = job("p");
  j.id = "video_abc";
  j.state = JobState::Failed;
  j.error_code = "timeout";
  j.seq = 7;
  j.queue_seconds = 0.25;
  j.first_step_seconds = 0.5;
  j.write_seconds = 0.125;
  j.worker = 3;
  const JobInfo back = job_from_record(job_record(j));
  EXPECT_EQ(back.queue_seconds, 0.25);
  EXPECT_EQ(back.first_step_seconds, 0.5);
  EXPECT_EQ(back.write_seconds, 0.125);
  EXPECT_EQ(back.worker, 3);
  nlohmann::json old = job_record(j);  // a record from before the timings: none
  old.erase("queue_seconds");
  old.erase("worker");
  EXPECT_EQ(job_from_record(old).queue_seconds, -1.0);
  EXPECT_EQ(job_from_record(old).worker, -1);
  EXPECT_EQ(back.id, j.id);
  EXPECT_EQ(back.state, JobState::Failed);
  EXPECT_EQ(back.error_code, "timeout");
  EXPECT_EQ(back.seq, 7u);
  nlohmann::json bad = job_record(j);
  bad["video_file"] = "../etc/passwd";
  EXPECT_THROW(job_from_record(bad), Error);
  bad = job_record(j);
  bad["id"] = "../x";
  EXPECT_THROW(job_from_record(bad), Error);
  EXPECT_FALSE(plausible_job_id("a/b"));
  EXPECT_FALSE(plausible_job_id(""));
}

}  // namespace

// A layout instance counts its models under the replicas' counter names, so a server's metrics sum
// over both kinds of runner; before its first job (no session yet) it has built nothing.
TEST(ServeInstances, ALayoutInstanceCountsModelsUnderTheReplicasNames) {
  ParallelRunner p({0, 1}, dist::Layout{2, 1, 1});
  ResidentRunner r;
  const std::vector<RunnerCounter> pc = p.counters(), rc = r.counters();
  ASSERT_EQ(pc.size(), 2u);
  ASSERT_GE(rc.size(), 2u);
  for (size_t i = 0; i < pc.size(); ++i) {
    EXPECT_EQ(pc[i].name, rc[i].name);
    EXPECT_EQ(pc[i].value, 0.0);
  }
  EXPECT_EQ(p.stats().launches, 0u);
}
