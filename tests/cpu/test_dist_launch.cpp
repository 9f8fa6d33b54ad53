// Rank launching without GPUs (issue 5, items 1 and 4): launcher environment parsing, the TCP
// rendezvous and control channel with threads and with forked processes, and failure propagation
// through launch() with host-only ranks (LaunchOptions::nccl = false): a throwing rank, two ranks
// failing at once, a SIGKILLed rank (lost peer), a hang (watchdog), a barrier mismatch, and a rank
// that ignores the abort (the process exits after the grace period). Every wait is bounded: a child
// process still running after its limit is killed and the test fails.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "runtime/dist/launch.h"
#include "runtime/dist/rendezvous.h"
#include "dist_test_util.h"
#include "test_util.h"

using namespace wan;
using namespace wan::dist;

namespace {

using test::error_of;
using test::EnvGuard;
using test::random_blob;
using test::host_ranks;
using test::lookup;
using test::since;

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// Loops for up to `limit_s` seconds, checking for a failure elsewhere (throws it).
void wait_for_abort(const RankContext& ctx, double limit_s = 20) {
  const auto t0 = Clock::now();
  while (since(t0) < limit_s) {
    ctx.check_abort();
    sleep_ms(10);
  }
}

struct Child {
  int code = -1;  // exit code, or 128 + signal
  std::string out;
};

// Runs body(i) in n forked processes (i = 0..n-1). Each child writes what body returns, or
// "error: <message>" if it throws, to a file and exits (0, or 2 / 1 by error kind). Children still
// running after limit_s are killed (and the test fails).
std::vector<Child> run_procs(int n, double limit_s, const std::function<std::string(int)>& body,
                             double* elapsed = nullptr) {
  test::TempDir dir("dist");
  std::vector<pid_t> pids;
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      std::string out;
      int code = 0;
      try {
        out = body(i);
      } catch (const Error& e) {
        out = std::string("error: ") + e.what();
        code = e.kind() == ErrorKind::BadInput ? 2 : 1;
      } catch (const std::exception& e) {
        out = std::string("exception: ") + e.what();
        code = 1;
      }
      std::ofstream(dir.file("out" + std::to_string(i))) << out;
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<Child> res(n);
  std::vector<bool> done(n, false);
  int left = n;
  while (left > 0) {
    for (int i = 0; i < n; ++i) {
      if (done[i]) continue;
      int st = 0;
      if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        done[i] = true;
        --left;
        res[i].code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
    }
    if (left > 0 && since(t0) > limit_s) {
      for (int i = 0; i < n; ++i)
        if (!done[i]) {
          kill(pids[i], SIGKILL);
          waitpid(pids[i], nullptr, 0);
          ADD_FAILURE() << "child " << i << " still running after " << limit_s << " s (hang)";
        }
      break;
    }
    sleep_ms(5);
  }
  if (elapsed) *elapsed = since(t0);
  for (int i = 0; i < n; ++i) {
    std::ifstream f(dir.file("out" + std::to_string(i)));
    std::stringstream ss;
    ss << f.rdbuf();
    res[i].out = ss.str();
  }
  return res;
}

// A child of a multi-process launch: its launcher environment (WAN_*), then launch(fn).
std::string launch_child(int rank, int world, int port, const std::function<void(RankContext&)>& fn,
                         const std::map<std::string, std::string>& extra = {}) {
  setenv("WAN_RANK", std::to_string(rank).c_str(), 1);
  setenv("WAN_WORLD_SIZE", std::to_string(world).c_str(), 1);
  setenv("WAN_LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("WAN_MASTER_ADDR", "127.0.0.1", 1);
  setenv("WAN_MASTER_PORT", std::to_string(port).c_str(), 1);
  for (const auto& [k, v] : extra) setenv(k.c_str(), v.c_str(), 1);
  LaunchOptions opt;
  opt.nccl = false;
  launch(opt, fn);
  return "ok";
}


}  // namespace

// ---------------------------------------------------------------------------------------------------
// Environment and options

TEST(DistEnv, NoLauncher) {
  std::map<std::string, std::string> m{{"HOME", "/root"}, {"SLURM_PROCID", "0"}};  // srun var, no task count
  EXPECT_FALSE(parse_launcher_env(lookup(m)).has_value());
}

TEST(DistEnv, Wan) {
  std::map<std::string, std::string> m{{"WAN_RANK", "1"},          {"WAN_WORLD_SIZE", "4"},
                                       {"WAN_LOCAL_RANK", "1"},    {"WAN_MASTER_ADDR", "node7"},
                                       {"WAN_MASTER_PORT", "4321"}, {"WAN_JOB_ID", "j42"}};
  auto e = parse_launcher_env(lookup(m));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->source, "WAN");
  EXPECT_EQ(e->rank, 1);
  EXPECT_EQ(e->world, 4);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->master_addr, "node7");
  EXPECT_EQ(e->master_port, 4321);
  EXPECT_EQ(e->job, "j42");
}

