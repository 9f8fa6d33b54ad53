// TCP rendezvous and control channel (see rendezvous.h). Wire format: frames of a 12-byte header
// (magic "WAN1", type, payload length; little-endian u32) and a payload of at most 64 KiB. Sockets are
// non-blocking; every send and receive waits in poll() against a deadline.
#include "runtime/dist/rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/clock.h"
#include "core/log.h"

namespace wan::dist {
namespace {


Clock::time_point after(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}
int ms_left(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, 1 << 30));
}

constexpr uint32_t kMagic = 0x314E4157u;  // "WAN1"
constexpr uint32_t kProtocol = 1;
constexpr size_t kHeader = 12;
constexpr size_t kMaxPayload = 1 << 16;
enum : uint32_t { kHello = 1, kWelcome, kReject, kAbort, kBarrier, kRelease, kPing };
constexpr double kPingInterval = 1.0;
constexpr double kSendTimeout = 3.0;

struct Writer {
  std::string s;
  Writer& u32(uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); return *this; }
  Writer& u64(uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); return *this; }
  Writer& str(const std::string& v) { u32(static_cast<uint32_t>(v.size())); s += v; return *this; }
};
struct Reader {
  const std::string& s;
  size_t p = 0;
  bool ok = true;
  template <typename T>
  T num() {
    T v{};
    if (p + sizeof(T) > s.size()) { ok = false; return v; }
    std::memcpy(&v, s.data() + p, sizeof(T));
    p += sizeof(T);
    return v;
  }
  std::string str() {
    const uint32_t n = num<uint32_t>();
    if (!ok || p + n > s.size()) { ok = false; return {}; }
    std::string v = s.substr(p, n);
    p += n;
    return v;
  }
};

std::string encode_failure(const Failure& f) {
  return Writer().u32(f.kind == ErrorKind::BadInput ? 0 : 1).str(f.message).s;
}
std::optional<Failure> decode_failure(const std::string& payload) {
  Reader r{payload};
  Failure f;
  f.kind = r.num<uint32_t>() == 0 ? ErrorKind::BadInput : ErrorKind::Internal;
  f.message = r.str();
  if (!r.ok || f.message.empty()) return std::nullopt;
  return f;
}

void set_socket_options(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const int fl = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

// true when every byte went out before the deadline.
bool send_all(int fd, const char* p, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pf{fd, POLLOUT, 0};
      const int ms = ms_left(deadline);
      if (ms == 0) return false;
      if (::poll(&pf, 1, ms) < 0 && errno != EINTR) return false;
      continue;
    }
    return false;
  }
  return true;
}
bool send_frame(int fd, uint32_t type, const std::string& payload, Clock::time_point deadline) {
  std::string f = Writer().u32(kMagic).u32(type).u32(static_cast<uint32_t>(payload.size())).s;
  f += payload;
  return send_all(fd, f.data(), f.size(), deadline);
}

enum RecvResult { kOk = 1, kEof = 0, kErr = -1, kTimeout = -2, kBadFrame = -3 };
RecvResult recv_all(int fd, char* p, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k == 0) return kEof;
    if (errno == EINTR) continue;
    if (errno == ECONNRESET) return kEof;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return kErr;
    pollfd pf{fd, POLLIN, 0};
    const int ms = ms_left(deadline);
    if (ms == 0) return kTimeout;
    if (::poll(&pf, 1, ms) < 0 && errno != EINTR) return kErr;
  }
  return kOk;
}
RecvResult recv_frame(int fd, uint32_t& type, std::string& payload, Clock::time_point deadline) {
  char h[kHeader];
  RecvResult r = recv_all(fd, h, kHeader, deadline);
  if (r != kOk) return r;
  uint32_t magic, len;
  std::memcpy(&magic, h, 4);
  std::memcpy(&type, h + 4, 4);
  std::memcpy(&len, h + 8, 4);
  if (magic != kMagic || len > kMaxPayload) return kBadFrame;
  payload.assign(len, '\0');
  return len ? recv_all(fd, payload.data(), len, deadline) : kOk;
}

