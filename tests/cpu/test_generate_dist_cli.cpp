// Multi-GPU `wan generate` without GPUs (issue 5, pipeline/generate_parallel.h): the options
// (--gpus / --devices / --cfg-parallel / --ulysses / --ring, the launcher's environment) and every
// message for an impossible request, the layout of a plan (heads, CFG on every step, the automatic
// choice), the shard ranges of the sharded load on fresh random tensor lists, and the command line
// itself: each bad request exits 2 with exactly one line on stderr, before any work, and writes nothing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "core/error.h"
#include "pipeline/generate_parallel.h"
#include "run_util.h"

using namespace wan;
using PL = dist::Layout;

namespace {

using Env = std::map<std::string, std::string>;
dist::EnvLookup lookup(const Env& m) {
  return [m](const char* k) -> const char* {
    auto it = m.find(k);
    return it == m.end() ? nullptr : it->second.c_str();
  };
}

struct Req {
  ParallelArgs a;
  Env env;
  int visible = 8;
};

ParallelRequest parse(const Req& r, GenerateOptions* o) { return parse_parallel_request(r.a, o, lookup(r.env), r.visible); }

std::string error_of(const Req& r, GenerateOptions o = {}) {
  try {
    parse(r, &o);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput) << e.what();
    return e.what();
  }
  return "(no error)";
}

Req gpus(const std::string& n) {
  Req r;
  r.a.gpus = n;
  return r;
}

const Env kRank1of2 = {{"WAN_RANK", "1"},
                       {"WAN_WORLD_SIZE", "2"},
                       {"WAN_LOCAL_RANK", "1"},
                       {"WAN_MASTER_ADDR", "127.0.0.1"},
                       {"WAN_MASTER_PORT", "29999"}};

}  // namespace

TEST(GenerateDistOptions, SingleDeviceRequestsChangeOnlyTheDevice) {
  GenerateOptions o;
  ParallelRequest r = parse(Req{}, &o);
  EXPECT_FALSE(r.active());
  EXPECT_EQ(o.device, "cpu");  // nothing given: untouched
  EXPECT_FALSE(o.parallel);

  o = {};
  r = parse(gpus("1"), &o);
  EXPECT_FALSE(r.active());
  EXPECT_EQ(o.device, "cuda:0");
  EXPECT_FALSE(o.parallel);

  o = {};
  Req d;
  d.a.devices = "3";
  d.a.device = "cuda";
  r = parse(d, &o);
  EXPECT_FALSE(r.active());
  EXPECT_EQ(o.device, "cuda:3");

  // A launcher environment of one rank is the single-GPU run.
  o = {};
  Req one;
  one.env = {{"WAN_RANK", "0"}, {"WAN_WORLD_SIZE", "1"}, {"WAN_LOCAL_RANK", "0"}};
  r = parse(one, &o);
  EXPECT_FALSE(r.active());
  EXPECT_FALSE(r.launcher);
}