TEST(DistEnv, OpenMpi) {
  std::map<std::string, std::string> m{{"OMPI_COMM_WORLD_RANK", "5"},       {"OMPI_COMM_WORLD_SIZE", "8"},
                                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                       {"MASTER_ADDR", "10.0.0.1"},         {"OMPI_MCA_ess_base_jobid", "777"}};
  auto e = parse_launcher_env(lookup(m));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->source, "OMPI");
  EXPECT_EQ(e->rank, 5);
  EXPECT_EQ(e->world, 8);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->master_addr, "10.0.0.1");
  EXPECT_EQ(e->master_port, 29517);  // default
  EXPECT_EQ(e->job, "777");
  // Two nodes and no address: none guessed.
  m.erase("MASTER_ADDR");
  EXPECT_EQ(parse_launcher_env(lookup(m))->master_addr, "");
  // One node (local size == world): loopback.
  m["OMPI_COMM_WORLD_LOCAL_SIZE"] = "8";
  EXPECT_EQ(parse_launcher_env(lookup(m))->master_addr, "127.0.0.1");
  // WAN_LOCAL_RANK overrides the launcher's local rank.
  m["WAN_LOCAL_RANK"] = "3";
  EXPECT_EQ(parse_launcher_env(lookup(m))->local_rank, 3);
}

TEST(DistEnv, Pmi) {
  std::map<std::string, std::string> m{
      {"PMI_RANK", "2"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "0"}, {"MASTER_PORT", "4000"}, {"MASTER_ADDR", "h"}};
  auto e = parse_launcher_env(lookup(m));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->source, "PMI");
  EXPECT_EQ(e->rank, 2);
  EXPECT_EQ(e->world, 4);
  EXPECT_EQ(e->local_rank, 0);
  EXPECT_EQ(e->master_port, 4000);
  m.erase("MPI_LOCALRANKID");
  m["PMI_LOCAL_RANK"] = "1";
  EXPECT_EQ(parse_launcher_env(lookup(m))->local_rank, 1);
  m.erase("PMI_LOCAL_RANK");
  EXPECT_NE(error_of([&] { parse_launcher_env(lookup(m)); }).find("gives no local rank (set WAN_LOCAL_RANK)"),
            std::string::npos);
}

TEST(DistEnv, Slurm) {
  std::map<std::string, std::string> m{{"SLURM_PROCID", "6"},         {"SLURM_NTASKS", "16"},
                                       {"SLURM_STEP_NUM_TASKS", "8"}, {"SLURM_LOCALID", "2"},
                                       {"SLURM_STEP_NUM_NODES", "1"}, {"SLURM_JOB_ID", "123"},
                                       {"SLURM_STEP_ID", "0"}};
  auto e = parse_launcher_env(lookup(m));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->source, "SLURM");
  EXPECT_EQ(e->rank, 6);
  EXPECT_EQ(e->world, 8);  // the step's task count wins over the allocation's
  EXPECT_EQ(e->local_rank, 2);
  EXPECT_EQ(e->master_addr, "127.0.0.1");
  EXPECT_EQ(e->job, "123.0");
  m["SLURM_STEP_NUM_NODES"] = "2";
  EXPECT_EQ(parse_launcher_env(lookup(m))->master_addr, "");
}

TEST(DistEnv, Precedence) {
  std::map<std::string, std::string> m{{"WAN_RANK", "0"}, {"WAN_WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_RANK", "3"},
                                       {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}};
  auto e = parse_launcher_env(lookup(m));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->source, "WAN");
  EXPECT_EQ(e->world, 1);
  EXPECT_EQ(e->master_addr, "127.0.0.1");  // world 1: nothing to reach
}

