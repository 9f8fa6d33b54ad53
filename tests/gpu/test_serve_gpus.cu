// `wan serve` on several GPUs (server/instances.h), without HTTP: the job queue with one worker per
// instance. Replicas (a ResidentRunner per GPU) take jobs at once, each on its own GPU with its own
// resident models, and equal requests give equal files whichever GPU ran them; a CFG-parallel instance
// (ParallelRunner over 2 GPUs) runs a job split over both, keeps its DiT for the next job (which equals a
// fresh run_generate_parallel byte for byte) and recovers from a failed or cancelled job. Tiny random
// models; needs 2 GPUs (skips with fewer).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <thread>

#include "formats/video.h"
#include "gpu_test_util.h"
#include "pipeline/generate_parallel.h"
#include "pipeline/pipeline.h"
#include "server/instances.h"
#include "server/jobs.h"

using namespace wan;
using namespace wan::server;
namespace fs = std::filesystem;

namespace {

GenerateOptions tiny(uint64_t seed) {
  GenerateOptions o;
  o.random_weights = true;
  o.weights_seed = 5;
  o.config = "tiny";
  o.prompt = "a fox";
  o.width = 64;
  o.height = 48;
  o.frames = 9;
  o.steps = 4;
  o.seed = seed;
  o.device = "cuda:0";
  o.plan_as_owner = true;
  return o;
}

std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Waits up to 120 s for every job to finish; returns false on a timeout.
bool all_finished(JobQueue& q, const std::vector<JobInfo>& jobs) {
  for (int i = 0; i < 12000; ++i) {
    bool done = true;
    for (const JobInfo& j : jobs) {
      const JobState s = q.get(j.id).value().state;
      done = done && (s == JobState::Completed || s == JobState::Failed);
    }
    if (done) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

struct Dir {
  std::string path = (fs::temp_directory_path() / ("wan_serve_gpus_" + new_job_id())).string();
  Dir() { fs::create_directories(path); }
  ~Dir() { fs::remove_all(path); }
};

}  // namespace

TEST(ServeGpus, ReplicasRunJobsOnEveryGpuWithEqualResults) {
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  ParallelArgs a;
  a.gpus = "2";
  const Instances in = plan_instances(a);
  ASSERT_EQ(in.groups.size(), 2u);
  ResidentRunner r0("cuda:0"), r1("cuda:1");
  Dir d;
  QueueConfig c;
  c.dir = d.path;
  c.video_ext = ".y4m";
  JobQueue q(c, std::vector<JobRunner*>{&r0, &r1});
  std::vector<JobInfo> jobs(6);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const GenerateOptions o = tiny(1 + i % 2);  // two requests, three times each
    jobs[i].model = "m";
    jobs[i].prompt = "a fox";
    ASSERT_EQ(q.submit(jobs[i], o, std::make_shared<const GeneratePlan>(plan_generate(o))), JobQueue::Submit::Accepted);
  }
  ASSERT_TRUE(all_finished(q, jobs));
  std::set<int> workers;
  std::vector<std::string> files(2);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const JobInfo j = q.get(jobs[i].id).value();
    ASSERT_EQ(j.state, JobState::Completed) << j.error_message;
    workers.insert(j.worker);
    const std::string b = bytes_of(q.path_of(j.video_file));
    ASSERT_GT(b.size(), 1000u);
    if (files[i % 2].empty()) files[i % 2] = b;
    EXPECT_EQ(b, files[i % 2]) << "job " << i << " on worker " << j.worker;
  }
  EXPECT_NE(files[0], files[1]);  // the two seeds differ
  EXPECT_EQ(workers.size(), 2u) << "both GPUs ran jobs";
  // Each replica built its own models once and reused them after.
  for (const ResidentRunner* r : {&r0, &r1}) {
    EXPECT_EQ(r->stats().built, 3u);
    EXPECT_GE(r->stats().reused, 3u);
  }
  printf("  replicas: built %llu + %llu, reused %llu + %llu\n", (unsigned long long)r0.stats().built,
         (unsigned long long)r1.stats().built, (unsigned long long)r0.stats().reused,
         (unsigned long long)r1.stats().reused);
}

