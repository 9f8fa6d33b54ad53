// launch(): plans this process's ranks, bootstraps a multi-process launch (tcp rendezvous or MPI),
// runs one worker thread per local rank and supervises them until all have returned (see launch.h).
// The failure machinery (shared state, watchdog, communicators) is in launch_failure.cpp, the
// environment parsing in launch_env.cpp.
// Invariant: every rank enters NCCL's blocking init only after all ranks are alive on their devices,
// and under the mpi bootstrap a rank's failure before the exchange reaches every rank.
#include "runtime/dist/launch.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <set>
#include <thread>

#include "core/log.h"
#include "runtime/dist/launch_state.h"

#ifdef WAN_HAVE_NCCL
#include "kernels/check.h"
#endif

namespace wan::dist {

using detail::getenv_nonempty;
using detail::kDefaultPort;
using detail::LaunchState;
using detail::now_ns;
using detail::Settings;
using detail::with_rank;

namespace {

struct Plan {
  bool multi = false;
  int world = 1;
  std::vector<RankContext> ranks;  // this process's ranks
  std::optional<LauncherEnv> env;
};

// need_addr: the tcp bootstrap needs rank 0's address from the environment (the mpi one sends it).
Plan plan_launch(const LaunchOptions& opt, const std::optional<LauncherEnv>& env, bool need_addr) {
  Plan p;
  p.env = env;
  int ndev = -1;
#ifdef WAN_HAVE_NCCL
  if (opt.nccl) {
    ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess) {
      cudaGetLastError();
      ndev = 0;
    }
    WAN_CHECK(ndev > 0, "multi-GPU launch: no CUDA device is visible");
  }
#else
  WAN_CHECK(!opt.nccl, "this build has no NCCL: multi-GPU runs need a build with CUDA and NCCL");
#endif
  auto check_dev = [&](int d, const char* what) {
    WAN_CHECK(ndev < 0 || (d >= 0 && d < ndev), what, ": device ", d, " does not exist (", ndev,
              " visible GPU", ndev == 1 ? "" : "s", ")");
  };
  if (p.env) {
    p.multi = true;
    p.world = p.env->world;
    RankContext c;
    c.rank = p.env->rank;
    c.world = p.env->world;
    c.local_rank = p.env->local_rank;
    c.in_process = false;
    if (!opt.devices.empty()) {
      WAN_CHECK(c.local_rank < static_cast<int>(opt.devices.size()), "local rank ", c.local_rank,
                " has no device in --devices/--gpus (", opt.devices.size(), " given)");
      c.device = opt.devices[c.local_rank];
    } else {
      c.device = ndev == 1 ? 0 : c.local_rank;
    }
    check_dev(c.device, cat("rank ", c.rank, " (local rank ", c.local_rank, ")").c_str());
    WAN_CHECK(p.world == 1 || !need_addr || !p.env->master_addr.empty(), "multi-process launch (", p.env->source,
              ", world size ", p.world, ") needs rank 0's address: set WAN_MASTER_ADDR (and WAN_MASTER_PORT, default ",
              kDefaultPort, ")");
    p.ranks.push_back(c);
  } else {
    const std::vector<int> devs = opt.devices.empty() ? std::vector<int>{0} : opt.devices;
    std::set<int> seen;
    for (int d : devs) {
      check_dev(d, "--devices/--gpus");
      WAN_CHECK(seen.insert(d).second, "--devices: device ", d, " is listed twice");
    }
    p.world = static_cast<int>(devs.size());
    for (int i = 0; i < p.world; ++i) {
      RankContext c;
      c.rank = c.local_rank = i;
      c.world = p.world;
      c.device = devs[i];
      c.in_process = true;
      p.ranks.push_back(c);
    }
  }
  return p;
}

void run_rank(LaunchState& st, RankContext& ctx, const std::function<void(RankContext&)>& fn,
              const std::vector<uint8_t>& unique_id) {
  [[maybe_unused]] bool ok = false;
  try {
    ctx.check_abort();
#ifdef WAN_HAVE_NCCL
    if (st.nccl) CUDA_CHECK(cudaSetDevice(ctx.device));
#endif
    maybe_fail(ctx, "init");
    // Every rank is alive and on its device before any enters NCCL's (blocking) init, so a rank that
    // fails before it cannot leave the others waiting inside it.
    st.barrier(ctx.slot_, false);
#ifdef WAN_HAVE_NCCL
    if (st.nccl) {
      ncclUniqueId id;
      WAN_ASSERT(unique_id.size() == sizeof id.internal, "NCCL unique id of ", unique_id.size(), " bytes");
      std::memcpy(id.internal, unique_id.data(), sizeof id.internal);
      ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
      cfg.blocking = 1;
      ncclComm_t comm = nullptr;
      NCCL_CHECK(ncclCommInitRankConfig(&comm, ctx.world, id, ctx.rank, &cfg));
      ctx.comm = comm;
      ctx.register_comm(comm);
      ctx.check_abort();
    }
#endif
    maybe_fail(ctx, "start");
    fn(ctx);
    ctx.check_abort();
    st.barrier(ctx.slot_, true);
    ok = true;
  } catch (const Error& e) {
    st.fail({with_rank(ctx.rank, e.what()), e.kind()});
  } catch (const std::bad_alloc&) {
    st.fail({with_rank(ctx.rank, "out of host memory"), ErrorKind::Internal});
  } catch (const std::exception& e) {
    st.fail({with_rank(ctx.rank, cat("internal: ", e.what())), ErrorKind::Internal});
  } catch (...) {
    st.fail({with_rank(ctx.rank, "internal: unknown exception"), ErrorKind::Internal});
  }
  st.slots[ctx.slot_].phase = detail::kDone;
#ifdef WAN_HAVE_NCCL
  if (st.nccl) {
    detail::release_comms(st, ctx.slot_, ok);
    ctx.comm = nullptr;
  }
#endif
  {
    std::lock_guard<std::mutex> lk(st.mu);
    ++st.finished;
  }
  st.cv.notify_all();
}

// The bootstrap chosen for this launch, and (mpi) MPI's view of the ranks.
struct Boot {
  BootstrapKind kind = BootstrapKind::Tcp;
  bool mpi = false;
  bool one_node = false;  // mpi: every rank shares this node
};

Boot choose_boot(const Settings& settings, const EnvLookup& getenv_fn, std::optional<LauncherEnv>& env) {
  Boot b;
  b.kind = env && env->world > 1 ? choose_bootstrap(settings.bootstrap, getenv_fn, mpi_built()) : BootstrapKind::Tcp;
  b.mpi = b.kind == BootstrapKind::Mpi;
#ifdef WAN_HAVE_MPI
  if (b.mpi) {
    mpi::set_finalize_at_exit(false);  // until this launch ends well
    const mpi::World mw = mpi::init();
    WAN_CHECK(mw.world == env->world && mw.rank == env->rank, "MPI bootstrap: MPI gives rank ", mw.rank, " of ",
              mw.world, " but the ", env->source, " launcher environment says rank ", env->rank, " of ", env->world,
              " (is this the launcher's MPI? start with its mpirun or srun --mpi=pmix, or set WAN_BOOTSTRAP=tcp)");
    if (!getenv_nonempty(getenv_fn, "WAN_LOCAL_RANK")) env->local_rank = mw.local_rank;
    b.one_node = mw.local_size == mw.world;
  }
#endif
  return b;
}

// What this process prepares before the ranks meet.
struct Prepared {
  Plan plan;
  std::vector<uint8_t> unique_id;  // the NCCL unique id: made in-process or on rank 0, sent to the others
  BootstrapInfo root_info;         // mpi: what rank 0 sends
  std::unique_ptr<TcpListener> listener;
  std::optional<Failure> early;    // mpi: this rank's failure, handed to every rank by the exchange
};

// Rank 0 of the mpi bootstrap: binds the control channel's port and fills what it sends. An explicit
// WAN_MASTER_PORT/ADDR is honoured; else an ephemeral port and rank 0's addresses.
void prepare_mpi_root(const EnvLookup& getenv_fn, const LauncherEnv& env, bool one_node, Prepared& p) {
  const bool port_given = getenv_nonempty(getenv_fn, "WAN_MASTER_PORT") || getenv_nonempty(getenv_fn, "MASTER_PORT");
  p.listener = std::make_unique<TcpListener>(port_given ? env.master_port : 0);
  const char* addr = getenv_nonempty(getenv_fn, "WAN_MASTER_ADDR");
  if (!addr) addr = getenv_nonempty(getenv_fn, "MASTER_ADDR");
  p.root_info.addr = addr ? addr : control_addresses(one_node);
  p.root_info.port = p.listener->port();
  p.root_info.blob = p.unique_id;
  std::random_device rd;
  p.root_info.job = cat("mpi-", std::hex, rd(), rd());
}

// Plans the ranks, sets up the shared state and makes the unique id. Under the mpi bootstrap a failure
// of this rank here is not thrown at once: the exchange hands it to every rank (bootstrap.h). Elsewhere
// it is thrown (tcp: the other ranks end at the rendezvous timeout, naming this rank).
void prepare(const LaunchOptions& opt, const Settings& settings, const std::optional<LauncherEnv>& env,
             const Boot& boot, const EnvLookup& getenv_fn, LaunchState& st, Prepared& p) {
  try {
    p.plan = plan_launch(opt, env, /*need_addr=*/!boot.mpi);
    Plan& plan = p.plan;
    setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink multicast stays off unless set explicitly
    st.s = settings;
    st.nccl = opt.nccl;
    st.nslots = static_cast<int>(plan.ranks.size());
    st.slots.reset(new detail::Slot[st.nslots]);
    st.ctxs = &plan.ranks;
    for (int i = 0; i < st.nslots; ++i) {
      plan.ranks[i].state_ = &st;
      plan.ranks[i].slot_ = i;
      plan.ranks[i].bootstrap = !plan.multi ? "in-process" : plan.world == 1 ? "none" : bootstrap_name(boot.kind);
    }
    if (plan.multi && plan.world > 1) maybe_fail(plan.ranks[0], "bootstrap");
#ifdef WAN_HAVE_NCCL
    if (opt.nccl && (!plan.multi || plan.ranks[0].rank == 0)) {
      ncclUniqueId id;
      NCCL_CHECK(ncclGetUniqueId(&id));
      p.unique_id.assign(id.internal, id.internal + sizeof id.internal);
    }
#endif
    if (boot.mpi && plan.ranks[0].rank == 0) prepare_mpi_root(getenv_fn, *env, boot.one_node, p);
  } catch (const Error& e) {
    if (!boot.mpi) throw;
    p.early = Failure{with_rank(env->rank, e.what()), e.kind()};
  } catch (const std::bad_alloc&) {
    if (!boot.mpi) throw;
    p.early = Failure{with_rank(env->rank, "out of host memory"), ErrorKind::Internal};
  }
}

// Multi-process: the ranks meet (tcp rendezvous or mpi exchange), the control channel opens and every
// rank gets the unique id. In-process: only the log line.
void connect(const Settings& settings, const std::optional<LauncherEnv>& env, const Boot& boot, LaunchState& st,
             Prepared& p) {
  const Plan& plan = p.plan;
  if (!plan.multi && !p.early) {
    std::string devs;
    for (const auto& c : plan.ranks) devs += cat(devs.empty() ? "" : ",", c.device);
    LOG_INFO("dist: ", plan.world, " rank", plan.world == 1 ? "" : "s", " in this process on device",
             plan.world == 1 ? " " : "s ", devs);
    return;
  }
  // p.early: a failed plan, still a multi-process launch
  if (!p.early) {
    const RankContext& c = plan.ranks[0];
    LOG_INFO("dist: rank ", c.rank, " of ", c.world, " (", plan.env->source, ", ", c.bootstrap,
             " bootstrap), local rank ", c.local_rank, ", device ", c.device);
  }
  if (env->world <= 1) return;
  RendezvousConfig rc;
  rc.addr = env->master_addr;
  rc.port = env->master_port;
  rc.rank = env->rank;
  rc.world = env->world;
  rc.job = env->job;
  rc.timeout_s = settings.timeout_s;
  rc.heartbeat_timeout_s = settings.peer_timeout_s;
#ifdef WAN_HAVE_MPI
  if (boot.mpi) {  // throws the lowest failing rank's failure on every rank
    const BootstrapInfo got = mpi::exchange(p.early, p.root_info, settings.timeout_s);
    p.unique_id = got.blob;
    rc.addr = got.addr;
    rc.port = got.port;
    rc.job = got.job;
  }
#endif
  LaunchState* raw = &st;
  st.channel = ControlChannel::open(rc, boot.mpi ? std::vector<uint8_t>{} : p.unique_id,
                                    [raw](const Failure& f) { raw->on_verdict(f); }, std::move(p.listener));
  if (!boot.mpi) p.unique_id = st.channel->blob();
}

// After the workers have joined: the launch's outcome (a rank > 0 that failed locally reports rank 0's
// verdict), then the control channel closes and the reaper is stopped.
std::optional<Failure> finish(LaunchState& st) {
  std::optional<Failure> f;
  bool final_verdict;
  {
    std::lock_guard<std::mutex> lk(st.mu);
    f = st.failure;
    final_verdict = st.final_verdict;
  }
  if (f && st.channel && !final_verdict) {
    if (auto v = st.channel->wait_verdict(5.0)) f = *v;
  }
  if (st.channel) {
    st.channel->close(3.0);
    st.channel.reset();
  }
  {
    std::lock_guard<std::mutex> lk(st.mu);
    st.all_done = true;
  }
  st.cv.notify_all();
  if (st.reaper.joinable()) st.reaper.join();
  st.ctxs = nullptr;
  return f;
}

}  // namespace