TEST(DistEnv, BadValues) {
  auto err = [](std::map<std::string, std::string> m) { return error_of([&] { parse_launcher_env(lookup(m)); }); };
  EXPECT_EQ(err({{"WAN_RANK", "abc"}, {"WAN_WORLD_SIZE", "2"}, {"WAN_LOCAL_RANK", "0"}}),
            "WAN_RANK='abc' is not an integer");
  EXPECT_EQ(err({{"WAN_RANK", "2"}, {"WAN_WORLD_SIZE", "2"}, {"WAN_LOCAL_RANK", "0"}}),
            "WAN_RANK=2 is outside 0..1 (WAN_WORLD_SIZE=2)");
  EXPECT_EQ(err({{"WAN_RANK", "0"}, {"WAN_WORLD_SIZE", "0"}}), "WAN_WORLD_SIZE=0: expected 1..65536");
  EXPECT_EQ(err({{"WAN_RANK", "0"}}), "WAN_RANK is set but WAN_WORLD_SIZE is not");
  EXPECT_EQ(err({{"WAN_WORLD_SIZE", "2"}}), "WAN_WORLD_SIZE is set but WAN_RANK is not");
  EXPECT_EQ(err({{"WAN_RANK", "0"}, {"WAN_WORLD_SIZE", "2"}, {"WAN_LOCAL_RANK", "-1"}}),
            "WAN_LOCAL_RANK=-1 is outside 0..1");
  EXPECT_EQ(err({{"WAN_RANK", "0"}, {"WAN_WORLD_SIZE", "2"}, {"WAN_LOCAL_RANK", "0"}, {"WAN_MASTER_PORT", "70000"}}),
            "WAN_MASTER_PORT='70000' is not a TCP port (1..65535)");
  EXPECT_EQ(err({{"WAN_RANK", "0"}, {"WAN_WORLD_SIZE", "2"}, {"WAN_LOCAL_RANK", "0"}, {"MASTER_PORT", "12x"}}),
            "MASTER_PORT='12x' is not a TCP port (1..65535)");
  EXPECT_EQ(err({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", " 2"}}),
            "OMPI_COMM_WORLD_SIZE=' 2' is not an integer");
}

TEST(DistOptions, GpusAndDevices) {
  EXPECT_EQ(parse_launch_options("3", "").devices, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(parse_launch_options("", "2,0,5").devices, (std::vector<int>{2, 0, 5}));
  EXPECT_TRUE(parse_launch_options("", "").devices.empty());
  EXPECT_EQ(error_of([] { parse_launch_options("2", "0,1"); }), "--gpus and --devices cannot be given together");
  EXPECT_EQ(error_of([] { parse_launch_options("0", ""); }), "--gpus 0: expected 1..1024");
  EXPECT_EQ(error_of([] { parse_launch_options("two", ""); }), "--gpus='two' is not an integer");
  EXPECT_EQ(error_of([] { parse_launch_options("", "1,1"); }), "--devices: device 1 is listed twice");
  EXPECT_EQ(error_of([] { parse_launch_options("", "1,,2"); }), "--devices '1,,2': empty entry (expected e.g. 0,1,2)");
  EXPECT_EQ(error_of([] { parse_launch_options("", "0,"); }), "--devices '0,': empty entry (expected e.g. 0,1,2)");
  EXPECT_EQ(error_of([] { parse_launch_options("", "-1"); }), "--devices: device -1 is out of range");
}

TEST(DistOptions, BadTimeoutEnv) {
  EnvGuard g;
  g.set("WAN_DIST_TIMEOUT", "soon");
  EXPECT_EQ(error_of([] { launch(host_ranks(2), [](RankContext&) {}); }),
            "WAN_DIST_TIMEOUT='soon' is not a positive number of seconds");
}

TEST(DistOptions, MissingMasterAddress) {
  EnvGuard g;
  g.set("WAN_RANK", "1");
  g.set("WAN_WORLD_SIZE", "2");
  g.set("WAN_LOCAL_RANK", "0");
  EXPECT_TRUE(launcher_environment());
  const std::string e = error_of([] { launch(host_ranks(0), [](RankContext&) {}); });
  EXPECT_NE(e.find("needs rank 0's address: set WAN_MASTER_ADDR"), std::string::npos) << e;
}

#ifndef WAN_HAVE_NCCL
TEST(DistOptions, NcclNeedsNcclBuild) {
  LaunchOptions o;
  EXPECT_EQ(error_of([&] { launch(o, [](RankContext&) {}); }),
            "this build has no NCCL: multi-GPU runs need a build with CUDA and NCCL");
}
#endif

// ---------------------------------------------------------------------------------------------------
// Rendezvous and control channel

TEST(DistRendezvous, ThreadsExchangeBlobAndBarrier) {
  const int n = 4, port = free_tcp_port();
  const std::vector<uint8_t> blob = random_blob(128);
  std::vector<std::vector<uint8_t>> got(n);
  std::vector<std::string> errs(n);
  std::vector<int> barriers(n, 0);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        RendezvousConfig c{"127.0.0.1", port, r, n, "job", 10.0, 10.0};
        auto ch = ControlChannel::open(c, r == 0 ? blob : std::vector<uint8_t>{});
        got[r] = ch->blob();
        for (int k = 0; k < 5; ++k) barriers[r] += ch->barrier(k == 4) ? 1 : 0;
        ch->close();
      } catch (const Error& e) {
        errs[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errs[r], "") << "rank " << r;
    EXPECT_EQ(got[r], blob) << "rank " << r;
    EXPECT_EQ(barriers[r], 5) << "rank " << r;
  }
}

TEST(DistRendezvous, ProcessesExchangeBlob) {
  const int n = 4, port = free_tcp_port();
  const std::vector<uint8_t> blob = random_blob(128);
  auto res = run_procs(n, 20, [&](int r) {
    RendezvousConfig c{"127.0.0.1", port, r, n, "", 10.0, 10.0};
    auto ch = ControlChannel::open(c, r == 0 ? blob : std::vector<uint8_t>{});
    if (!ch->barrier(true)) return std::string("barrier failed");
    std::string hex;
    for (uint8_t b : ch->blob()) hex += std::to_string(b) + ",";
    ch->close();
    return hex;
  });
  std::string want;
  for (uint8_t b : blob) want += std::to_string(b) + ",";
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(res[r].code, 0) << res[r].out;
    EXPECT_EQ(res[r].out, want) << "rank " << r;
  }
}

TEST(DistRendezvous, FailureReachesEveryRank) {
  const int n = 3, port = free_tcp_port();
  std::vector<std::string> seen(n);
  std::vector<double> secs(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      RendezvousConfig c{"127.0.0.1", port, r, n, "", 10.0, 10.0};
      std::atomic<int> calls{0};
      auto ch = ControlChannel::open(c, {}, [&](const Failure&) { ++calls; });
      EXPECT_TRUE(ch->barrier());
      const auto t0 = Clock::now();
      if (r == 2) ch->report_failure({"rank 2: disk on fire", ErrorKind::BadInput});
      auto v = ch->wait_verdict(5.0);
      secs[r] = since(t0);
      seen[r] = v ? v->message + (v->kind == ErrorKind::BadInput ? " [bad input]" : " [internal]") : "(none)";
      EXPECT_FALSE(ch->barrier());  // a barrier after the verdict returns at once
      ch->close();
      EXPECT_EQ(calls.load(), 1);
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(seen[r], "rank 2: disk on fire [bad input]") << "rank " << r;
    EXPECT_LT(secs[r], 2.0) << "rank " << r;
  }
}

TEST(DistRendezvous, WrongWorldSize) {
  const int port = free_tcp_port();
  std::string e0, e1;
  std::thread t0([&] {
    e0 = error_of([&] { ControlChannel::open({"127.0.0.1", port, 0, 3, "", 10.0, 10.0}, random_blob(128)); });
  });
  std::thread t1([&] { e1 = error_of([&] { ControlChannel::open({"127.0.0.1", port, 1, 2, "", 10.0, 10.0}, {}); }); });
  t0.join();
  t1.join();
  EXPECT_EQ(e0, "rendezvous: rank 1 was started with world size 2 but rank 0 with 3 (the launcher's variables "
                "differ between processes)");
  EXPECT_EQ(e1, e0);
}

TEST(DistRendezvous, DuplicateRank) {
  const int port = free_tcp_port();
  std::string e[3];
  auto join_as = [&](int slot, int rank) {
    e[slot] = error_of([&] { ControlChannel::open({"127.0.0.1", port, rank, 3, "", 10.0, 10.0}, {}); });
  };
  std::thread t0(join_as, 0, 0), t1(join_as, 1, 1);
  sleep_ms(300);
  std::thread t2(join_as, 2, 1);  // a second process claiming rank 1
  t0.join();
  t1.join();
  t2.join();
  const std::string want = "rendezvous: two processes claim rank 1 (world size 3)";
  EXPECT_EQ(e[0], want);
  EXPECT_EQ(e[1], want);
  EXPECT_EQ(e[2], want);
}

TEST(DistRendezvous, TimeoutNamesMissingRanks) {
  const int port = free_tcp_port();
  std::string e0, e1;
  const auto t = Clock::now();
  std::thread t0([&] { e0 = error_of([&] { ControlChannel::open({"127.0.0.1", port, 0, 4, "", 1.0, 10.0}, {}); }); });
  std::thread t1([&] { e1 = error_of([&] { ControlChannel::open({"127.0.0.1", port, 2, 4, "", 1.0, 10.0}, {}); }); });
  t0.join();
  t1.join();
  EXPECT_LT(since(t), 4.0);
  EXPECT_NE(e0.find("rendezvous: timed out after 1 s: rank 0 (port "), std::string::npos) << e0;
  EXPECT_NE(e0.find("heard from 1 of 3 ranks; missing ranks 1, 3"), std::string::npos) << e0;
  EXPECT_EQ(e1, e0);  // the connected rank gets rank 0's message
}

TEST(DistRendezvous, NoRankZero) {
  const int port = free_tcp_port();
  const auto t = Clock::now();
  const std::string e = error_of([&] { ControlChannel::open({"127.0.0.1", port, 1, 2, "", 1.0, 10.0}, {}); });
  EXPECT_LT(since(t), 3.0);
  EXPECT_NE(e.find("rendezvous: timed out after 1 s: rank 1 cannot reach rank 0 at 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << e;
}

TEST(DistRendezvous, PortInUse) {
  // Another program holds the port (listening, never answering).
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 8), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  const auto t = Clock::now();
  const std::string e0 = error_of([&] { ControlChannel::open({"127.0.0.1", port, 0, 2, "", 5.0, 10.0}, {}); });
  EXPECT_LT(since(t), 1.0);
  EXPECT_EQ(e0, "rendezvous: rank 0 cannot listen on TCP port " + std::to_string(port) +
                    ": address already in use (another job or program holds WAN_MASTER_PORT=" + std::to_string(port) +
                    "; choose a free port)");
  // A rank > 0 that reaches the other program gets no answer: a bounded, clear error.
  const std::string e1 = error_of([&] { ControlChannel::open({"127.0.0.1", port, 1, 2, "", 1.0, 10.0}, {}); });
  EXPECT_LT(since(t), 4.0);
  EXPECT_NE(e1.find("connected to 127.0.0.1:" + std::to_string(port) + " but got no answer"), std::string::npos) << e1;
  close(fd);
}

TEST(DistRendezvous, OtherJobIsRefused) {
  const int port = free_tcp_port();
  std::string e0, e1;
  std::thread t0([&] { e0 = error_of([&] { ControlChannel::open({"127.0.0.1", port, 0, 2, "A", 1.5, 10.0}, {}); }); });
  std::thread t1([&] { e1 = error_of([&] { ControlChannel::open({"127.0.0.1", port, 1, 2, "B", 1.5, 10.0}, {}); }); });
  t0.join();
  t1.join();
  EXPECT_EQ(e1, "rendezvous: rank 0 at port " + std::to_string(port) + " belongs to job 'A', not 'B'");
  EXPECT_NE(e0.find("missing rank 1"), std::string::npos) << e0;  // rank 0 kept waiting for its own rank 1
}

TEST(DistRendezvous, BadAddress) {
  const std::string e = error_of([] { ControlChannel::open({"no-such-host.invalid", 5000, 1, 2, "", 2.0, 10.0}, {}); });
  EXPECT_NE(e.find("rendezvous: cannot resolve rank 0's address 'no-such-host.invalid' (WAN_MASTER_ADDR)"),
            std::string::npos)
      << e;
}

TEST(DistRendezvous, LostPeerProcess) {
  // Rank 2 is SIGKILLed after the rendezvous: the others get "lost peer rank 2" within a second or two.
  const int n = 3, port = free_tcp_port();
  double elapsed = 0;
  auto res = run_procs(
      n, 20,
      [&](int r) -> std::string {
        RendezvousConfig c{"127.0.0.1", port, r, n, "", 10.0, 10.0};
        auto ch = ControlChannel::open(c, {});
        if (!ch->barrier()) return "barrier failed";
        if (r == 2) raise(SIGKILL);
        auto v = ch->wait_verdict(15.0);
        ch->close();
        return v ? v->message : "(no verdict)";
      },
      &elapsed);
  EXPECT_EQ(res[2].code, 128 + SIGKILL);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(res[r].code, 0);
    EXPECT_EQ(res[r].out, "lost peer rank 2: its connection closed (the process exited, crashed or was killed)")
        << "rank " << r;
  }
  EXPECT_LT(elapsed, 5.0);
}

// ---------------------------------------------------------------------------------------------------
// launch(): in-process (threads)

TEST(DistLaunchThreads, RanksAndBarriers) {
  std::mutex mu;
  std::vector<std::string> seen;
  std::atomic<int> counter{0};
  launch(host_ranks(3), [&](RankContext& ctx) {
    EXPECT_TRUE(ctx.in_process);
    EXPECT_EQ(ctx.world, 3);
    EXPECT_EQ(ctx.device, ctx.rank);
    EXPECT_EQ(ctx.local_rank, ctx.rank);
    for (int k = 0; k < 10; ++k) {
      ++counter;
      ctx.barrier();
      EXPECT_EQ(counter.load(), 3 * (k + 1));  // nobody passes before all arrived
      ctx.barrier();
    }
    std::lock_guard<std::mutex> lk(mu);
    seen.push_back(std::to_string(ctx.rank));
  });
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::string>{"0", "1", "2"}));
}