TEST(GenerateDistOptions, InProcessRequests) {
  GenerateOptions o;
  ParallelRequest r = parse(gpus("4"), &o);
  EXPECT_TRUE(r.active());
  EXPECT_FALSE(r.launcher);
  EXPECT_EQ(r.world, 4);
  EXPECT_EQ(r.launch.devices, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(r.device, 0);
  EXPECT_EQ(o.device, "cuda:0");
  EXPECT_TRUE(o.parallel);
  EXPECT_EQ(r.ulysses, 0);
  EXPECT_EQ(r.ring, 0);
  EXPECT_FALSE(r.cfg);
  EXPECT_EQ(r.where(), "in-process, devices 0,1,2,3");

  o = {};
  Req d;
  d.a.devices = "5,2";
  d.a.device = "cuda";
  d.a.cfg = true;
  r = parse(d, &o);
  EXPECT_EQ(r.world, 2);
  EXPECT_TRUE(r.cfg);
  EXPECT_EQ(o.device, "cuda:5");

  o = {};
  Req u = gpus("8");
  u.a.cfg = true;
  u.a.ulysses = "2";
  u.a.ring = "2";
  r = parse(u, &o);
  EXPECT_EQ(r.ulysses, 2);
  EXPECT_EQ(r.ring, 2);
}

TEST(GenerateDistOptions, LauncherRequests) {
  GenerateOptions o;
  Req l;
  l.env = kRank1of2;
  ParallelRequest r = parse(l, &o);
  EXPECT_TRUE(r.active());
  EXPECT_TRUE(r.launcher);
  EXPECT_EQ(r.launcher_name, "WAN");
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.world, 2);
  EXPECT_EQ(o.device, "cuda:1");  // the local rank
  EXPECT_TRUE(o.parallel);
  EXPECT_EQ(r.where(), "one process per rank, WAN launcher environment");

  o = {};
  l.visible = 1;  // CUDA_VISIBLE_DEVICES per rank: the one visible GPU
  r = parse(l, &o);
  EXPECT_EQ(o.device, "cuda:0");

  o = {};
  l.visible = 8;
  l.a.devices = "6,7";  // local ranks mapped to GPUs
  r = parse(l, &o);
  EXPECT_EQ(o.device, "cuda:7");

  o = {};
  Req s;
  s.env = {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "3"}, {"SLURM_NNODES", "1"}};
  r = parse(s, &o);
  EXPECT_TRUE(r.launcher);
  EXPECT_EQ(r.launcher_name, "SLURM");
  EXPECT_EQ(r.world, 4);
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(o.device, "cuda:3");
}

