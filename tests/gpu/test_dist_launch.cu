// launch() on GPUs (issue 5, items 1 and 4): NCCL bootstrap in-process (one thread per GPU) and
// multi-process (this binary re-executed once per rank with WAN_RANK..., TCP rendezvous), checked by
// an all-reduce of fresh random vectors against the fp64 host sum; a registered split communicator;
// and failure while a rank sits inside an all-reduce that can never complete: a throwing rank, a
// killed rank (lost peer) and a hang (watchdog) must end every rank with the same error within
// seconds. Skips cleanly with fewer than 2 GPUs or without NCCL.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "../cpu/test_util.h"
#include "runtime/dist/launch.h"
#include "runtime/dist/rendezvous.h"
#include "gpu_test_util.h"

#ifndef WAN_HAVE_NCCL
TEST(DistLaunchGpu, NeedsNccl) { GTEST_SKIP() << "built without NCCL"; }
#else

using namespace wan;
using namespace wan::dist;

namespace {

using test::error_of;
using test::EnvGuard;

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

#define REQUIRE_2_GPUS()                                                              \
  REQUIRE_GPU();                                                                      \
  if (::wan::cuda::device_count() < 2)                                                \
  GTEST_SKIP() << "needs 2 GPUs, found " << ::wan::cuda::device_count()

constexpr size_t kN = (size_t(1) << 22) + 37;  // 16 MiB of fp32 per rank, not a multiple of anything

struct Buf {
  float* p = nullptr;
  explicit Buf(size_t n) { CUDA_CHECK(cudaMalloc(&p, n * sizeof(float))); }
  ~Buf() { cudaFree(p); }
};
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};

// All-reduce (sum) of rank r's randn(seed + r) over `comm`; returns the max abs error against the fp64
// host sum of every rank's input.
double allreduce_error(const RankContext& ctx, ncclComm_t comm, uint64_t seed) {
  const std::vector<float> mine = gpu_test::randn(seed + ctx.rank, kN, 1.0f, 0.25f);
  std::vector<double> want(kN, 0.0);
  for (int r = 0; r < ctx.world; ++r) {
    const std::vector<float> v = gpu_test::randn(seed + r, kN, 1.0f, 0.25f);
    for (size_t i = 0; i < kN; ++i) want[i] += v[i];
  }
  Buf d(kN);
  Stream s;
  CUDA_CHECK(cudaMemcpy(d.p, mine.data(), kN * sizeof(float), cudaMemcpyHostToDevice));
  NCCL_CHECK(ncclAllReduce(d.p, d.p, kN, ncclFloat32, ncclSum, comm, s.s));
  ctx.sync(s.s);
  std::vector<float> got(kN);
  CUDA_CHECK(cudaMemcpy(got.data(), d.p, kN * sizeof(float), cudaMemcpyDeviceToHost));
  double err = 0;
  for (size_t i = 0; i < kN; ++i) err = std::max(err, std::fabs(got[i] - want[i]));
  return std::isfinite(err) ? err : 1e30;
}

// The ranks' work in the success case: checks the context, all-reduces over the world communicator and
// over a registered split of it (reversed rank order).
double work_allreduce(RankContext& ctx, uint64_t seed) {
  int dev = -1;
  CUDA_CHECK(cudaGetDevice(&dev));
  WAN_CHECK(dev == ctx.device, "current device ", dev, " != ctx.device ", ctx.device);
  WAN_CHECK(ctx.comm != nullptr, "no world communicator");
  int n = 0, r = -1;
  NCCL_CHECK(ncclCommCount(ctx.comm, &n));
  NCCL_CHECK(ncclCommUserRank(ctx.comm, &r));
  WAN_CHECK(n == ctx.world && r == ctx.rank, "communicator is rank ", r, " of ", n);
  double err = allreduce_error(ctx, ctx.comm, seed);
  ncclComm_t sub = nullptr;
  NCCL_CHECK(ncclCommSplit(ctx.comm, 0, ctx.world - 1 - ctx.rank, &sub, nullptr));
  ctx.register_comm(sub);  // the launch destroys it
  NCCL_CHECK(ncclCommUserRank(sub, &r));
  WAN_CHECK(r == ctx.world - 1 - ctx.rank, "split rank ", r);
  err = std::max(err, allreduce_error(ctx, sub, seed + 1000));
  return err;
}