TEST(DistLaunchThreads, OneRankThrowsAllSeeIt) {
  std::vector<std::string> seen(3);
  std::string final_msg;
  ErrorKind kind = ErrorKind::Internal;
  const auto t0 = Clock::now();
  try {
    launch(host_ranks(3), [&](RankContext& ctx) {
      try {
        ctx.barrier();
        if (ctx.rank == 1) WAN_THROW("prompt file 'x.txt' not found");
        wait_for_abort(ctx);
      } catch (const Error& e) {
        seen[ctx.rank] = e.what();
        throw;
      }
    });
  } catch (const Error& e) {
    final_msg = e.what();
    kind = e.kind();
  }
  EXPECT_LT(since(t0), 3.0);
  EXPECT_EQ(final_msg, "rank 1: prompt file 'x.txt' not found");
  EXPECT_EQ(kind, ErrorKind::BadInput);  // the failing rank's kind travels with it
  EXPECT_EQ(seen[0], final_msg);
  EXPECT_EQ(seen[2], final_msg);
}

TEST(DistLaunchThreads, BadAllocBecomesOutOfMemory) {
  const std::string e = error_of([] {
    launch(host_ranks(2), [](RankContext& ctx) {
      if (ctx.rank == 0) throw std::bad_alloc();
      wait_for_abort(ctx);
    });
  });
  EXPECT_EQ(e, "rank 0: out of host memory");
}

