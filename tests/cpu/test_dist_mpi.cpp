// The bootstrap of multi-process launches (src/runtime/dist/bootstrap.h), without GPUs:
//  - DistBootstrap.*: WAN_BOOTSTRAP parsing, MPI launcher detection and the choice, the message rank 0
//    sends, rank 0's addresses, the control channel on a pre-bound port and on a list of candidate
//    addresses. Plain tests.
//  - MpiRanks.*: run by CTest under `mpirun -np 2` and `-np 4` (builds with MPI): the exchange of a
//    128-byte id and rank 0's control address through MPI, checked against the same id sent over the
//    control channel; launch() with no WAN_MASTER_* set. They skip outside an MPI launch.
//  - MpiJob.*: plain tests that start `mpirun -np N` on MpiChild.Run (this binary) with a time limit
//    and read every rank's outcome: a rank failing before the exchange, a rank failing in fn, a rank
//    stuck or dead before the exchange, WAN_BOOTSTRAP=tcp under mpirun. Every rank must end with the
//    same one error, and nothing may hang.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "runtime/dist/bootstrap.h"
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

const EnvLookup process_env = [](const char* n) { return std::getenv(n); };


}  // namespace

// ---------------------------------------------------------------------------------------------------
// Choice of the bootstrap (no mpirun)

TEST(DistBootstrap, ParseWanBootstrap) {
  std::map<std::string, std::string> m;
  EXPECT_EQ(parse_bootstrap(lookup(m), true), BootstrapKind::Auto);
  m["WAN_BOOTSTRAP"] = "";
  EXPECT_EQ(parse_bootstrap(lookup(m), false), BootstrapKind::Auto);
  m["WAN_BOOTSTRAP"] = "auto";
  EXPECT_EQ(parse_bootstrap(lookup(m), true), BootstrapKind::Auto);
  m["WAN_BOOTSTRAP"] = "tcp";
  EXPECT_EQ(parse_bootstrap(lookup(m), false), BootstrapKind::Tcp);
  m["WAN_BOOTSTRAP"] = "mpi";
  EXPECT_EQ(parse_bootstrap(lookup(m), true), BootstrapKind::Mpi);
  EXPECT_EQ(error_of([&] { parse_bootstrap(lookup(m), false); }),
            "WAN_BOOTSTRAP=mpi: this wan was built without MPI (install an MPI, e.g. Debian's libopenmpi-dev, and "
            "configure again; or use WAN_BOOTSTRAP=tcp with WAN_MASTER_ADDR)");
  for (const char* bad : {"MPI", "nccl", "tcp "}) {
    m["WAN_BOOTSTRAP"] = bad;
    EXPECT_EQ(error_of([&] { parse_bootstrap(lookup(m), true); }),
              std::string("WAN_BOOTSTRAP='") + bad + "': expected tcp, mpi or auto");
  }
}

TEST(DistBootstrap, DetectsMpiLaunchers) {
  EXPECT_FALSE(mpi_launcher_env(lookup({})));
  EXPECT_FALSE(mpi_launcher_env(lookup({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}})));
  EXPECT_FALSE(mpi_launcher_env(lookup({{"WAN_RANK", "1"}, {"WAN_WORLD_SIZE", "2"}})));
  EXPECT_FALSE(mpi_launcher_env(lookup({{"OMPI_COMM_WORLD_SIZE", ""}})));  // empty = unset
  EXPECT_TRUE(mpi_launcher_env(lookup({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "0"}})));
  EXPECT_TRUE(mpi_launcher_env(lookup({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}})));  // MPICH / Intel MPI
  EXPECT_TRUE(mpi_launcher_env(lookup({{"PMIX_RANK", "3"}})));                   // PMIx (srun --mpi=pmix)
  EXPECT_TRUE(mpi_launcher_env(lookup({{"MPI_LOCALNRANKS", "2"}})));
}