TEST(GenerateDistOptions, ImpossibleRequestsAreOneClearError) {
  auto with = [](Req r, auto f) {
    f(r);
    return r;
  };
  EXPECT_EQ(error_of(with(gpus("2"), [](Req& r) { r.a.devices = "0,1"; })),
            "--gpus and --devices cannot be given together");
  EXPECT_EQ(error_of(with(gpus("2"), [](Req& r) { r.a.device = "cpu"; })),
            "--device cpu cannot run on several GPUs (--gpus 2); drop --device cpu or use --device cuda");
  EXPECT_EQ(error_of(with(Req{}, [](Req& r) {
              r.a.device = "cpu";
              r.a.cfg = true;
            })),
            "--device cpu cannot run on several GPUs (--cfg-parallel / --ulysses / --ring); drop --device cpu or use "
            "--device cuda");
  EXPECT_EQ(error_of(with(Req{}, [](Req& r) {
              r.a.device = "cpu";
              r.env = kRank1of2;
            })),
            "--device cpu cannot run on several GPUs (started as rank 1 of 2 by WAN); drop --device cpu or use --device "
            "cuda");
  EXPECT_EQ(error_of(with(gpus("2"), [](Req& r) { r.a.device = "cuda:1"; })),
            "--device cuda:1 and --gpus 2 both choose the GPUs: give --devices alone (e.g. --devices 1,...)");
  EXPECT_EQ(error_of(with(Req{}, [](Req& r) {
              r.a.device = "cuda:1";
              r.env = kRank1of2;
            })),
            "--device cuda:1: with one process per GPU (WAN launcher) each rank's GPU follows its local rank; map "
            "local ranks to GPUs with --devices");
  EXPECT_EQ(error_of(with(gpus("2"), [](Req& r) { r.a.device = "gpu"; })),
            "--device 'gpu' is not cpu, cuda or cuda:<index>");
  EXPECT_EQ(error_of(with(Req{}, [](Req& r) { r.a.ulysses = "2"; })),
            "--cfg-parallel / --ulysses / --ring split a run over several GPUs, but none were given: add --gpus N or "
            "--devices 0,1,... (or start one process per GPU with mpirun, srun or WAN_RANK)");
  EXPECT_EQ(error_of(with(gpus("1"), [](Req& r) { r.a.cfg = true; })),
            "--cfg-parallel / --ulysses / --ring split a run over several GPUs, but --gpus 1 gives one: add --gpus N "
            "or --devices 0,1,... (or start one process per GPU with mpirun, srun or WAN_RANK)");
  EXPECT_EQ(error_of(with(gpus("3"), [](Req& r) { r.a.cfg = true; })),
            "--cfg-parallel needs an even number of GPUs, got 3");
  EXPECT_EQ(error_of(with(gpus("4"), [](Req& r) { r.a.ulysses = "3"; })), "--ulysses 3 does not divide the 4 GPUs");
  EXPECT_EQ(error_of(with(gpus("4"), [](Req& r) {
              r.a.cfg = true;
              r.a.ring = "4";
            })),
            "--ring 4 does not divide the 2 GPUs per CFG half");
  EXPECT_EQ(error_of(with(gpus("4"), [](Req& r) {
              r.a.ulysses = "2";
              r.a.ring = "3";
            })),
            "parallel layout cfg 1 x ulysses 2 x ring 3 needs 6 GPUs, but 4 are used");
  EXPECT_EQ(error_of(with(gpus("8"), [](Req& r) {
              r.a.cfg = true;
              r.a.ulysses = "4";
              r.a.ring = "2";
            })),
            "parallel layout cfg 2 x ulysses 4 x ring 2 needs 16 GPUs, but 8 are used");
  for (const char* bad : {"x", "0", "-2", "", "1.5", "99999"})
    EXPECT_EQ(error_of(with(gpus("2"), [&](Req& r) { r.a.ulysses = bad; })),
              cat("--ulysses: '", bad, "' is not a positive integer"));
  EXPECT_EQ(error_of(with(gpus("2"), [](Req& r) { r.a.ring = "two"; })), "--ring: 'two' is not a positive integer");
  EXPECT_EQ(error_of(gpus("0")), "--gpus 0: expected 1..1024");
  EXPECT_EQ(error_of(with(Req{}, [](Req& r) { r.a.devices = "0,0"; })), "--devices: device 0 is listed twice");
  GenerateOptions resume;  // pausing and resuming work on several GPUs (the state is checked with the plan)
  resume.resume_file = "state.safetensors";
  resume.stop_after_steps = 3;
  EXPECT_EQ(error_of(gpus("2"), resume), "(no error)");
  GenerateOptions keep;
  keep.keep_text_encoder = true;
  EXPECT_EQ(error_of(gpus("2"), keep),
            "--keep-text-encoder: not with several GPUs (the text encoder runs once on rank 0 and is freed before its "
            "DiT loads)");
  EXPECT_EQ(error_of(with(gpus("2"), [](Req& r) {
              r.env = {{"WAN_RANK", "0"}, {"WAN_WORLD_SIZE", "1"}, {"WAN_LOCAL_RANK", "0"}};
            })),
            "--gpus 2: this process was started as the only rank of a WAN launch (world size 1); drop the launcher's "
            "variables to use several GPUs in one process, or start one process per GPU");
  EXPECT_EQ(error_of(with(Req{}, [](Req& r) {
              r.env = kRank1of2;
              r.a.devices = "3";
            })),
            "local rank 1 has no device in --devices 3 (1 given)");
}