TEST(DistLaunchThreads, ForcedFailureAtNamedPoint) {
  for (const char* at : {"init", "start", "step"}) {
    EnvGuard g;
    g.set("WAN_DIST_FAIL_RANK", "2");
    g.set("WAN_DIST_FAIL_AT", at);
    std::atomic<int> steps{0};
    const std::string e = error_of([&] {
      launch(host_ranks(3), [&](RankContext& ctx) {
        ctx.barrier();
        for (int k = 0; k < 100; ++k) {
          maybe_fail(ctx, "step");
          ++steps;
          ctx.barrier();
        }
      });
    });
    EXPECT_EQ(e, std::string("rank 2: forced failure at '") + at + "' (WAN_DIST_FAIL_RANK=2)");
    EXPECT_LT(steps.load(), 3) << at;
  }
}

TEST(DistLaunchThreads, HangWatchdog) {
  EnvGuard g;
  g.set("WAN_DIST_FAIL_RANK", "1");
  g.set("WAN_DIST_FAIL_AT", "work");
  g.set("WAN_DIST_FAIL_MODE", "hang");
  LaunchOptions o = host_ranks(3);
  o.timeout_s = 1.0;
  const auto t0 = Clock::now();
  const std::string e = error_of([&] {
    launch(o, [&](RankContext& ctx) {
      maybe_fail(ctx, "work");
      ctx.barrier();  // the others wait here (alive) while rank 1 hangs
    });
  });
  EXPECT_EQ(e, "rank 1: no progress for 1 s (hang watchdog, WAN_DIST_TIMEOUT; a peer may be stuck or the ranks' "
               "collectives do not match)");
  EXPECT_LT(since(t0), 3.0);
}

