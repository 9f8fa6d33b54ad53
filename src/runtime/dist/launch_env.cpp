// What a launch reads from its options and environment: the CLI's --gpus/--devices, the launcher's
// rank/world/local rank and rank 0's address (mpirun, srun, WAN_RANK; see launch.h for the variables
// and their precedence), and the WAN_DIST_* settings. Pure parsing: nothing here starts a rank; every
// malformed value is a wan::Error naming its variable.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>

#ifdef WAN_HAVE_NCCL
#include <dlfcn.h>
#endif

#include "runtime/dist/launch_state.h"

namespace wan::dist {
namespace detail {

const char* getenv_nonempty(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return v && *v ? v : nullptr;
}

long long parse_int(const char* name, const char* v) {
  WAN_CHECK(*v == '-' || (*v >= '0' && *v <= '9'), name, "='", v, "' is not an integer");
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  WAN_CHECK(end != v && *end == '\0' && errno == 0, name, "='", v, "' is not an integer");
  return x;
}

namespace {

double env_seconds(const char* name, double def) {
  const char* v = std::getenv(name);
  if (!v || !*v) return def;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  WAN_CHECK(end != v && *end == '\0' && std::isfinite(x) && x > 0, name, "='", v,
            "' is not a positive number of seconds");
  return x;
}

}  // namespace

#ifdef WAN_HAVE_NCCL
RevokeFn nccl_revoke() {
  static const RevokeFn fn = [] {
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess || v < 22800) return RevokeFn(nullptr);
    return reinterpret_cast<RevokeFn>(dlsym(RTLD_DEFAULT, "ncclCommRevoke"));
  }();
  return fn;
}
#endif

Settings settings_from_env(const LaunchOptions& opt) {
  Settings s;
  WAN_CHECK(opt.timeout_s >= 0 && std::isfinite(opt.timeout_s), "launch timeout must be >= 0 s");
  s.timeout_s = opt.timeout_s > 0 ? opt.timeout_s : env_seconds("WAN_DIST_TIMEOUT", kDefaultTimeout);
  s.grace_s = env_seconds("WAN_DIST_ABORT_GRACE", kDefaultGrace);
  s.peer_timeout_s = env_seconds("WAN_DIST_PEER_TIMEOUT", kDefaultPeerTimeout);
  s.bootstrap = parse_bootstrap([](const char* n) { return std::getenv(n); }, mpi_built());
  const char* m = std::getenv("WAN_DIST_ABORT_MODE");
  if (m && *m) {
    WAN_CHECK(!std::strcmp(m, "revoke") || !std::strcmp(m, "abort"), "WAN_DIST_ABORT_MODE='", m,
              "': expected revoke or abort");
    s.revoke = !std::strcmp(m, "revoke");
  }
#ifdef WAN_HAVE_NCCL
  if (!nccl_revoke()) s.revoke = false;
#endif
  return s;
}

}  // namespace detail

using detail::getenv_nonempty;
using detail::parse_int;

LaunchOptions parse_launch_options(const std::string& gpus, const std::string& devices) {
  WAN_CHECK(gpus.empty() || devices.empty(), "--gpus and --devices cannot be given together");
  LaunchOptions o;
  if (!gpus.empty()) {
    const long long n = parse_int("--gpus", gpus.c_str());
    WAN_CHECK(n >= 1 && n <= 1024, "--gpus ", n, ": expected 1..1024");
    for (int i = 0; i < n; ++i) o.devices.push_back(i);
  } else if (!devices.empty()) {
    std::set<int> seen;
    size_t p = 0;
    while (p <= devices.size()) {
      const size_t q = std::min(devices.find(',', p), devices.size());
      const std::string item = devices.substr(p, q - p);
      WAN_CHECK(!item.empty(), "--devices '", devices, "': empty entry (expected e.g. 0,1,2)");
      const long long d = parse_int("--devices entry", item.c_str());
      WAN_CHECK(d >= 0 && d < 1024, "--devices: device ", d, " is out of range");
      WAN_CHECK(seen.insert(static_cast<int>(d)).second, "--devices: device ", d, " is listed twice");
      o.devices.push_back(static_cast<int>(d));
      p = q + 1;
    }
  }
  return o;
}