TEST(DistBootstrap, Choice) {
  const std::map<std::string, std::string> ompi{
      {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}};
  const std::map<std::string, std::string> slurm{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"}};
  std::map<std::string, std::string> slurm_pmix = slurm;
  slurm_pmix["PMIX_RANK"] = "1";
  std::map<std::string, std::string> by_hand = ompi;
  by_hand["WAN_RANK"] = "1";
  const auto A = BootstrapKind::Auto, T = BootstrapKind::Tcp, M = BootstrapKind::Mpi;
  EXPECT_EQ(choose_bootstrap(A, lookup(ompi), true), M);
  EXPECT_EQ(choose_bootstrap(A, lookup(ompi), false), T);  // no MPI in this build: the TCP rendezvous
  EXPECT_EQ(choose_bootstrap(A, lookup(slurm), true), T);  // plain srun: environment, as before
  EXPECT_EQ(choose_bootstrap(A, lookup(slurm_pmix), true), M);
  EXPECT_EQ(choose_bootstrap(A, lookup(by_hand), true), T);  // WAN_RANK: ranks by hand
  EXPECT_EQ(choose_bootstrap(T, lookup(ompi), true), T);
  EXPECT_EQ(choose_bootstrap(M, lookup(slurm), true), M);
  EXPECT_STREQ(bootstrap_name(T), "tcp");
  EXPECT_STREQ(bootstrap_name(M), "mpi");
#ifdef WAN_HAVE_MPI
  EXPECT_TRUE(mpi_built());
#else
  EXPECT_FALSE(mpi_built());
#endif
}

TEST(DistBootstrap, BadValueStopsEveryLaunch) {
  EnvGuard g;
  g.set("WAN_BOOTSTRAP", "pmi");
  EXPECT_EQ(error_of([] { launch(host_ranks(2), [](RankContext&) {}); }),
            "WAN_BOOTSTRAP='pmi': expected tcp, mpi or auto");
}

#ifndef WAN_HAVE_MPI
TEST(DistBootstrap, MpiRequestedWithoutMpiBuild) {
  EnvGuard g;
  g.set("WAN_BOOTSTRAP", "mpi");
  EXPECT_EQ(error_of([] { launch(host_ranks(2), [](RankContext&) {}); }),
            "WAN_BOOTSTRAP=mpi: this wan was built without MPI (install an MPI, e.g. Debian's libopenmpi-dev, and "
            "configure again; or use WAN_BOOTSTRAP=tcp with WAN_MASTER_ADDR)");
}
#endif

TEST(DistBootstrap, InProcessLaunchSaysSo) {
  std::vector<std::string> seen(2);
  launch(host_ranks(2), [&](RankContext& ctx) { seen[ctx.rank] = ctx.bootstrap; });
  EXPECT_EQ(seen, (std::vector<std::string>{"in-process", "in-process"}));
}

TEST(DistBootstrap, InfoRoundTrip) {
  BootstrapInfo a;
  a.blob = random_blob(128);
  a.addr = "node7,10.1.2.3";
  a.port = 1 + static_cast<int>(random_blob(1)[0]) * 200;
  a.job = "mpi-" + std::to_string(random_blob(1)[0]);
  const std::string enc = encode_bootstrap_info(a);
  const BootstrapInfo b = decode_bootstrap_info(enc);
  EXPECT_EQ(b.blob, a.blob);
  EXPECT_EQ(b.addr, a.addr);
  EXPECT_EQ(b.port, a.port);
  EXPECT_EQ(b.job, a.job);
  const std::string want = "MPI bootstrap: malformed message from rank 0 (";
  for (size_t cut : {size_t(0), size_t(3), size_t(10), enc.size() - 1})
    EXPECT_EQ(error_of([&] { decode_bootstrap_info(enc.substr(0, cut)); }).rfind(want, 0), 0u) << cut;
  EXPECT_EQ(error_of([&] { decode_bootstrap_info(enc + "x"); }).rfind(want, 0), 0u);
  std::string bad = enc;
  bad[0] = 'X';
  EXPECT_EQ(error_of([&] { decode_bootstrap_info(bad); }).rfind(want, 0), 0u);
}

TEST(DistBootstrap, ControlAddresses) {
  EXPECT_EQ(control_addresses(true), "127.0.0.1");
  const std::string all = control_addresses(false);
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  EXPECT_EQ(all.rfind(host, 0), 0u) << all;  // the host name first
  EXPECT_EQ(all.find("127.0.0.1"), std::string::npos) << all;
  EXPECT_EQ(all.find(",,"), std::string::npos) << all;
}

TEST(DistBootstrap, PreBoundListenerAndCandidateAddresses) {
  // Rank 0 serves on a socket bound beforehand (ephemeral port); the others get a candidate list whose
  // first entries do not resolve (a DNS look-up) or cannot be reached (broadcast address).
  const int n = 3;
  auto listener = std::make_unique<TcpListener>(0);
  const int port = listener->port();
  ASSERT_GT(port, 0);
  const std::vector<uint8_t> blob = random_blob(128);
  std::vector<std::vector<uint8_t>> got(n);
  std::vector<std::string> errs(n);
  std::vector<std::thread> ts;
  const auto t0 = Clock::now();
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        RendezvousConfig c{r == 0 ? "" : "no-such-host.invalid,255.255.255.255,127.0.0.1", r == 0 ? 0 : port, r, n,
                           "j", 10.0, 10.0};
        auto ch = ControlChannel::open(c, r == 0 ? blob : std::vector<uint8_t>{}, {},
                                       r == 0 ? std::move(listener) : nullptr);
        EXPECT_EQ(ch->port(), port);
        got[r] = ch->blob();
        EXPECT_TRUE(ch->barrier(true));
        ch->close();
      } catch (const Error& e) {
        errs[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errs[r], "") << "rank " << r;
    EXPECT_EQ(got[r], blob) << "rank " << r;
  }
  EXPECT_LT(since(t0), 15.0);  // bounded (a slow DNS answer for the first name can take seconds)
  // Nothing resolves: the one error names the whole list.
  const std::string e = error_of([] {
    ControlChannel::open({"no-such-host.invalid,nor-this.invalid", 5000, 1, 2, "", 2.0, 10.0}, {});
  });
  EXPECT_EQ(e.rfind("rendezvous: cannot resolve rank 0's address 'no-such-host.invalid,nor-this.invalid' "
                    "(WAN_MASTER_ADDR): ", 0), 0u) << e;
}