TEST(DistLaunchThreads, BarrierCountMismatch) {
  const auto t0 = Clock::now();
  const std::string e = error_of([] {
    launch(host_ranks(2), [](RankContext& ctx) {
      ctx.barrier();
      if (ctx.rank == 0) ctx.barrier();
    });
  });
  EXPECT_EQ(e, "rank 0: waits in a barrier that rank 1 (finished) never reaches: the ranks called barrier() a "
               "different number of times");
  EXPECT_LT(since(t0), 2.0);
}

TEST(DistLaunchThreads, StuckRankEndsTheProcessAfterGrace) {
  // Rank 1 ignores the failure; WAN_DIST_ABORT_GRACE=1 s later the process prints the error and exits.
  test::TempDir dir("grace");
  const std::string err_file = dir.file("stderr");
  double elapsed = 0;
  auto res = run_procs(
      1, 20,
      [&](int) -> std::string {
        if (!freopen(err_file.c_str(), "w", stderr)) return "freopen failed";
        setenv("WAN_DIST_ABORT_GRACE", "1", 1);
        launch(host_ranks(2), [](RankContext& ctx) {
          ctx.barrier();
          if (ctx.rank == 1) sleep_ms(15000);  // never checks
          sleep_ms(200);
          WAN_THROW_INTERNAL("device lost");
        });
        return "returned";
      },
      &elapsed);
  EXPECT_EQ(res[0].code, 1);
  EXPECT_LT(elapsed, 4.0);
  std::ifstream f(err_file);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(ss.str().find("error: rank 0: device lost ("), std::string::npos) << ss.str();
}