// Listens on every local address (dual-stack IPv6, else IPv4) at `port`.
int listen_on(int port, int& bound) {
  int last = 0;
  for (int fam : {AF_INET6, AF_INET}) {
    const int fd = ::socket(fam, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last = errno;
      continue;
    }
    const int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage ss{};
    socklen_t len;
    if (fam == AF_INET6) {
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      a->sin6_port = htons(static_cast<uint16_t>(port));
      len = sizeof(sockaddr_in6);
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      a->sin_port = htons(static_cast<uint16_t>(port));
      len = sizeof(sockaddr_in);
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(fd, 256) != 0) {
      last = errno;
      ::close(fd);
      if (last == EADDRINUSE)
        throw Error(cat("rendezvous: rank 0 cannot listen on TCP port ", port,
                        ": address already in use (another job or program holds WAN_MASTER_PORT=", port,
                        "; choose a free port)"));
      continue;
    }
    sockaddr_storage got{};
    socklen_t glen = sizeof got;
    getsockname(fd, reinterpret_cast<sockaddr*>(&got), &glen);
    bound = ntohs(got.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&got)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&got)->sin_port);
    set_socket_options(fd);
    return fd;
  }
  throw Error(cat("rendezvous: rank 0 cannot listen on TCP port ", port, ": ", std::strerror(last)));
}

// One non-blocking connect attempt bounded by timeout_ms. Returns the fd or -1 (err set).
int connect_once(const addrinfo* ai, int timeout_ms, int& err) {
  const int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    err = errno;
    return -1;
  }
  if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) return fd;
  if (errno != EINPROGRESS) {
    err = errno;
    ::close(fd);
    return -1;
  }
  pollfd pf{fd, POLLOUT, 0};
  const int k = ::poll(&pf, 1, timeout_ms);
  int so = 0;
  socklen_t sl = sizeof so;
  if (k <= 0) {
    err = k == 0 ? ETIMEDOUT : errno;
  } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl) != 0 || so != 0) {
    err = so ? so : errno;
  } else {
    return fd;
  }
  ::close(fd);
  return -1;
}

}  // namespace

struct ControlChannel::Conn {
  int fd = -1;
  int peer = -1;
  std::mutex send_mu;
  std::string inbuf;              // I/O thread only
  Clock::time_point last_rx;      // I/O thread only
  std::atomic<bool> eof{false};
  ~Conn() {
    if (fd >= 0) ::close(fd);
  }
};

int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  WAN_CHECK(fd >= 0, "socket: ", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  WAN_CHECK(ok, "cannot find a free TCP port: ", std::strerror(errno));
  return ntohs(a.sin_port);
}

ControlChannel::ControlChannel(const RendezvousConfig& cfg) : cfg_(cfg) {}

TcpListener::TcpListener(int port) {
  WAN_CHECK(port >= 0 && port <= 65535, "rendezvous: TCP port ", port, " is outside 0..65535");
  fd_ = listen_on(port, port_);
}
TcpListener::~TcpListener() {
  if (fd_ >= 0) ::close(fd_);
}
int TcpListener::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

std::unique_ptr<ControlChannel> ControlChannel::open(const RendezvousConfig& cfg, std::vector<uint8_t> blob,
                                                     FailureHandler on_failure,
                                                     std::unique_ptr<TcpListener> listener) {
  WAN_CHECK(cfg.world >= 1 && cfg.rank >= 0 && cfg.rank < cfg.world, "rendezvous: rank ", cfg.rank,
            " is outside world size ", cfg.world);
  WAN_CHECK(cfg.port >= 0 && cfg.port <= 65535, "rendezvous: TCP port ", cfg.port, " is outside 0..65535");
  WAN_CHECK(cfg.rank == 0 || cfg.port > 0, "rendezvous: rank ", cfg.rank, " needs rank 0's port (WAN_MASTER_PORT)");
  WAN_CHECK(cfg.rank == 0 || !cfg.addr.empty(), "rendezvous: rank ", cfg.rank,
            " needs rank 0's address (WAN_MASTER_ADDR)");
  WAN_CHECK(cfg.timeout_s > 0, "rendezvous: timeout must be positive");
  WAN_CHECK(blob.size() <= kMaxBlob, "rendezvous: blob of ", blob.size(), " bytes is over ", kMaxBlob);
  WAN_ASSERT(!listener || cfg.rank == 0, "rendezvous: only rank 0 listens");
  std::unique_ptr<ControlChannel> ch(new ControlChannel(cfg));
  ch->on_failure_ = std::move(on_failure);
  ch->conns_.resize(cfg.rank == 0 ? cfg.world : 1);
  if (::pipe2(ch->wake_, O_CLOEXEC | O_NONBLOCK) != 0) WAN_THROW_INTERNAL("pipe2: ", std::strerror(errno));
  if (cfg.rank == 0) {
    ch->blob_ = std::move(blob);
    int lfd = -1;
    if (listener) {
      ch->port_ = listener->port();
      lfd = listener->release();
    } else {
      lfd = listen_on(cfg.port, ch->port_);
    }
    try {
      ch->serve(lfd);
    } catch (...) {
      ::close(lfd);
      throw;
    }
    ::close(lfd);
  } else {
    ch->port_ = cfg.port;
    ch->join();
  }
  const auto now = Clock::now();
  for (auto& c : ch->conns_)
    if (c) c->last_rx = now;
  ch->io_ = std::thread([p = ch.get()] { p->io_loop(); });
  return ch;
}