void launch(const LaunchOptions& opt, const std::function<void(RankContext&)>& fn) {
  WAN_ASSERT(fn, "launch without a function");
  const Settings settings = detail::settings_from_env(opt);
  const EnvLookup getenv_fn = [](const char* n) { return std::getenv(n); };
  std::optional<LauncherEnv> env = parse_launcher_env(getenv_fn);
  const Boot boot = choose_boot(settings, getenv_fn, env);

  auto st = std::make_unique<LaunchState>();
  Prepared p;
  prepare(opt, settings, env, boot, getenv_fn, *st, p);
  connect(settings, env, boot, *st, p);

  const auto t_start = now_ns();
  for (int i = 0; i < st->nslots; ++i) st->slots[i].progress_ns = t_start;
  std::vector<std::thread> workers;
  workers.reserve(st->nslots);
  for (int i = 0; i < st->nslots; ++i)
    workers.emplace_back([&, i] { run_rank(*st, p.plan.ranks[i], fn, p.unique_id); });
  detail::supervise(*st);
  for (auto& w : workers) w.join();

  const std::optional<Failure> f = finish(*st);
  if (f) throw Error(f->message, f->kind);
#ifdef WAN_HAVE_MPI
  if (boot.mpi) mpi::set_finalize_at_exit(true);
#endif
}

}  // namespace wan::dist