TEST(GenerateDistOptions, LayoutOfAPlan) {
  GeneratePlan p;
  p.ckpt.dit.num_heads = 40;
  p.guide_low = 3;
  p.guide_high = 4;
  p.experts.steps = {{Expert::High, 4.0f}, {Expert::High, 4.0f}, {Expert::Low, 3.0f}};
  auto layout = [&](int world, bool cfg, int u, int r) {
    ParallelRequest q;
    q.world = world;
    q.cfg = cfg;
    q.ulysses = u;
    q.ring = r;
    return resolve_parallel_layout(q, p);
  };
  auto err = [&](int world, bool cfg, int u, int r) {
    try {
      layout(world, cfg, u, r);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(layout(2, false, 0, 0), (PL{2, 1, 1}));  // automatic: CFG first
  EXPECT_EQ(layout(4, false, 0, 0), (PL{2, 2, 1}));
  EXPECT_EQ(layout(8, false, 0, 0), (PL{2, 4, 1}));
  EXPECT_EQ(layout(4, false, 0, 2), (PL{1, 2, 2}));
  EXPECT_EQ(layout(4, true, 0, 2), (PL{2, 1, 2}));
  EXPECT_EQ(layout(8, true, 2, 2), (PL{2, 2, 2}));
  EXPECT_EQ(err(6, false, 3, 0), "--ulysses 3 does not divide the model's 40 heads");
  p.ckpt.dit.num_heads = 2;  // the tiny model
  EXPECT_EQ(layout(4, false, 0, 0), (PL{2, 2, 1}));
  EXPECT_EQ(layout(8, false, 0, 0), (PL{2, 2, 2}));  // Ulysses at most the heads, ring for the rest
  EXPECT_EQ(err(4, false, 4, 0), "--ulysses 4 does not divide the model's 2 heads");
  // A step with guide 1 runs the conditional half alone: no CFG-parallel.
  p.experts.steps.push_back({Expert::Low, 1.0f});
  p.guide_low = 1;
  EXPECT_EQ(layout(2, false, 0, 0), (PL{1, 2, 1}));
  EXPECT_EQ(err(2, true, 0, 0),
            "--cfg-parallel needs classifier-free guidance on every step (guide scales 1,4; a scale of 1 runs the "
            "conditional half alone)");
}

TEST(GenerateDistShards, RangesCoverTheAllocationAtTensorStarts) {
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(cat("seed ", seed));
  for (int trial = 0; trial < 200; ++trial) {
    // A random weight table: sizes from a few bytes to megabytes, starts aligned to 16 or 256.
    const int n = 1 + static_cast<int>(rng() % 300);
    std::vector<std::pair<size_t, size_t>> t;
    size_t at = 0, biggest = 0;
    for (int i = 0; i < n; ++i) {
      const size_t align = rng() % 2 ? 16 : 256;
      at = (at + align - 1) / align * align;
      const size_t bytes = 2 + rng() % (rng() % 4 == 0 ? (size_t{4} << 20) : 4096);
      t.emplace_back(at, bytes);
      at += bytes;
      biggest = std::max(biggest, bytes);
    }
    const size_t total = (at + 255) / 256 * 256;
    const int world = 1 + static_cast<int>(rng() % 16);
    const auto ranges = shard_ranges(t, total, world);
    ASSERT_EQ(ranges.size(), static_cast<size_t>(world));
    ASSERT_EQ(ranges.front().first, 0u);
    ASSERT_EQ(ranges.back().second, total);
    std::vector<size_t> owned(static_cast<size_t>(world), 0);
    for (int r = 0; r < world; ++r) {
      const auto [b, e] = ranges[static_cast<size_t>(r)];
      ASSERT_LE(b, e);
      if (r > 0) {
        ASSERT_EQ(b, ranges[static_cast<size_t>(r) - 1].second) << "ranges must be contiguous";
      }
      if (b > 0 && b < total) {  // a cut lies at a tensor's start
        bool at_start = false;
        for (const auto& x : t) at_start = at_start || x.first == b;
        ASSERT_TRUE(at_start) << "cut " << b << " of rank " << r;
      }
    }
    for (const auto& [off, bytes] : t) {  // each tensor lies wholly in one range
      int in = 0;
      for (int r = 0; r < world; ++r) {
        const auto [b, e] = ranges[static_cast<size_t>(r)];
        if (off >= b && off < e) {
          ASSERT_LE(off + bytes, e);
          owned[static_cast<size_t>(r)] += bytes;
          ++in;
        }
      }
      ASSERT_EQ(in, 1);
    }
    // Balance: no rank streams more than its share plus one tensor (cuts at tensor boundaries).
    for (int r = 0; r < world; ++r)
      EXPECT_LE(owned[static_cast<size_t>(r)], total / static_cast<size_t>(world) + biggest + 256) << "rank " << r;
  }
  // One rank: the whole allocation.
  const auto one = shard_ranges({{0, 100}, {256, 40}}, 512, 1);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0], (std::pair<size_t, size_t>{0, 512}));
  // Equal tensors over as many ranks: one each.
  std::vector<std::pair<size_t, size_t>> eq;
  for (size_t i = 0; i < 4; ++i) eq.emplace_back(i * 1024, 1000);
  const auto four = shard_ranges(eq, 4096, 4);
  for (size_t r = 0; r < 4; ++r) EXPECT_EQ(four[r], (std::pair<size_t, size_t>{r * 1024, (r + 1) * 1024}));
}