void ControlChannel::serve(int lfd) {
  const auto t0 = Clock::now();
  const auto deadline = after(cfg_.timeout_s);
  int joined = 0;
  // A fatal rendezvous error: every rank already connected (and the offender) gets the same message.
  auto fatal = [&](const std::string& msg, ErrorKind kind, int offender_fd) {
    const Failure f{cat("rendezvous: ", msg), kind};
    const std::string pl = encode_failure(f);
    if (offender_fd >= 0) {
      send_frame(offender_fd, kReject, pl, after(1.0));
      ::close(offender_fd);
    }
    for (auto& c : conns_)
      if (c) send_frame(c->fd, kAbort, pl, after(1.0));
    conns_.clear();
    throw Error(f.message, f.kind);
  };
  LOG_INFO("dist: rank 0 waits for ", cfg_.world - 1, " ranks on TCP port ", port_);
  while (joined < cfg_.world - 1) {
    const int ms = ms_left(deadline);
    if (ms == 0) {
      std::string missing;
      int shown = 0;
      for (int r = 1; r < cfg_.world; ++r) {
        if (conns_[r]) continue;
        if (shown++ < 16) missing += cat(missing.empty() ? "" : ", ", r);
      }
      if (shown > 16) missing += cat(" and ", shown - 16, " more");
      fatal(cat("timed out after ", cfg_.timeout_s, " s: rank 0 (port ", port_, ") heard from ", joined, " of ",
                cfg_.world - 1, " ranks; missing rank", (shown > 1 ? "s " : " "), missing,
                " (did they start, with the same WAN_MASTER_ADDR/PORT? WAN_DIST_TIMEOUT sets the limit)"),
            ErrorKind::Internal, -1);
    }
    pollfd pf{lfd, POLLIN, 0};
    if (::poll(&pf, 1, std::min(ms, 500)) <= 0) continue;
    const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    set_socket_options(fd);
    uint32_t type = 0;
    std::string pl;
    const RecvResult rr = recv_frame(fd, type, pl, std::min(deadline, after(2.0)));
    if (rr != kOk || type != kHello) {
      LOG_WARN("dist: rank 0 ignored a connection that did not say hello (not a wan rank?)");
      ::close(fd);
      continue;
    }
    Reader r{pl};
    const uint32_t protocol = r.num<uint32_t>();
    const int32_t rank = r.num<int32_t>(), world = r.num<int32_t>();
    const std::string job = r.str();
    if (!r.ok) {
      LOG_WARN("dist: rank 0 ignored a malformed hello");
      ::close(fd);
      continue;
    }
    if (job != cfg_.job) {  // a rank of another job that got this port: refuse it, keep waiting
      send_frame(fd, kReject,
                 encode_failure({cat("rendezvous: rank 0 at port ", port_, " belongs to job '", cfg_.job,
                                     "', not '", job, "'"), ErrorKind::BadInput}),
                 after(1.0));
      ::close(fd);
      continue;
    }
    if (protocol != kProtocol)
      fatal(cat("rank ", rank, " speaks control protocol ", protocol, ", rank 0 speaks ", kProtocol,
                " (different wan builds in one job)"), ErrorKind::BadInput, fd);
    if (world != cfg_.world)
      fatal(cat("rank ", rank, " was started with world size ", world, " but rank 0 with ", cfg_.world,
                " (the launcher's variables differ between processes)"), ErrorKind::BadInput, fd);
    if (rank < 0 || rank >= cfg_.world)
      fatal(cat("a process claims rank ", rank, ", outside 0..", cfg_.world - 1, " (world size ", cfg_.world, ")"),
            ErrorKind::BadInput, fd);
    if (rank == 0 || conns_[rank])
      fatal(cat("two processes claim rank ", rank, " (world size ", cfg_.world, ")"), ErrorKind::BadInput, fd);
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->peer = rank;
    conns_[rank] = std::move(c);
    ++joined;
    LOG_DEBUG("dist: rank ", rank, " joined (", joined, "/", cfg_.world - 1, ")");
  }
  const std::string welcome = Writer().str(std::string(blob_.begin(), blob_.end())).s;
  for (auto& c : conns_) {
    if (c && !send_frame(c->fd, kWelcome, welcome, after(kSendTimeout)))
      fatal(cat("rank ", c->peer, " closed its connection during the rendezvous"), ErrorKind::Internal, -1);
  }
  LOG_INFO("dist: rendezvous of ", cfg_.world, " ranks done in ", seconds_since(t0), " s");
}