// ---------------------------------------------------------------------------------------------------
// Under mpirun (CTest runs these with 2 and 4 ranks)

#ifdef WAN_HAVE_MPI
namespace {
bool under_mpi() { return mpi_launcher_env(process_env) && parse_launcher_env(process_env).has_value(); }
}  // namespace

TEST(MpiRanks, ExchangeIdAndControlAddress) {
  if (!under_mpi()) GTEST_SKIP() << "run under mpirun";
  const auto le = parse_launcher_env(process_env);
  const mpi::World w = mpi::init();
  EXPECT_EQ(w.rank, le->rank);
  EXPECT_EQ(w.world, le->world);
  EXPECT_GE(w.world, 2);
  if (const char* l = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
    EXPECT_EQ(w.local_rank, std::atoi(l));
  }
  if (const char* l = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) {
    EXPECT_EQ(w.local_size, std::atoi(l));
  }
  // Twice: 127.0.0.1 (one node), then the list a job across nodes would send (host name, interfaces).
  for (bool one_node : {true, false}) {
    const auto t0 = Clock::now();
    BootstrapInfo mine;
    std::unique_ptr<TcpListener> listener;
    if (w.rank == 0) {
      listener = std::make_unique<TcpListener>(0);
      mine.blob = random_blob(128);
      mine.addr = control_addresses(one_node);
      mine.port = listener->port();
      mine.job = "test-" + std::to_string(random_blob(1)[0]);
    }
    const BootstrapInfo got = mpi::exchange(std::nullopt, mine, 10.0);
    ASSERT_EQ(got.blob.size(), 128u);
    EXPECT_EQ(got.addr, one_node ? "127.0.0.1" : control_addresses(false));
    if (w.rank == 0) {
      EXPECT_EQ(got.blob, mine.blob);
      EXPECT_EQ(got.port, mine.port);
      EXPECT_EQ(got.job, mine.job);
    }
    // The control channel at the address received; rank 0 sends its id again over TCP: each rank must
    // hold the same bytes through both paths.
    RendezvousConfig rc{got.addr, got.port, w.rank, w.world, got.job, 10.0, 10.0};
    auto ch = ControlChannel::open(rc, w.rank == 0 ? got.blob : std::vector<uint8_t>{}, {}, std::move(listener));
    EXPECT_EQ(ch->blob(), got.blob) << "rank " << w.rank;
    EXPECT_TRUE(ch->barrier(true));
    ch->close();
    EXPECT_LT(since(t0), 5.0);
  }
}

TEST(MpiRanks, LaunchNeedsNoMasterAddress) {
  if (!under_mpi()) GTEST_SKIP() << "run under mpirun";
  EnvGuard g;
  for (const char* v : {"WAN_MASTER_ADDR", "WAN_MASTER_PORT", "MASTER_ADDR", "MASTER_PORT", "WAN_BOOTSTRAP"})
    g.unset(v);
  g.unset("OMPI_COMM_WORLD_LOCAL_SIZE");  // the tcp bootstrap would now ask for WAN_MASTER_ADDR
  const auto le = parse_launcher_env(process_env);
  ASSERT_TRUE(le);
  EXPECT_EQ(le->master_addr, "");
  for (int round = 0; round < 2; ++round) {  // a second launch in the same process reuses MPI
    std::string boot;
    int rank = -1, world = -1, local = -1, counted = 0;
    launch(host_ranks(0), [&](RankContext& ctx) {
      boot = ctx.bootstrap;
      rank = ctx.rank, world = ctx.world, local = ctx.local_rank;
      EXPECT_FALSE(ctx.in_process);
      for (int k = 0; k < 10; ++k) {
        ctx.barrier();
        ++counted;
      }
    });
    EXPECT_EQ(boot, "mpi");
    EXPECT_EQ(rank, le->rank);
    EXPECT_EQ(world, le->world);
    EXPECT_EQ(local, le->local_rank);
    EXPECT_EQ(counted, 10);
  }
}
#endif