// ---- the command line (the binary at WAN_BINARY) ----

namespace {

using Result = test::RunResult;

// `wan args...` with no launcher variables in its environment, stdout / stderr captured.
Result run_wan(const std::vector<std::string>& args, const Env& extra = {}) {
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e, k = kv.substr(0, kv.find('='));
    const bool launcher = k.rfind("WAN_", 0) == 0 || k.rfind("OMPI_", 0) == 0 || k.rfind("PMI_", 0) == 0 ||
                          k.rfind("SLURM_", 0) == 0 || k == "MPI_LOCALRANKID";
    if (!launcher && !extra.count(k)) envs.push_back(kv);
  }
  for (const auto& [k, v] : extra) envs.push_back(k + "=" + v);
  return test::run_captured(WAN_BINARY, args, &envs);
}

}  // namespace

TEST(GenerateDistCli, BadRequestsExit2WithOneLineAndNoOutput) {
  if (!std::filesystem::exists(WAN_BINARY)) GTEST_SKIP() << "wan binary not built: " << WAN_BINARY;
  test::TempDir t("gdcli_out");
  const std::string output = t / "out.y4m";
  const std::vector<std::string> base = {"generate", "--weights", "random", "--config", "tiny", "--prompt", "a fox",
                                         "--size", "80x48", "--frames", "9", "--steps", "2", "--seed", "3",
                                         "--output", output};
  struct Case {
    std::vector<std::string> extra;
    Env env;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--device", "cpu", "--gpus", "2"}, {},
       "--device cpu cannot run on several GPUs (--gpus 2); drop --device cpu or use --device cuda"},
      {{"--gpus", "2", "--devices", "0,1"}, {}, "--gpus and --devices cannot be given together"},
      {{"--cfg-parallel"}, {},
       "--cfg-parallel / --ulysses / --ring split a run over several GPUs, but none were given: add --gpus N or "
       "--devices 0,1,... (or start one process per GPU with mpirun, srun or WAN_RANK)"},
      {{"--gpus", "3", "--cfg-parallel"}, {}, "--cfg-parallel needs an even number of GPUs, got 3"},
      {{"--gpus", "4", "--ulysses", "2", "--ring", "3"}, {},
       "parallel layout cfg 1 x ulysses 2 x ring 3 needs 6 GPUs, but 4 are used"},
      {{"--gpus", "2", "--ring", "x"}, {}, "--ring: 'x' is not a positive integer"},
      {{"--device", "cpu"}, kRank1of2,
       "--device cpu cannot run on several GPUs (started as rank 1 of 2 by WAN); drop --device cpu or use --device "
       "cuda"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = base;
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = run_wan(args, c.env);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string cmd;
    for (const auto& a : c.extra) cmd += " " + a;
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.err;
    EXPECT_EQ(r.err, "error: " + c.message + "\n") << cmd;
    EXPECT_TRUE(r.out.empty()) << cmd << ": " << r.out;
    EXPECT_FALSE(std::filesystem::exists(output)) << cmd;
    EXPECT_LT(s, 10.0) << cmd << ": a bad request must fail before any work";
  }
  // --help lists the options.
  const Result h = run_wan({"generate", "--help"});
  EXPECT_EQ(h.code, 0);
  for (const char* opt : {"--gpus N | --devices 0,1,...", "--cfg-parallel", "--ulysses U", "--ring R", "WAN_RANK"})
    EXPECT_NE(h.out.find(opt), std::string::npos) << opt;
}
