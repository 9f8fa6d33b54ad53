// Bootstrap choice and the parts of the MPI bootstrap that need no MPI (see bootstrap.h). The MPI
// calls are in bootstrap_mpi.cpp, compiled only when MPI is found.
#include "runtime/dist/bootstrap.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstring>

namespace wan::dist {
namespace {

const char* getenv_nonempty(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return v && *v ? v : nullptr;
}

void put_u32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
void put_str(std::string& s, const std::string& v) {
  put_u32(s, static_cast<uint32_t>(v.size()));
  s += v;
}

}  // namespace

bool mpi_built() {
#ifdef WAN_HAVE_MPI
  return true;
#else
  return false;
#endif
}

const char* bootstrap_name(BootstrapKind k) {
  return k == BootstrapKind::Tcp ? "tcp" : k == BootstrapKind::Mpi ? "mpi" : "auto";
}

BootstrapKind parse_bootstrap(const EnvLookup& env, bool built_with_mpi) {
  const char* v = getenv_nonempty(env, "WAN_BOOTSTRAP");
  if (!v || !std::strcmp(v, "auto")) return BootstrapKind::Auto;
  if (!std::strcmp(v, "tcp")) return BootstrapKind::Tcp;
  if (!std::strcmp(v, "mpi")) {
    WAN_CHECK(built_with_mpi, "WAN_BOOTSTRAP=mpi: this wan was built without MPI (install an MPI, e.g. Debian's "
              "libopenmpi-dev, and configure again; or use WAN_BOOTSTRAP=tcp with WAN_MASTER_ADDR)");
    return BootstrapKind::Mpi;
  }
  WAN_THROW("WAN_BOOTSTRAP='", v, "': expected tcp, mpi or auto");
}

bool mpi_launcher_env(const EnvLookup& env) {
  for (const char* n : {"OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (getenv_nonempty(env, n)) return true;
  return false;
}

BootstrapKind choose_bootstrap(BootstrapKind requested, const EnvLookup& env, bool built_with_mpi) {
  if (requested != BootstrapKind::Auto) return requested;
  // WAN_RANK is a launch by hand: its ranks need not be the MPI job's.
  if (built_with_mpi && mpi_launcher_env(env) && !getenv_nonempty(env, "WAN_RANK")) return BootstrapKind::Mpi;
  return BootstrapKind::Tcp;
}

std::string encode_bootstrap_info(const BootstrapInfo& info) {
  std::string s = "WANB";
  put_str(s, std::string(info.blob.begin(), info.blob.end()));
  put_str(s, info.addr);
  put_u32(s, static_cast<uint32_t>(info.port));
  put_str(s, info.job);
  return s;
}

BootstrapInfo decode_bootstrap_info(const std::string& b) {
  size_t p = 0;
  bool ok = b.compare(0, 4, "WANB") == 0;
  p = 4;
  auto u32 = [&]() -> uint32_t {
    uint32_t v = 0;
    if (!ok || p + 4 > b.size()) {
      ok = false;
      return 0;
    }
    std::memcpy(&v, b.data() + p, 4);
    p += 4;
    return v;
  };
  auto str = [&]() -> std::string {
    const uint32_t n = u32();
    if (!ok || n > b.size() - p) {
      ok = false;
      return {};
    }
    std::string v = b.substr(p, n);
    p += n;
    return v;
  };
  BootstrapInfo info;
  const std::string blob = str();
  info.blob.assign(blob.begin(), blob.end());
  info.addr = str();
  const uint32_t port = u32();
  info.job = str();
  WAN_CHECK(ok && p == b.size() && port <= 65535 && info.blob.size() <= ControlChannel::kMaxBlob,
            "MPI bootstrap: malformed message from rank 0 (", b.size(), " bytes; different wan builds in one job?)");
  info.port = static_cast<int>(port);
  return info;
}

std::string control_addresses(bool one_node) {
  if (one_node) return "127.0.0.1";
  std::string out;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0 && host[0]) out = host;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
      if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
      const std::string name = i->ifa_name ? i->ifa_name : "";
      if (name.rfind("docker", 0) == 0 || name.rfind("virbr", 0) == 0 || name.rfind("veth", 0) == 0) continue;
      char a[INET_ADDRSTRLEN] = {};
      if (!inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, a, sizeof a)) continue;
      out += cat(out.empty() ? "" : ",", a);
    }
    freeifaddrs(ifs);
  }
  WAN_CHECK(!out.empty(), "MPI bootstrap: rank 0 has neither a host name nor a network address to give the other "
            "ranks; set WAN_MASTER_ADDR");
  return out;
}

}  // namespace wan::dist