void ControlChannel::join() {
  const auto deadline = after(cfg_.timeout_s);
  const std::string where = cat(cfg_.addr, ":", cfg_.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  // Every candidate address that resolves (a list separated by commas; usually one).
  std::vector<std::string> names;
  for (size_t p = 0; p <= cfg_.addr.size();) {
    const size_t q = std::min(cfg_.addr.find(',', p), cfg_.addr.size());
    if (q > p) names.push_back(cfg_.addr.substr(p, q - p));
    p = q + 1;
  }
  struct Resolved {
    std::vector<addrinfo*> lists;
    ~Resolved() {
      for (addrinfo* r : lists) ::freeaddrinfo(r);
    }
  } res;
  for (;;) {
    int g = EAI_NONAME;
    bool again = false;
    for (const std::string& n : names) {
      addrinfo* r = nullptr;
      const int k = ::getaddrinfo(n.c_str(), std::to_string(cfg_.port).c_str(), &hints, &r);
      if (k == 0) {
        res.lists.push_back(r);
      } else {
        g = k;
        again = again || k == EAI_AGAIN;
      }
    }
    if (!res.lists.empty()) break;
    if (!again || ms_left(deadline) == 0)
      throw Error(cat("rendezvous: cannot resolve rank 0's address '", cfg_.addr, "' (WAN_MASTER_ADDR): ",
                      gai_strerror(g)));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  int fd = -1, err = 0;
  while (fd < 0) {
    for (addrinfo* list : res.lists)
      for (addrinfo* ai = list; ai && fd < 0; ai = ai->ai_next)
        fd = connect_once(ai, std::max(1, std::min(1000, ms_left(deadline))), err);
    if (fd >= 0) break;
    if (ms_left(deadline) == 0)
      throw Error(cat("rendezvous: timed out after ", cfg_.timeout_s, " s: rank ", cfg_.rank,
                      " cannot reach rank 0 at ", where, " (", std::strerror(err),
                      "; check WAN_MASTER_ADDR/WAN_MASTER_PORT and that rank 0 started)"),
                  ErrorKind::Internal);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  set_socket_options(fd);
  auto c = std::make_unique<Conn>();
  c->fd = fd;
  c->peer = 0;
  const std::string hello = Writer()
                                .u32(kProtocol)
                                .u32(static_cast<uint32_t>(cfg_.rank))
                                .u32(static_cast<uint32_t>(cfg_.world))
                                .str(cfg_.job)
                                .s;
  if (!send_frame(fd, kHello, hello, after(kSendTimeout)))
    throw Error(cat("rendezvous: rank ", cfg_.rank, " lost its connection to rank 0 at ", where), ErrorKind::Internal);
  // Rank 0 answers when every rank has joined; it reports its own timeout first, so wait a little longer.
  uint32_t type = 0;
  std::string pl;
  const RecvResult rr = recv_frame(fd, type, pl, deadline + (after(std::min(5.0, cfg_.timeout_s)) - Clock::now()));
  if (rr == kTimeout)
    throw Error(cat("rendezvous: timed out after ", cfg_.timeout_s, " s: rank ", cfg_.rank, " connected to ", where,
                    " but got no answer (is that a wan rank 0, and did every rank start?)"),
                ErrorKind::Internal);
  if (rr == kEof || rr == kErr)
    throw Error(cat("rendezvous: rank 0 at ", where, " closed the connection before the rendezvous ended"),
                ErrorKind::Internal);
  if (rr == kBadFrame) throw Error(cat("rendezvous: ", where, " is not a wan rank 0 (unexpected reply)"));
  if (type == kReject || type == kAbort) {
    const auto f = decode_failure(pl);
    if (!f) throw Error(cat("rendezvous: rank 0 at ", where, " refused rank ", cfg_.rank));
    throw Error(f->message, f->kind);
  }
  Reader r{pl};
  const std::string b = r.str();
  if (type != kWelcome || !r.ok) throw Error(cat("rendezvous: ", where, " is not a wan rank 0 (unexpected reply)"));
  blob_.assign(b.begin(), b.end());
  conns_[0] = std::move(c);
}

ControlChannel::~ControlChannel() {
  if (io_.joinable()) close(0.5);
  if (wake_[0] >= 0) ::close(wake_[0]);
  if (wake_[1] >= 0) ::close(wake_[1]);
}

void ControlChannel::send_to(int peer, uint32_t type, const std::string& payload) {
  Conn* c = cfg_.rank == 0 ? (peer > 0 && peer < static_cast<int>(conns_.size()) ? conns_[peer].get() : nullptr)
                           : conns_[0].get();
  if (!c || c->eof) return;
  bool ok;
  {
    std::lock_guard<std::mutex> lk(c->send_mu);
    ok = send_frame(c->fd, type, payload, after(kSendTimeout));
  }
  if (!ok) lost(c->peer, "cannot send to it (connection broken or peer frozen)");
}

void ControlChannel::set_verdict(const Failure& f) {
  {
    std::lock_guard<std::recursive_mutex> out(send_all_mu_);  // close() waits for the broadcast
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (verdict_) return;
      verdict_ = f;
    }
    if (cfg_.rank == 0) {
      const std::string pl = encode_failure(f);
      for (auto& c : conns_)
        if (c) send_to(c->peer, kAbort, pl);
    }
  }
  if (on_failure_) on_failure_(f);  // before waking barrier waiters, so they find it recorded
  cv_.notify_all();
}

void ControlChannel::lost(int peer, const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closing_ || verdict_) return;
  }
  set_verdict({cat("lost peer rank ", peer, ": ", why), ErrorKind::Internal});
}