// ---------------------------------------------------------------------------------------------------
// launch(): one process per rank (WAN_RANK environment, TCP rendezvous, control channel)

TEST(DistLaunchProcs, Success) {
  const int n = 3, port = free_tcp_port();
  auto res = run_procs(n, 30, [&](int r) {
    std::string info;
    launch_child(r, n, port, [&](RankContext& ctx) {
      for (int k = 0; k < 20; ++k) ctx.barrier();
      info = std::to_string(ctx.rank) + "/" + std::to_string(ctx.world) + "/" + std::to_string(ctx.local_rank) +
             (ctx.in_process ? " in-process" : " multi-process");
    });
    return info;
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(res[r].code, 0) << res[r].out;
    EXPECT_EQ(res[r].out, std::to_string(r) + "/3/" + std::to_string(r) + " multi-process");
  }
}

TEST(DistLaunchProcs, OneThrowsAllGetTheSameError) {
  const int n = 4, port = free_tcp_port();
  double elapsed = 0;
  auto res = run_procs(
      n, 30,
      [&](int r) {
        return launch_child(r, n, port, [&](RankContext& ctx) {
          ctx.barrier();
          if (ctx.rank == 2) WAN_THROW("latents file has 3 frames, expected 21");
          wait_for_abort(ctx);
        });
      },
      &elapsed);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(res[r].out, "error: rank 2: latents file has 3 frames, expected 21") << "rank " << r;
    EXPECT_EQ(res[r].code, 2) << "rank " << r;  // bad input on every rank
  }
  EXPECT_LT(elapsed, 6.0);
}

TEST(DistLaunchProcs, TwoFailAtOnceOneVerdict) {
  const int n = 4, port = free_tcp_port();
  auto res = run_procs(n, 30, [&](int r) {
    return launch_child(r, n, port, [&](RankContext& ctx) {
      ctx.barrier();
      if (ctx.rank == 1 || ctx.rank == 3) WAN_THROW_INTERNAL("out of device memory on rank ", ctx.rank);
      wait_for_abort(ctx);
    });
  });
  const std::string v = res[0].out;
  EXPECT_TRUE(v.rfind("error: rank 1: out of device memory on rank 1", 0) == 0 ||
              v.rfind("error: rank 3: out of device memory on rank 3", 0) == 0)
      << v;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(res[r].out, v) << "rank " << r;
    EXPECT_EQ(res[r].code, 1) << "rank " << r;
  }
}