namespace {

// One launcher's variables, in the order parse_launcher_env tries them.
struct Source {
  const char* name;
  const char* rank;
  std::vector<const char*> size;
  std::vector<const char*> local;
};

// The local rank: WAN_LOCAL_RANK overrides the launcher's own variable.
void read_local_rank(const EnvLookup& env, const Source& src, LauncherEnv& e) {
  const char* local_name = nullptr;
  const char* local_v = getenv_nonempty(env, "WAN_LOCAL_RANK");
  if (local_v) local_name = "WAN_LOCAL_RANK";
  for (size_t i = 0; !local_v && i < src.local.size(); ++i)
    if ((local_v = getenv_nonempty(env, src.local[i]))) local_name = src.local[i];
  if (local_v) {
    const long long l = parse_int(local_name, local_v);
    WAN_CHECK(l >= 0 && l < e.world, local_name, "=", l, " is outside 0..", e.world - 1);
    e.local_rank = static_cast<int>(l);
  } else {
    WAN_CHECK(e.world == 1, "the ", src.name, " launcher environment gives no local rank (set WAN_LOCAL_RANK)");
  }
}

// Rank 0's address: given, or loopback when the launcher says all ranks share this node.
void read_master_addr(const EnvLookup& env, LauncherEnv& e) {
  const char* addr = getenv_nonempty(env, "WAN_MASTER_ADDR");
  if (!addr) addr = getenv_nonempty(env, "MASTER_ADDR");
  if (addr) {
    e.master_addr = addr;
    return;
  }
  const char* local_size = nullptr;
  if (e.source == "OMPI") local_size = getenv_nonempty(env, "OMPI_COMM_WORLD_LOCAL_SIZE");
  if (e.source == "PMI") local_size = getenv_nonempty(env, "MPI_LOCALNRANKS");
  if (e.source == "WAN") local_size = getenv_nonempty(env, "WAN_LOCAL_WORLD_SIZE");
  bool one_node = local_size && std::strtoll(local_size, nullptr, 10) == e.world;
  if (e.source == "SLURM") {
    const char* nodes = getenv_nonempty(env, "SLURM_STEP_NUM_NODES");
    if (!nodes) nodes = getenv_nonempty(env, "SLURM_NNODES");
    one_node = nodes && !std::strcmp(nodes, "1");
  }
  if (one_node || e.world == 1) e.master_addr = "127.0.0.1";
}

void read_master_port(const EnvLookup& env, LauncherEnv& e) {
  const char* port_name = "WAN_MASTER_PORT";
  const char* port = getenv_nonempty(env, port_name);
  if (!port && (port = getenv_nonempty(env, "MASTER_PORT"))) port_name = "MASTER_PORT";
  if (port) {
    char* end = nullptr;
    const long p = std::strtol(port, &end, 10);
    WAN_CHECK(*port >= '0' && *port <= '9' && *end == '\0' && p >= 1 && p <= 65535, port_name, "='", port,
              "' is not a TCP port (1..65535)");
    e.master_port = static_cast<int>(p);
  } else {
    e.master_port = detail::kDefaultPort;
  }
}

// The job token: WAN_JOB_ID, else the launcher's job (and step) id.
void read_job(const EnvLookup& env, LauncherEnv& e) {
  if (const char* j = getenv_nonempty(env, "WAN_JOB_ID")) {
    e.job = j;
  } else if (e.source == "OMPI") {
    if (const char* jid = getenv_nonempty(env, "OMPI_MCA_ess_base_jobid")) e.job = jid;
  } else if (e.source == "SLURM") {
    const char* jid = getenv_nonempty(env, "SLURM_JOB_ID");
    const char* sid = getenv_nonempty(env, "SLURM_STEP_ID");
    if (jid) e.job = cat(jid, ".", sid ? sid : "");
  }
}

}  // namespace

std::optional<LauncherEnv> parse_launcher_env(const EnvLookup& env) {
  const Source sources[] = {
      {"WAN", "WAN_RANK", {"WAN_WORLD_SIZE"}, {"WAN_LOCAL_RANK"}},
      {"OMPI", "OMPI_COMM_WORLD_RANK", {"OMPI_COMM_WORLD_SIZE"}, {"OMPI_COMM_WORLD_LOCAL_RANK"}},
      {"PMI", "PMI_RANK", {"PMI_SIZE"}, {"MPI_LOCALRANKID", "PMI_LOCAL_RANK"}},
      {"SLURM", "SLURM_PROCID", {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}, {"SLURM_LOCALID"}},
  };
  for (const Source& src : sources) {
    const char* rank_v = getenv_nonempty(env, src.rank);
    const char* size_v = nullptr;
    const char* size_name = src.size[0];
    for (const char* n : src.size)
      if ((size_v = getenv_nonempty(env, n))) {
        size_name = n;
        break;
      }
    if (!rank_v && !size_v) continue;
    // srun sets SLURM_PROCID in every step; without a task count it says nothing about a world.
    if (!std::strcmp(src.name, "SLURM") && !size_v) continue;
    WAN_CHECK(rank_v, size_name, " is set but ", src.rank, " is not");
    WAN_CHECK(size_v, src.rank, " is set but ", src.size[0], " is not");
    LauncherEnv e;
    e.source = src.name;
    const long long world = parse_int(size_name, size_v), rank = parse_int(src.rank, rank_v);
    WAN_CHECK(world >= 1 && world <= 65536, size_name, "=", world, ": expected 1..65536");
    WAN_CHECK(rank >= 0 && rank < world, src.rank, "=", rank, " is outside 0..", world - 1, " (", size_name, "=",
              world, ")");
    e.world = static_cast<int>(world);
    e.rank = static_cast<int>(rank);
    read_local_rank(env, src, e);
    read_master_addr(env, e);
    read_master_port(env, e);
    read_job(env, e);
    return e;
  }
  return std::nullopt;
}

bool launcher_environment() {
  return parse_launcher_env([](const char* n) { return std::getenv(n); }).has_value();
}

}  // namespace wan::dist