TEST(ServeGpus, ACfgParallelInstanceRunsAJobOnBothGpus) {
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  ParallelArgs a;
  a.gpus = "2";
  a.cfg = true;
  const Instances in = plan_instances(a);
  ASSERT_EQ(in.groups.size(), 1u);
  ParallelRunner runner(in.groups[0], in.layout);
  Dir d;
  QueueConfig c;
  c.dir = d.path;
  c.video_ext = ".y4m";
  JobQueue q(c, runner);
  GenerateOptions o = tiny(3);
  o.parallel = true;  // as a request to a parallel instance is planned
  JobInfo j;
  j.model = "m";
  j.prompt = "a fox";
  ASSERT_EQ(q.submit(j, o, std::make_shared<const GeneratePlan>(plan_generate(o))), JobQueue::Submit::Accepted);
  ASSERT_TRUE(all_finished(q, {j}));
  const JobInfo done = q.get(j.id).value();
  ASSERT_EQ(done.state, JobState::Completed) << done.error_message;
  EXPECT_GT(bytes_of(q.path_of(done.video_file)).size(), 1000u);
  EXPECT_GE(done.first_step_seconds, 0.0);
}

namespace {

// What ParallelRunner does with a job's options, run once on a fresh launch (run_generate_parallel):
// the reference a session's job must equal byte for byte.
std::string fresh_parallel_video(const GenerateOptions& o, const std::string& path) {
  GenerateOptions g = o;
  g.plan_as_owner = false;
  ParallelArgs a;
  a.devices = "0,1";
  a.cfg = true;
  a.ulysses = "1";
  a.ring = "1";
  const ParallelRequest r = parse_parallel_request(a, &g, [](const char*) -> const char* { return nullptr; });
  const ParallelRun run = run_generate_parallel(g, r, RunHooks{}, true);
  const Tensor& v = run.result.video;
  write_video(path, v.f32(), static_cast<int>(v.dim(1)), static_cast<int>(v.dim(2)), static_cast<int>(v.dim(3)),
              run.plan.fps);
  return bytes_of(path);
}

GenerateOptions parallel_tiny(uint64_t seed) {
  GenerateOptions o = tiny(seed);
  o.parallel = true;  // as a request to a parallel instance is planned
  return o;
}

// `wan serve --gpus 2 --cfg-parallel`'s one instance.
ParallelRunner cfg_instance() {
  ParallelArgs a;
  a.gpus = "2";
  a.cfg = true;
  const Instances in = plan_instances(a);
  return ParallelRunner(in.groups[0], in.layout);
}

}  // namespace

TEST(ServeGpus, ACfgParallelInstanceKeepsItsDiTBetweenJobs) {
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  ParallelRunner runner = cfg_instance();
  Dir d;
  QueueConfig c;
  c.dir = d.path;
  c.video_ext = ".y4m";
  JobQueue q(c, runner);
  std::vector<JobInfo> jobs(3);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const GenerateOptions o = parallel_tiny(3 + i);
    jobs[i].model = "m";
    jobs[i].prompt = "a fox";
    ASSERT_EQ(q.submit(jobs[i], o, std::make_shared<const GeneratePlan>(plan_generate(o))), JobQueue::Submit::Accepted);
    ASSERT_TRUE(all_finished(q, {jobs[i]}));
    const JobInfo done = q.get(jobs[i].id).value();
    ASSERT_EQ(done.state, JobState::Completed) << done.error_message;
    // The first job builds the DiT, the text encoder and the VAE weights; its text encoder is freed
    // before the DiT is built (the DiT's plan assumed the device without it). The second reuses the DiT
    // and the VAE weights and keeps the encoder it builds; the third builds nothing.
    const ParallelSessionStats s = runner.stats();
    const uint64_t reused[] = {0, 2, 5}, built[] = {3, 4, 4};
    EXPECT_EQ(s.reused, reused[i]) << "after job " << i;
    EXPECT_EQ(s.built, built[i]) << "after job " << i;
    EXPECT_EQ(s.launches, 1u);
  }
  for (size_t i : {1, 2}) {  // on the kept DiT (and, for the third, the kept text encoder)
    const std::string kept = bytes_of(q.path_of(q.get(jobs[i].id).value().video_file));
    ASSERT_GT(kept.size(), 1000u);
    EXPECT_EQ(kept, fresh_parallel_video(parallel_tiny(3 + i), d.path + "/fresh.y4m"))
        << "job " << i << " on the kept models gives the bytes of a fresh run";
  }
  const std::string metrics = q.runner_metrics();
  EXPECT_NE(metrics.find("wan_models_reused_total 5"), std::string::npos) << metrics;
}