void ControlChannel::report_failure(const Failure& f) {
  if (cfg_.rank == 0) {
    set_verdict(f);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (verdict_) return;
  }
  send_to(0, kAbort, encode_failure(f));
}

std::optional<Failure> ControlChannel::verdict() const {
  std::lock_guard<std::mutex> lk(mu_);
  return verdict_;
}

std::optional<Failure> ControlChannel::wait_verdict(double timeout_s) const {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_until(lk, after(timeout_s), [&] { return verdict_.has_value() || stop_; });
  return verdict_;
}

void ControlChannel::release(uint64_t gen, bool final) {
  {
    std::lock_guard<std::recursive_mutex> out(send_all_mu_);
    {
      std::lock_guard<std::mutex> lk(mu_);
      arrivals_.erase(gen);
      if (final) closing_ = true;
    }
    // Peers first: once the local waiter wakes it may close the channel.
    const std::string pl = Writer().u64(gen).u32(final ? 1 : 0).s;
    for (auto& c : conns_)
      if (c) send_to(c->peer, kRelease, pl);
    std::lock_guard<std::mutex> lk(mu_);
    released_gen_ = std::max(released_gen_, gen);
  }
  cv_.notify_all();
}

bool ControlChannel::barrier(bool final) {
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (verdict_) return false;
    gen = ++my_gen_;
  }
  if (cfg_.rank == 0) {
    bool complete;
    {
      std::lock_guard<std::mutex> lk(mu_);
      complete = ++arrivals_[gen] == cfg_.world;
    }
    if (complete) release(gen, final);
  } else {
    send_to(0, kBarrier, Writer().u64(gen).u32(final ? 1 : 0).s);
  }
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return verdict_.has_value() || released_gen_ >= gen || stop_; });
  return released_gen_ >= gen;
}