// Rank 0 (and every rank but 1) enters an all-reduce that rank 1 never joins: rank 1 fails at
// "after_barrier" as WAN_DIST_FAIL_* says (throw, exit, hang). `warm`: one all-reduce on every rank
// first, so rank 0 then waits inside the kernel (else inside NCCL's connection setup on the host).
struct FailTiming {
  std::mutex mu;
  Clock::time_point t_fail{}, t_end[8]{};
  std::string seen[8];
};
void work_fail_in_allreduce(RankContext& ctx, bool warm, FailTiming* t) {
  Buf d(kN);
  Stream s;
  CUDA_CHECK(cudaMemset(d.p, 0, kN * sizeof(float)));
  if (warm) {  // the same size as below, so the same algorithm's connections are set up
    NCCL_CHECK(ncclAllReduce(d.p, d.p, kN, ncclFloat32, ncclSum, ctx.comm, s.s));
    ctx.sync(s.s);
  }
  ctx.barrier();
  try {
    if (ctx.rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // rank 0 is in the all-reduce by now
      if (t) t->t_fail = Clock::now();
      maybe_fail(ctx, "after_barrier");
    }
    // Abort-aware checks: after rank 1's failure, rank 0 sees that failure, whether it waits in the
    // kernel (sync) or in NCCL's host-side connection setup (the call fails on the stopped communicator).
    ctx.check_nccl(ncclAllReduce(d.p, d.p, kN, ncclFloat32, ncclSum, ctx.comm, s.s), "ncclAllReduce");
    ctx.sync(s.s);
  } catch (const Error& e) {
    if (t) {
      std::lock_guard<std::mutex> lk(t->mu);
      t->t_end[ctx.rank] = Clock::now();
      t->seen[ctx.rank] = e.what();
    }
    throw;
  }
}

uint64_t fresh_seed() { return (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}(); }

LaunchOptions all_gpus() {
  LaunchOptions o;
  for (int i = 0; i < cuda::device_count(); ++i) o.devices.push_back(i);
  return o;
}

// --- multi-process: this binary, re-executed per rank ----------------------------------------------

struct Proc {
  int code = -1;
  std::string out, log;
};

// Starts `world` copies of this test binary running DistLaunchGpuChild.Run in `mode` as ranks of one
// launch (WAN_* environment, rank 0 at 127.0.0.1:<free port>); waits up to limit_s (then kills).
std::vector<Proc> run_ranks(int world, const std::string& mode, const std::map<std::string, std::string>& env,
                            double limit_s, double* elapsed) {
  test::TempDir dir("distgpu");
  const int port = free_tcp_port();
  char exe[4096];
  const ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  EXPECT_GT(k, 0);
  exe[k > 0 ? k : 0] = '\0';
  std::vector<pid_t> pids;
  const auto t0 = Clock::now();
  for (int r = 0; r < world; ++r) {
    // Everything the child needs is built before fork(): between fork and exec only async-signal-safe
    // calls (the CUDA runtime's threads may hold locks in the parent).
    std::map<std::string, std::string> vars = env;
    vars["WAN_DIST_GPU_CHILD"] = mode;
    vars["WAN_DIST_GPU_CHILD_OUT"] = dir.file("out" + std::to_string(r));
    vars["WAN_RANK"] = std::to_string(r);
    vars["WAN_WORLD_SIZE"] = std::to_string(world);
    vars["WAN_LOCAL_RANK"] = std::to_string(r);
    vars["WAN_MASTER_ADDR"] = "127.0.0.1";
    vars["WAN_MASTER_PORT"] = std::to_string(port);
    std::vector<std::string> envs;
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      if (!vars.count(kv.substr(0, kv.find('=')))) envs.push_back(kv);
    }
    for (const auto& [key, v] : vars) envs.push_back(key + "=" + v);
    std::vector<char*> envp;
    for (auto& kv : envs) envp.push_back(kv.data());
    envp.push_back(nullptr);
    const std::string log = dir.file("log" + std::to_string(r));
    std::string filter = "--gtest_filter=DistLaunchGpuChild.Run";
    char* argv[] = {exe, filter.data(), nullptr};
    fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      execve(exe, argv, envp.data());
      _exit(121);
    }
    pids.push_back(pid);
  }
  std::vector<Proc> res(world);
  std::vector<bool> done(world, false);
  int left = world;
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      int st = 0;
      if (!done[r] && waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        done[r] = true;
        --left;
        res[r].code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
    }
    if (left > 0 && since(t0) > limit_s) {
      for (int r = 0; r < world; ++r)
        if (!done[r]) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          ADD_FAILURE() << "rank " << r << " still running after " << limit_s << " s (hang)";
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  *elapsed = since(t0);
  for (int r = 0; r < world; ++r) {
    std::stringstream a, b;
    a << std::ifstream(dir.file("out" + std::to_string(r))).rdbuf();
    b << std::ifstream(dir.file("log" + std::to_string(r))).rdbuf();
    res[r].out = a.str();
    res[r].log = b.str();
  }
  return res;
}