TEST(DistLaunchProcs, KilledPeerIsLost) {
  for (int victim : {2, 0}) {
    const int n = 3, port = free_tcp_port();
    double elapsed = 0;
    auto res = run_procs(
        n, 30,
        [&](int r) {
          return launch_child(r, n, port, [&](RankContext& ctx) {
            ctx.barrier();
            if (ctx.rank == victim) raise(SIGKILL);
            wait_for_abort(ctx);
          });
        },
        &elapsed);
    EXPECT_EQ(res[victim].code, 128 + SIGKILL);
    for (int r = 0; r < n; ++r) {
      if (r == victim) continue;
      EXPECT_EQ(res[r].out, "error: lost peer rank " + std::to_string(victim) +
                                ": its connection closed (the process exited, crashed or was killed)")
          << "rank " << r << " victim " << victim;
      EXPECT_EQ(res[r].code, 1);
    }
    EXPECT_LT(elapsed, 6.0) << "victim " << victim;
  }
}

TEST(DistLaunchProcs, FrozenPeerIsLostByHeartbeat) {
  // Rank 2 stops (SIGSTOP: its socket stays open, nothing is sent): the heartbeat timeout finds it.
  const int n = 3, port = free_tcp_port();
  test::TempDir dir("frozen");
  const std::string pid_file = dir.file("pid2");
  double elapsed = 0;
  auto res = run_procs(
      n, 30,
      [&](int r) {
        return launch_child(r, n, port, [&](RankContext& ctx) {
          ctx.barrier();
          if (ctx.rank == 2) {
            std::ofstream(pid_file) << getpid();
            raise(SIGSTOP);
          }
          try {
            wait_for_abort(ctx);
          } catch (const Error&) {
            if (ctx.rank == 0) {  // the stopped rank would never exit by itself
              std::ifstream f(pid_file);
              pid_t p = 0;
              if (f >> p && p > 0) kill(p, SIGKILL);
            }
            throw;
          }
        }, {{"WAN_DIST_PEER_TIMEOUT", "1.5"}});
      },
      &elapsed);
  EXPECT_EQ(res[2].code, 128 + SIGKILL);
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(res[r].out, "error: lost peer rank 2: no heartbeat for more than 1.5 s (process or host frozen, or "
                          "network down; WAN_DIST_PEER_TIMEOUT)")
        << "rank " << r;
  EXPECT_LT(elapsed, 8.0);
}

TEST(DistLaunchProcs, CrashViaFailModeExit) {
  const int n = 2, port = free_tcp_port();
  auto res = run_procs(n, 30, [&](int r) {
    return launch_child(r, n, port, [&](RankContext& ctx) {
      ctx.barrier();
      maybe_fail(ctx, "step");
      wait_for_abort(ctx);
    }, {{"WAN_DIST_FAIL_RANK", "1"}, {"WAN_DIST_FAIL_AT", "step"}, {"WAN_DIST_FAIL_MODE", "exit"}});
  });
  EXPECT_EQ(res[1].code, 3);
  EXPECT_EQ(res[0].out, "error: lost peer rank 1: its connection closed (the process exited, crashed or was killed)");
}

TEST(DistLaunchProcs, HangWatchdog) {
  const int n = 3, port = free_tcp_port();
  double elapsed = 0;
  auto res = run_procs(
      n, 30,
      [&](int r) {
        return launch_child(r, n, port, [&](RankContext& ctx) {
          maybe_fail(ctx, "work");
          ctx.barrier();
        }, {{"WAN_DIST_FAIL_RANK", "1"}, {"WAN_DIST_FAIL_AT", "work"}, {"WAN_DIST_FAIL_MODE", "hang"},
            {"WAN_DIST_TIMEOUT", "1.5"}});
      },
      &elapsed);
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(res[r].out, "error: rank 1: no progress for 1.5 s (hang watchdog, WAN_DIST_TIMEOUT; a peer may be "
                          "stuck or the ranks' collectives do not match)")
        << "rank " << r;
  EXPECT_LT(elapsed, 6.0);
}

TEST(DistLaunchProcs, WrongWorldSizeInEnvironment) {
  const int port = free_tcp_port();
  auto res = run_procs(2, 30, [&](int r) {
    return launch_child(r, r == 0 ? 3 : 2, port, [](RankContext&) {}, {{"WAN_DIST_TIMEOUT", "3"}});
  });
  const std::string want = "error: rendezvous: rank 1 was started with world size 2 but rank 0 with 3 (the launcher's "
                           "variables differ between processes)";
  EXPECT_EQ(res[0].out, want);
  EXPECT_EQ(res[1].out, want);
  EXPECT_EQ(res[0].code, 2);
}