void ControlChannel::handle(int peer, uint32_t type, const std::string& payload) {
  if (type == kPing) return;
  if (type == kAbort) {
    if (auto f = decode_failure(payload)) set_verdict(*f);
    return;
  }
  Reader r{payload};
  const uint64_t gen = r.num<uint64_t>();
  const bool final = r.num<uint32_t>() != 0;
  if (!r.ok) return;
  if (cfg_.rank == 0 && type == kBarrier) {
    bool complete;
    {
      std::lock_guard<std::mutex> lk(mu_);
      complete = ++arrivals_[gen] == cfg_.world;
    }
    if (complete) release(gen, final);
  } else if (cfg_.rank != 0 && type == kRelease) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      released_gen_ = std::max(released_gen_, gen);
      if (final) closing_ = true;
    }
    cv_.notify_all();
  } else {
    LOG_WARN("dist: unexpected control message ", type, " from rank ", peer);
  }
}

void ControlChannel::io_loop() {
  auto last_ping = Clock::now();
  std::vector<pollfd> pfs;
  std::vector<Conn*> who;
  char buf[4096];
  for (;;) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stop_) return;
    }
    pfs.assign(1, pollfd{wake_[0], POLLIN, 0});
    who.assign(1, nullptr);
    for (auto& c : conns_) {
      if (!c || c->eof) continue;
      pfs.push_back(pollfd{c->fd, POLLIN, 0});
      who.push_back(c.get());
    }
    ::poll(pfs.data(), pfs.size(), 200);
    if (pfs[0].revents) {
      while (::read(wake_[0], buf, sizeof buf) > 0) {
      }
    }
    for (size_t i = 1; i < pfs.size(); ++i) {
      if (!pfs[i].revents) continue;
      Conn* c = who[i];
      bool closed = false;
      for (;;) {
        const ssize_t k = ::recv(c->fd, buf, sizeof buf, 0);
        if (k > 0) {
          c->inbuf.append(buf, static_cast<size_t>(k));
          c->last_rx = Clock::now();
          continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        closed = true;  // 0 = orderly close; ECONNRESET etc. = the peer is gone
        break;
      }
      bool bad = false;
      while (c->inbuf.size() >= kHeader) {
        uint32_t magic, type, len;
        std::memcpy(&magic, c->inbuf.data(), 4);
        std::memcpy(&type, c->inbuf.data() + 4, 4);
        std::memcpy(&len, c->inbuf.data() + 8, 4);
        if (magic != kMagic || len > kMaxPayload) {
          bad = true;
          break;
        }
        if (c->inbuf.size() < kHeader + len) break;
        const std::string payload = c->inbuf.substr(kHeader, len);
        c->inbuf.erase(0, kHeader + len);
        handle(c->peer, type, payload);
      }
      if (bad || closed) {
        c->eof = true;
        cv_.notify_all();
        lost(c->peer, bad ? "protocol error on its connection"
                          : "its connection closed (the process exited, crashed or was killed)");
      }
    }
    bool closing;
    {
      std::lock_guard<std::mutex> lk(mu_);
      closing = closing_;
    }
    if (!closing && seconds_since(last_ping) >= kPingInterval) {
      last_ping = Clock::now();
      for (auto& c : conns_)
        if (c && !c->eof) send_to(c->peer, kPing, {});
    }
    if (!closing) {
      for (auto& c : conns_) {
        if (!c || c->eof) continue;
        if (seconds_since(c->last_rx) > cfg_.heartbeat_timeout_s)
          lost(c->peer, cat("no heartbeat for more than ", cfg_.heartbeat_timeout_s,
                            " s (process or host frozen, or network down; WAN_DIST_PEER_TIMEOUT)"));
      }
    }
  }
}

void ControlChannel::close(double drain_s) {
  {
    std::lock_guard<std::recursive_mutex> out(send_all_mu_);  // no broadcast is cut short
    std::lock_guard<std::mutex> lk(mu_);
    closing_ = true;
  }
  if (cfg_.rank == 0 && io_.joinable()) {
    // Half-close, then let the I/O thread read until every peer has closed: a peer never loses the
    // last message to a reset caused by unread data on our side.
    for (auto& c : conns_)
      if (c && !c->eof) ::shutdown(c->fd, SHUT_WR);
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_until(lk, after(drain_s), [&] {
      for (auto& c : conns_)
        if (c && !c->eof) return false;
      return true;
    });
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (wake_[1] >= 0) {
    const char b = 1;
    [[maybe_unused]] ssize_t w = ::write(wake_[1], &b, 1);
  }
  if (io_.joinable()) io_.join();
  conns_.clear();
}

}  // namespace wan::dist