std::string describe(const std::vector<Proc>& p) {
  std::string s;
  for (size_t r = 0; r < p.size(); ++r)
    s += cat("--- rank ", r, " exit ", p[r].code, " out: ", p[r].out, "\n", p[r].log.substr(0, 3000), "\n");
  return s;
}

}  // namespace

// The child side of the multi-process tests (skips unless started by run_ranks).
TEST(DistLaunchGpuChild, Run) {
  const char* mode = std::getenv("WAN_DIST_GPU_CHILD");
  if (!mode) GTEST_SKIP() << "a rank of the multi-process tests (started by them)";
  const char* out = std::getenv("WAN_DIST_GPU_CHILD_OUT");
  std::string result;
  int code = 0;
  try {
    double err = 0;
    launch(LaunchOptions{}, [&](RankContext& ctx) {
      if (!std::strcmp(mode, "allreduce")) err = work_allreduce(ctx, std::stoull(std::getenv("WAN_DIST_GPU_SEED")));
      else work_fail_in_allreduce(ctx, /*warm=*/true, nullptr);
    });
    result = cat("ok ", err);
  } catch (const Error& e) {
    result = cat("error: ", e.what());
    code = e.kind() == ErrorKind::BadInput ? 2 : 1;
  }
  std::ofstream(out) << result;
  fflush(nullptr);
  _exit(code);
}

TEST(DistLaunchGpu, InProcessAllReduce) {
  REQUIRE_2_GPUS();
  std::vector<double> err(cuda::device_count(), -1);
  const uint64_t seed = fresh_seed();
  const auto t0 = Clock::now();
  launch(all_gpus(), [&](RankContext& ctx) {
    EXPECT_TRUE(ctx.in_process);
    err[ctx.rank] = work_allreduce(ctx, seed);
  });
  int v = 0;
  ncclGetVersion(&v);
  printf("NCCL %d; in-process launch on %d GPUs (NCCL init, 2 all-reduces of %zu floats, split): %.2f s\n", v,
         cuda::device_count(), kN, since(t0));
  for (size_t r = 0; r < err.size(); ++r) {
    EXPECT_GE(err[r], 0) << "rank " << r;
    EXPECT_LT(err[r], 1e-5 * err.size() * 8) << "rank " << r;  // fp32 sums of N(0.25, 1) values
  }
}

class DistLaunchGpuFail : public ::testing::TestWithParam<std::tuple<const char*, bool>> {};

TEST_P(DistLaunchGpuFail, InProcessRankFailsWhileOtherInAllReduce) {
  REQUIRE_2_GPUS();
  const auto [mode, warm] = GetParam();
  EnvGuard g;
  g.set("WAN_DIST_ABORT_MODE", mode);
  g.set("WAN_DIST_FAIL_RANK", "1");
  g.set("WAN_DIST_FAIL_AT", "after_barrier");
  FailTiming t;
  const auto t0 = Clock::now();
  const std::string e =
      error_of([&] { launch(all_gpus(), [&](RankContext& ctx) { work_fail_in_allreduce(ctx, warm, &t); }); });
  const double total = since(t0), after_fail = since(t.t_fail);
  printf("abort mode %s, %s: launch ended %.2f s after rank 1 failed (%.2f s in all)\n", mode,
         warm ? "warm" : "cold", after_fail, total);
  EXPECT_EQ(e, "rank 1: forced failure at 'after_barrier' (WAN_DIST_FAIL_RANK=1)");
  EXPECT_EQ(t.seen[0], e) << "rank 0 did not see the same error";
  EXPECT_LT(after_fail, 5.0);
  // The GPUs are fine afterwards: a fresh launch all-reduces correctly.
  g.set("WAN_DIST_FAIL_RANK", "");
  std::vector<double> err(cuda::device_count(), -1);
  const uint64_t seed = fresh_seed();
  launch(all_gpus(), [&](RankContext& ctx) { err[ctx.rank] = work_allreduce(ctx, seed); });
  for (double x : err) EXPECT_LT(x, 1e-3);
}