// ---------------------------------------------------------------------------------------------------
// Failures under mpirun: MpiJob.* start `mpirun -np N` on MpiChild.Run, which runs one case and writes
// its outcome to $WAN_TEST_MPI_OUT/rank<R>, then exits like the CLI (exit code 1 or 2 on error).

TEST(MpiChild, Run) {
  const char* out = std::getenv("WAN_TEST_MPI_OUT");
  const char* which = std::getenv("WAN_TEST_MPI_CASE");
  if (!out || !which) GTEST_SKIP() << "started by MpiJob.* only";
  const auto le = parse_launcher_env(process_env);
  ASSERT_TRUE(le);
  const std::string file = std::string(out) + "/rank" + std::to_string(le->rank);
  const std::string c = which;
  std::string result;
  int code = 0;
  try {
    LaunchOptions o = host_ranks(0);
    if (c == "devices2") o = host_ranks(2);  // local ranks 2 and 3 have no device
    launch(o, [&](RankContext& ctx) {
      result = "ok " + ctx.bootstrap + " rank " + std::to_string(ctx.rank) + " of " + std::to_string(ctx.world);
      ctx.barrier();
      if (c == "throw_in_fn") {
        if (ctx.rank == 1) WAN_THROW("prompt file 'p.txt' not found");
        const auto t0 = Clock::now();
        while (since(t0) < 20) {
          ctx.check_abort();
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
    });
  } catch (const Error& e) {
    result = std::string("error: ") + e.what();
    code = e.kind() == ErrorKind::BadInput ? 2 : 1;
  }
  std::ofstream(file) << result << " [exit " << code << "]";
  if (code != 0) {
    std::fflush(nullptr);
    std::exit(code);  // as the CLI: atexit runs (MPI_Finalize is skipped after a failure)
  }
}

#ifdef WAN_MPIEXEC
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Job {
  int code = -1;       // mpirun's exit code, or 128 + signal; -1 when it had to be killed
  double seconds = 0;  // wall time
  std::map<int, std::string> out;  // rank -> what MpiChild.Run wrote
  std::string log;     // mpirun's stdout + stderr
};

// Runs `mpirun -np n <this test> --gtest_filter=MpiChild.Run` with extra environment; kills it (and
// fails the test) after limit_s.
Job run_job(int n, const std::string& which, const std::map<std::string, std::string>& env, double limit_s) {
  test::TempDir dir("mpijob");
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::vector<std::string> args{WAN_MPIEXEC};
  std::istringstream flags(WAN_MPIEXEC_FLAGS);
  for (std::string f; flags >> f;) args.push_back(f);
  for (const std::string& a : {std::string("-np"), std::to_string(n), self, std::string("--gtest_filter=MpiChild.Run")})
    args.push_back(a);
  const std::string log = dir.file("log");
  Job job;
  const auto t0 = Clock::now();
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    setenv("WAN_TEST_MPI_OUT", dir.str().c_str(), 1);
    setenv("WAN_TEST_MPI_CASE", which.c_str(), 1);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    if (!freopen(log.c_str(), "w", stdout) || dup2(fileno(stdout), 2) < 0) _exit(125);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(126);
  }
  for (;;) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      job.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    if (since(t0) > limit_s) {
      kill(-pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      ADD_FAILURE() << "mpirun still running after " << limit_s << " s (hang)";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  job.seconds = since(t0);
  for (int r = 0; r < n; ++r) {
    const std::string f = dir.file("rank" + std::to_string(r));
    if (std::filesystem::exists(f)) job.out[r] = read_file(f);
  }
  job.log = read_file(log);
  return job;
}

}  // namespace

TEST(MpiJob, Success) {
  Job j = run_job(3, "ok", {}, 30);
  EXPECT_EQ(j.code, 0) << j.log;
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(j.out[r], "ok mpi rank " + std::to_string(r) + " of 3 [exit 0]") << "rank " << r << "\n" << j.log;
  EXPECT_LT(j.seconds, 15.0);
}

TEST(MpiJob, FailureBeforeExchangeReachesEveryRank) {
  // `mpirun -np 4` with two devices: local ranks 2 and 3 fail in their plan; rank 2's error is the one.
  Job j = run_job(4, "devices2", {}, 30);
  EXPECT_NE(j.code, 0);
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(j.out[r], "error: rank 2: local rank 2 has no device in --devices/--gpus (2 given) [exit 2]")
        << "rank " << r << "\n" << j.log;
  EXPECT_LT(j.seconds, 15.0);
}

TEST(MpiJob, FailureInFnReachesEveryRank) {
  Job j = run_job(3, "throw_in_fn", {}, 30);
  EXPECT_NE(j.code, 0);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(j.out[r], "error: rank 1: prompt file 'p.txt' not found [exit 2]") << "rank " << r << "\n" << j.log;
  EXPECT_LT(j.seconds, 15.0);
}

TEST(MpiJob, ForcedFailureAtBootstrap) {
  Job j = run_job(3, "ok", {{"WAN_DIST_FAIL_RANK", "2"}, {"WAN_DIST_FAIL_AT", "bootstrap"}}, 30);
  EXPECT_NE(j.code, 0);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(j.out[r], "error: rank 2: forced failure at 'bootstrap' (WAN_DIST_FAIL_RANK=2) [exit 1]")
        << "rank " << r << "\n" << j.log;
  EXPECT_LT(j.seconds, 15.0);
}

TEST(MpiJob, StuckRankBeforeExchangeTimesOut) {
  // Rank 1 stops before the exchange: the others fail at WAN_DIST_TIMEOUT, mpirun then ends rank 1.
  Job j = run_job(3, "ok",
                  {{"WAN_DIST_FAIL_RANK", "1"}, {"WAN_DIST_FAIL_AT", "bootstrap"}, {"WAN_DIST_FAIL_MODE", "hang"},
                   {"WAN_DIST_TIMEOUT", "2"}},
                  30);
  EXPECT_NE(j.code, 0);
  EXPECT_EQ(j.out.count(1), 0u) << j.out[1];
  for (int r : {0, 2})
    EXPECT_EQ(j.out[r], "error: MPI bootstrap: timed out after 2 s in MPI_Iallgather: not every rank reached the "
                        "exchange (a rank may be stuck before it; WAN_DIST_TIMEOUT sets the limit) [exit 1]")
        << "rank " << r << "\n" << j.log;
  EXPECT_LT(j.seconds, 15.0);
}

TEST(MpiJob, DeadRankBeforeExchangeEndsTheJob) {
  // Rank 1 dies before the exchange (no error of its own): mpirun ends the job, well before the 60 s limit.
  Job j = run_job(3, "ok",
                  {{"WAN_DIST_FAIL_RANK", "1"}, {"WAN_DIST_FAIL_AT", "bootstrap"}, {"WAN_DIST_FAIL_MODE", "exit"},
                   {"WAN_DIST_TIMEOUT", "60"}},
                  30);
  EXPECT_NE(j.code, 0) << j.log;
  EXPECT_EQ(j.out.count(1), 0u);
  for (const auto& [r, o] : j.out) ADD_FAILURE() << "rank " << r << " finished: " << o;
  EXPECT_LT(j.seconds, 15.0);
}

TEST(MpiJob, ExplicitMasterPortIsUsed) {
  const int port = free_tcp_port();
  Job j = run_job(2, "ok", {{"WAN_MASTER_PORT", std::to_string(port)}, {"WAN_LOG_LEVEL", "info"}}, 30);
  EXPECT_EQ(j.code, 0) << j.log;
  for (int r = 0; r < 2; ++r) EXPECT_EQ(j.out[r], "ok mpi rank " + std::to_string(r) + " of 2 [exit 0]") << j.log;
  EXPECT_NE(j.log.find("dist: rank 0 waits for 1 ranks on TCP port " + std::to_string(port)), std::string::npos)
      << j.log;
}

TEST(MpiJob, TcpBootstrapUnderMpirun) {
  // WAN_BOOTSTRAP=tcp: the same launch through the environment and the TCP rendezvous.
  const int port = free_tcp_port();
  Job j = run_job(2, "ok", {{"WAN_BOOTSTRAP", "tcp"}, {"WAN_MASTER_PORT", std::to_string(port)}}, 30);
  EXPECT_EQ(j.code, 0) << j.log;
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(j.out[r], "ok tcp rank " + std::to_string(r) + " of 2 [exit 0]") << "rank " << r << "\n" << j.log;
}
#endif