TEST(ServeGpus, AFailedOrCancelledParallelJobIsReportedAndTheNextRuns) {
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  ParallelRunner runner = cfg_instance();
  Dir d;
  const GenerateOptions o = parallel_tiny(7);
  runner.run(o, nullptr, d.path + "/a.y4m", RunHooks{});
  const std::string first = bytes_of(d.path + "/a.y4m");
  ASSERT_GT(first.size(), 1000u);

  // A rank that fails mid-job (on the kept DiT): the job's error, then a new launch for the next job.
  setenv("WAN_DIST_FAIL_RANK", "1", 1);
  setenv("WAN_DIST_FAIL_AT", "step", 1);
  try {
    runner.run(o, nullptr, d.path + "/b.y4m", RunHooks{});
    ADD_FAILURE() << "the forced failure did not fail the job";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("forced failure at 'step'"), std::string::npos) << e.what();
  }
  unsetenv("WAN_DIST_FAIL_RANK");
  unsetenv("WAN_DIST_FAIL_AT");
  EXPECT_FALSE(fs::exists(d.path + "/b.y4m"));
  runner.run(o, nullptr, d.path + "/c.y4m", RunHooks{});
  EXPECT_EQ(bytes_of(d.path + "/c.y4m"), first);
  EXPECT_EQ(runner.stats().launches, 2u);

  // Cancelled before its steps (rank 0 sees the flag after the text): Cancelled; the launch ends.
  std::atomic<bool> cancel{true};
  RunHooks h;
  h.cancel = &cancel;
  EXPECT_THROW(runner.run(o, nullptr, d.path + "/d.y4m", h), Cancelled);
  runner.run(o, nullptr, d.path + "/e.y4m", RunHooks{});
  EXPECT_EQ(bytes_of(d.path + "/e.y4m"), first);
  ParallelSessionStats s = runner.stats();
  EXPECT_EQ(s.launches, 3u);
  EXPECT_EQ(s.reused, 0u) << "every successful job so far ran on a new launch";

  // Cancelled after its first step (the ranks agree before the next): Cancelled at the same step on
  // every rank, so the launch and the DiT stay, and the next job reuses them.
  cancel = false;
  h.progress = [&cancel](const ProgressEvent& ev) {
    if (ev.stage == Stage::Denoise && ev.kind == ProgressEvent::Advance && ev.done >= 1) cancel = true;
  };
  EXPECT_THROW(runner.run(o, nullptr, d.path + "/f.y4m", h), Cancelled);
  EXPECT_FALSE(fs::exists(d.path + "/f.y4m"));
  runner.run(o, nullptr, d.path + "/g.y4m", RunHooks{});
  EXPECT_EQ(bytes_of(d.path + "/g.y4m"), first);
  s = runner.stats();
  EXPECT_EQ(s.launches, 3u) << "a cancel between steps keeps the launch";
  EXPECT_EQ(s.reused, 3u) << "the job after the cancelled one ran on the kept DiT, text encoder and VAE weights";
}

TEST(ServeGpus, ALayoutInstanceLoadsItsDiTAtStart) {
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  ParallelRunner runner = cfg_instance();
  const GenerateOptions o = parallel_tiny(5);
  EXPECT_GT(runner.preload(o), 0.0);
  ParallelSessionStats s = runner.stats();
  EXPECT_EQ(s.built, 3u) << "the preload builds the DiT, the text encoder and the VAE weights";
  EXPECT_EQ(s.reused, 0u);
  Dir d;
  runner.run(o, nullptr, d.path + "/a.y4m", RunHooks{});
  s = runner.stats();
  EXPECT_EQ(s.reused, 3u) << "the first job runs on the preloaded models";
  EXPECT_EQ(s.built, 3u) << "the first job builds nothing";
  EXPECT_EQ(s.launches, 1u);
  EXPECT_EQ(bytes_of(d.path + "/a.y4m"), fresh_parallel_video(o, d.path + "/fresh.y4m"));
}