TEST(DistLaunchGpu, InProcessOutOfMemory) {
  // Rank 1 hits a real CUDA out-of-memory error while rank 0 sits in an all-reduce.
  REQUIRE_2_GPUS();
  EnvGuard g;
  g.set("WAN_DIST_FAIL_RANK", "1");
  g.set("WAN_DIST_FAIL_AT", "after_barrier");
  g.set("WAN_DIST_FAIL_MODE", "oom");
  FailTiming t;
  const std::string e =
      error_of([&] { launch(all_gpus(), [&](RankContext& ctx) { work_fail_in_allreduce(ctx, true, &t); }); });
  printf("out of memory on rank 1: launch ended %.2f s after it\n", since(t.t_fail));
  EXPECT_EQ(e, "rank 1: forced failure at 'after_barrier': cudaMalloc of 1 PiB: out of memory (CUDA error 2)");
  EXPECT_EQ(t.seen[0], e);
  EXPECT_LT(since(t.t_fail), 5.0);
}

INSTANTIATE_TEST_SUITE_P(Modes, DistLaunchGpuFail,
                         ::testing::Values(std::make_tuple("revoke", true), std::make_tuple("abort", true),
                                           std::make_tuple("revoke", false)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) + (std::get<1>(info.param) ? "_warm" : "_cold");
                         });

TEST(DistLaunchGpu, MultiProcessAllReduce) {
  REQUIRE_2_GPUS();
  double elapsed = 0;
  auto p = run_ranks(2, "allreduce", {{"WAN_DIST_GPU_SEED", std::to_string(fresh_seed())}}, 90, &elapsed);
  printf("multi-process launch, 2 ranks (process start, CUDA + NCCL init, all-reduces): %.2f s\n", elapsed);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(p[r].code, 0) << describe(p);
    ASSERT_EQ(p[r].out.rfind("ok ", 0), 0u) << describe(p);
    EXPECT_LT(std::stod(p[r].out.substr(3)), 1e-4) << describe(p);
  }
}

TEST(DistLaunchGpu, MultiProcessRankThrows) {
  REQUIRE_2_GPUS();
  double elapsed = 0;
  auto p = run_ranks(2, "fail", {{"WAN_DIST_FAIL_RANK", "1"}, {"WAN_DIST_FAIL_AT", "after_barrier"}}, 90, &elapsed);
  printf("multi-process, rank 1 throws while rank 0 is in an all-reduce: all ended after %.2f s\n", elapsed);
  const std::string want = "error: rank 1: forced failure at 'after_barrier' (WAN_DIST_FAIL_RANK=1)";
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(p[r].out, want) << describe(p);
    EXPECT_EQ(p[r].code, 1) << describe(p);
  }
  EXPECT_LT(elapsed, 30.0);
}

TEST(DistLaunchGpu, MultiProcessRankDies) {
  REQUIRE_2_GPUS();
  double elapsed = 0;
  auto p = run_ranks(2, "fail",
                     {{"WAN_DIST_FAIL_RANK", "1"},
                      {"WAN_DIST_FAIL_AT", "after_barrier"},
                      {"WAN_DIST_FAIL_MODE", "exit"}},
                     90, &elapsed);
  printf("multi-process, rank 1 dies while rank 0 is in an all-reduce: all ended after %.2f s\n", elapsed);
  EXPECT_EQ(p[1].code, 3) << describe(p);
  EXPECT_EQ(p[0].out, "error: lost peer rank 1: its connection closed (the process exited, crashed or was killed)")
      << describe(p);
  EXPECT_EQ(p[0].code, 1);
  EXPECT_LT(elapsed, 30.0);
}

TEST(DistLaunchGpu, MultiProcessHangWatchdog) {
  REQUIRE_2_GPUS();
  double elapsed = 0;
  auto p = run_ranks(2, "fail",
                     {{"WAN_DIST_FAIL_RANK", "1"},
                      {"WAN_DIST_FAIL_AT", "after_barrier"},
                      {"WAN_DIST_FAIL_MODE", "hang"},
                      {"WAN_DIST_TIMEOUT", "6"}},
                     90, &elapsed);
  printf("multi-process, rank 1 hangs while rank 0 is in an all-reduce (WAN_DIST_TIMEOUT=6): all ended after %.2f s\n",
         elapsed);
  EXPECT_EQ(p[0].out, p[1].out) << describe(p);
  EXPECT_NE(p[0].out.find(": no progress for 6 s (hang watchdog"), std::string::npos) << describe(p);
  EXPECT_LT(elapsed, 40.0);
}

#endif  // WAN_HAVE_NCCL
