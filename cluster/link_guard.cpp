// The guard in front of every cluster link (cluster/link_guard.hpp): TLS contexts, the front a
// coordinator listens with, the dialer a node or session connects with, and the pump between a link and
// CAF's end of it, which checks BASP's framing on the way in.
#include "cluster/link_guard.hpp"
#include "transport/sockets.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <vector>
#include <thread>

namespace troupe::cluster {

class tls_context {
 public:
  explicit tls_context(SSL_CTX* c) : ctx(c) {}
  ~tls_context() { SSL_CTX_free(ctx); }
  tls_context(const tls_context&) = delete;
  tls_context& operator=(const tls_context&) = delete;
  SSL_CTX* ctx;
};

namespace {

using clock = std::chrono::steady_clock;

std::string ssl_reason() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? std::string("no reason given") : out;
}

result<std::shared_ptr<tls_context>, std::string> make_tls(const tls_files& f, bool server) {
  if (f.certificate.empty() || f.key.empty() || f.ca_file.empty()) return unexpected(std::string("TLS needs a certificate, its key and the cluster's CA"));
  // OpenSSL writes to the socket with write(2): a peer that closed mid-handshake would raise SIGPIPE
  // and kill the process. Every write here handles EPIPE as a closed link instead.
  static std::once_flag ignore_sigpipe;
  std::call_once(ignore_sigpipe, [] { std::signal(SIGPIPE, SIG_IGN); });
  ERR_clear_error();
  SSL_CTX* raw = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (!raw) return unexpected("cannot make a TLS context: " + ssl_reason());
  auto ctx = std::make_shared<tls_context>(raw);
  SSL_CTX_set_min_proto_version(raw, TLS1_3_VERSION);
  SSL_CTX_set_mode(raw, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (server) SSL_CTX_set_num_tickets(raw, 0);  // no resumption: every link proves its certificate
  if (SSL_CTX_use_certificate_chain_file(raw, f.certificate.c_str()) != 1) return unexpected("the certificate " + f.certificate + ": " + ssl_reason());
  if (SSL_CTX_use_PrivateKey_file(raw, f.key.c_str(), SSL_FILETYPE_PEM) != 1) return unexpected("the key " + f.key + ": " + ssl_reason());
  if (SSL_CTX_check_private_key(raw) != 1) return unexpected("the key " + f.key + " does not match " + f.certificate + ": " + ssl_reason());
  if (SSL_CTX_load_verify_locations(raw, f.ca_file.c_str(), nullptr) != 1) return unexpected("the CA " + f.ca_file + ": " + ssl_reason());
  SSL_CTX_set_verify(raw, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return ctx;
}

using transport::set_nonblocking;
void no_delay(int fd) { transport::set_no_delay(fd); }

std::string peer_of(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (a.ss_family == AF_INET) ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof buf);
  else if (a.ss_family == AF_INET6) ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, buf, sizeof buf);
  return buf;
}

std::string subject_of(SSL* ssl) {
  X509* cert = SSL_get1_peer_certificate(ssl);
  if (!cert) return "?";
  char cn[256] = "?";
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn);
  X509_free(cert);
  return cn;
}

// Runs a TLS handshake (accept or connect) on a non-blocking socket until `until`. Empty on success,
// otherwise why not ("timeout" first when the deadline passed).
std::string handshake(SSL* ssl, int fd, bool accept, clock::time_point until) {
  for (;;) {
    ERR_clear_error();
    const int r = accept ? SSL_accept(ssl) : SSL_connect(ssl);
    if (r == 1) return {};
    const int e = SSL_get_error(ssl, r);
    short events = 0;
    if (e == SSL_ERROR_WANT_READ) events = POLLIN;
    else if (e == SSL_ERROR_WANT_WRITE) events = POLLOUT;
    else {
      const auto why = ssl_reason();
      return why == "no reason given" ? std::string("the peer closed the connection") : why;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now()).count();
    if (left <= 0) return "timeout";
    pollfd p{fd, events, 0};
    if (::poll(&p, 1, static_cast<int>(left)) == 0) return "timeout";
  }
}

// A byte queue with a read offset (appends at the back, consumption from the front).
struct byte_queue {
  std::string data;
  std::size_t off = 0;
  std::size_t size() const { return data.size() - off; }
  bool empty() const { return size() == 0; }
  const char* front() const { return data.data() + off; }
  void consume(std::size_t n) {
    off += n;
    if (off == data.size()) data.clear(), off = 0;
    else if (off > (std::size_t{1} << 20)) data.erase(0, off), off = 0;
  }
};

// One side of a link: a socket, with TLS over it when `ssl` is set.
struct endpoint {
  int fd = -1;
  SSL* ssl = nullptr;
  bool want_write_to_read = false;  // SSL_read asked for a writable socket
  bool want_read_to_write = false;  // SSL_write asked for a readable socket
  // >0 bytes read, 0 nothing now, -1 closed or failed
  ssize_t read(char* buf, std::size_t n) {
    if (!ssl) {
      const ssize_t r = ::recv(fd, buf, n, 0);
      if (r > 0) return r;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
      return -1;
    }
    ERR_clear_error();
    want_write_to_read = false;
    const int r = SSL_read(ssl, buf, static_cast<int>(n));
    if (r > 0) return r;
    const int e = SSL_get_error(ssl, r);
    if (e == SSL_ERROR_WANT_READ) return 0;
    if (e == SSL_ERROR_WANT_WRITE) return want_write_to_read = true, 0;
    return -1;
  }
  ssize_t write(const char* buf, std::size_t n) {
    if (!ssl) {
      const ssize_t r = ::send(fd, buf, n, MSG_NOSIGNAL);
      if (r >= 0) return r;
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
      return -1;
    }
    ERR_clear_error();
    want_read_to_write = false;
    const int r = SSL_write(ssl, buf, static_cast<int>(std::min<std::size_t>(n, 1 << 20)));
    if (r > 0) return r;
    const int e = SSL_get_error(ssl, r);
    if (e == SSL_ERROR_WANT_WRITE) return 0;
    if (e == SSL_ERROR_WANT_READ) return want_read_to_write = true, 0;
    return -1;
  }
  bool has_pending() const { return ssl && SSL_pending(ssl) > 0; }
  void close() {
    if (ssl) {
      SSL_shutdown(ssl);  // best effort: a close_notify if the socket takes it
      SSL_free(ssl);
      ssl = nullptr;
    }
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

struct pump_result {
  std::string why;  // empty: a side closed; otherwise the framing refusal or "timeout"
  std::uint64_t in_bytes = 0, out_bytes = 0;
};

// Pumps bytes between the network side and CAF's side until either closes, `stop` is set or the
// frames from the network break BASP's framing. While `first_frame_by` is set, the network side must
// deliver a complete frame before it (a plain link's only proof of life); `on_first_frame` runs once.
template <class OnFirst>
pump_result pump(endpoint& net, int inner, frame_checker& check, const std::atomic<bool>& stop, std::optional<clock::time_point> first_frame_by,
                 OnFirst on_first_frame) {
  constexpr std::size_t cap = std::size_t{4} << 20;  // bytes buffered per direction
  byte_queue to_inner, to_net;
  bool net_closed = false, inner_closed = false, first_seen = false;
  pump_result out;
  std::vector<char> buf(std::size_t{1} << 16);
  while (!stop.load(std::memory_order_relaxed)) {
    if (first_frame_by && !first_seen && clock::now() > *first_frame_by) return out.why = "timeout", out;
    pollfd p[2] = {{net_closed ? -1 : net.fd, 0, 0}, {inner_closed ? -1 : inner, 0, 0}};
    if (to_inner.size() < cap) p[0].events |= POLLIN;
    if (!to_net.empty()) p[0].events |= net.want_read_to_write ? POLLIN : POLLOUT;
    if (net.want_write_to_read) p[0].events |= POLLOUT;
    if (to_net.size() < cap) p[1].events |= POLLIN;
    if (!to_inner.empty()) p[1].events |= POLLOUT;
    if (::poll(p, 2, net.has_pending() ? 0 : 200) < 0 && errno != EINTR) break;
    // network -> CAF, checked
    while (!net_closed && to_inner.size() < cap) {
      const ssize_t n = net.read(buf.data(), buf.size());
      if (n < 0) net_closed = true;
      if (n <= 0) break;
      out.in_bytes += static_cast<std::uint64_t>(n);
      if (!check.feed(buf.data(), static_cast<std::size_t>(n))) return out.why = check.why(), out;
      to_inner.data.append(buf.data(), static_cast<std::size_t>(n));
      if (!first_seen && check.frames() > 0) first_seen = true, on_first_frame();
    }
    while (!to_inner.empty()) {
      const ssize_t w = ::send(inner, to_inner.front(), to_inner.size(), MSG_NOSIGNAL);
      if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return out;
      if (w <= 0) break;
      to_inner.consume(static_cast<std::size_t>(w));
    }
    // CAF -> network
    while (!inner_closed && to_net.size() < cap) {
      const ssize_t n = ::recv(inner, buf.data(), buf.size(), 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) inner_closed = true;
      if (n <= 0) break;
      to_net.data.append(buf.data(), static_cast<std::size_t>(n));
    }
    while (!to_net.empty()) {
      const ssize_t w = net.write(to_net.front(), to_net.size());
      if (w < 0) return out;
      if (w == 0) break;
      out.out_bytes += static_cast<std::uint64_t>(w);
      to_net.consume(static_cast<std::size_t>(w));
    }
    if (net_closed && to_inner.empty()) break;
    if (inner_closed && to_net.empty()) break;
  }
  return out;
}

// Refusals are logged at most once a second per reason, with the count of those not logged.
class refusal_log {
 public:
  void note(const std::string& reason, const std::string& peer) {
    std::lock_guard lock(m_);
    auto& e = by_reason_[reason];
    const auto now = clock::now();
    if (now - e.last < std::chrono::seconds(1)) {
      ++e.suppressed;
      return;
    }
    spdlog::warn("event=link_refused peer={} reason={} suppressed={}", peer, reason, e.suppressed);
    e.last = now, e.suppressed = 0;
  }

 private:
  struct entry {
    clock::time_point last{};
    std::uint64_t suppressed = 0;
  };
  std::mutex m_;
  std::map<std::string, entry> by_reason_;
};

}  // namespace

result<std::shared_ptr<tls_context>, std::string> server_tls(const tls_files& f) { return make_tls(f, true); }
result<std::shared_ptr<tls_context>, std::string> client_tls(const tls_files& f) { return make_tls(f, false); }

bool frame_checker::feed(const char* data, std::size_t n) {
  if (!why_.empty()) return false;
  while (n > 0) {
    if (payload_left_ > 0) {
      const auto take = static_cast<std::size_t>(std::min<std::uint64_t>(payload_left_, n));
      payload_left_ -= take, data += take, n -= take;
      if (payload_left_ == 0) ++frames_;
      continue;
    }
    const std::size_t take = std::min(n, sizeof header_ - have_);
    std::memcpy(header_ + have_, data, take);
    have_ += take, data += take, n -= take;
    if (have_ < sizeof header_) break;
    have_ = 0;
    const unsigned op = header_[0];
    const std::uint32_t len = (std::uint32_t{header_[4]} << 24) | (std::uint32_t{header_[5]} << 16) | (std::uint32_t{header_[6]} << 8) | header_[7];
    if (op > 6) {
      why_ = "unknown_operation_" + std::to_string(op);
      return false;
    }
    if (len > max_) {
      why_ = "frame_too_large claimed=" + std::to_string(len) + " limit=" + std::to_string(max_);
      return false;
    }
    if (len == 0) ++frames_;
    payload_left_ = len;
  }
  return true;
}

bool is_loopback(const std::string& host) {
  if (host == "localhost") return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return false;
  bool all = true;
  for (auto* a = res; a; a = a->ai_next) {
    if (a->ai_family == AF_INET) all &= (ntohl(reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr.s_addr) >> 24) == 127;
    else if (a->ai_family == AF_INET6) all &= IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr) != 0;
    else all = false;
  }
  ::freeaddrinfo(res);
  return all;
}

// ---- the front --------------------------------------------------------------------------------------------

struct link_front::impl {
  struct shared {
    link_limits limits;
    std::shared_ptr<tls_context> tls;
    std::function<int()> inner;
    std::atomic<bool> stop{false};
    std::mutex m;
    std::condition_variable cv;
    int threads = 0;  // connection threads still running
    link_counters counters;
    std::map<std::string, int> pending_of, links_of;
    std::map<std::string, std::deque<clock::time_point>> failures_of;
    std::map<std::string, clock::time_point> backoff_until;
    refusal_log refusals;
  };
  std::shared_ptr<shared> sh = std::make_shared<shared>();
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  int port = 0;
  std::thread acceptor;

  void accept_loop();
};

namespace {

// One accepted connection, from its handshake to its close.
void serve_connection(std::shared_ptr<link_front::impl::shared> sh, int fd, std::string peer) {
  const auto until = clock::now() + sh->limits.handshake_deadline;
  bool pending = true;
  auto leave_pending = [&](bool authenticated) {
    std::lock_guard lock(sh->m);
    if (!pending) return;
    pending = false;
    --sh->counters.pending;
    if (--sh->pending_of[peer] == 0) sh->pending_of.erase(peer);
    if (authenticated) {
      ++sh->counters.authenticated;
      ++sh->counters.links;
      ++sh->links_of[peer];
    }
  };
  auto failed = [&](bool timeout, const std::string& why) {
    std::lock_guard lock(sh->m);
    ++(timeout ? sh->counters.handshake_timeout : sh->counters.handshake_failed);
    auto& f = sh->failures_of[peer];
    const auto now = clock::now();
    f.push_back(now);
    while (!f.empty() && now - f.front() > sh->limits.backoff) f.pop_front();
    if (static_cast<int>(f.size()) >= sh->limits.failures_before_backoff) {
      sh->backoff_until[peer] = now + sh->limits.backoff;
      f.clear();
      spdlog::warn("event=link_backoff peer={} seconds={}", peer, std::chrono::duration_cast<std::chrono::seconds>(sh->limits.backoff).count());
    }
    sh->refusals.note(timeout ? "handshake_timeout" : "handshake_failed", peer + " (" + why + ")");
  };
  endpoint net{fd};
  bool was_link = false;
  if (sh->tls) {
    net.ssl = SSL_new(sh->tls->ctx);
    SSL_set_fd(net.ssl, fd);
    const auto why = handshake(net.ssl, fd, true, until);
    if (!why.empty()) {
      leave_pending(false);
      failed(why == "timeout", why);
    } else {
      leave_pending(true);
      was_link = true;
      spdlog::info("event=link_authenticated peer={} subject={}", peer, subject_of(net.ssl));
    }
  }
  if (!sh->tls || was_link) {
    const int inner = sh->inner();
    if (inner < 0) {
      spdlog::error("event=link_inner_unreachable peer={}", peer);
      leave_pending(false);
    } else {
      frame_checker check(sh->limits.max_frame_bytes);
      std::optional<clock::time_point> first_by;
      if (!sh->tls) first_by = until;
      auto r = pump(net, inner, check, sh->stop, first_by, [&] {
        leave_pending(true);
        was_link = true;
      });
      ::close(inner);
      if (r.why == "timeout") leave_pending(false), failed(true, "no frame in time");
      else if (!r.why.empty()) {
        leave_pending(false);
        std::lock_guard lock(sh->m);
        ++sh->counters.frames_refused;
        spdlog::warn("event=link_refused peer={} reason={} action=closed", peer, r.why);
      } else leave_pending(false);
    }
  }
  net.close();
  std::lock_guard lock(sh->m);
  if (was_link) {
    --sh->counters.links;
    if (--sh->links_of[peer] == 0) sh->links_of.erase(peer);
  }
  --sh->threads;
  sh->cv.notify_all();
}

}  // namespace

void link_front::impl::accept_loop() {
  while (!sh->stop) {
    pollfd p[2] = {{listen_fd, POLLIN, 0}, {wake[0], POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) continue;
    if (p[1].revents) return;
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&a), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    const std::string peer = peer_of(a);
    std::unique_lock lock(sh->m);
    ++sh->counters.accepted;
    const char* refused = nullptr;
    auto bo = sh->backoff_until.find(peer);
    if (bo != sh->backoff_until.end() && clock::now() < bo->second) refused = "backoff", ++sh->counters.refused_backoff;
    else if (sh->counters.pending >= sh->limits.max_pending || sh->pending_of[peer] >= sh->limits.max_pending_per_address)
      refused = "too_many_pending", ++sh->counters.refused_pending;
    else if (sh->counters.links >= sh->limits.max_links || sh->links_of[peer] >= sh->limits.max_links_per_address)
      refused = "too_many_links", ++sh->counters.refused_links;
    if (bo != sh->backoff_until.end() && clock::now() >= bo->second) sh->backoff_until.erase(bo);
    if (sh->pending_of[peer] == 0) sh->pending_of.erase(peer);
    if (refused) {
      lock.unlock();
      ::close(fd);
      sh->refusals.note(refused, peer);
      continue;
    }
    ++sh->counters.pending;
    ++sh->pending_of[peer];
    ++sh->threads;
    lock.unlock();
    no_delay(fd);
    std::thread(serve_connection, sh, fd, peer).detach();
  }
}

link_front::link_front(std::unique_ptr<impl> p) : p_(std::move(p)) {}

result<std::unique_ptr<link_front>, std::string> link_front::start(const std::string& host, int port, std::shared_ptr<tls_context> tls, std::function<int()> inner,
                                                                   link_limits limits) {
  auto p = std::make_unique<impl>();
  p->sh->limits = limits;
  p->sh->tls = std::move(tls);
  p->sh->inner = std::move(inner);
  auto l = transport::listen_tcp(host, port);
  if (!l) return unexpected(l.error());
  p->listen_fd = l->fd;
  p->port = l->port;
  if (::pipe2(p->wake, O_CLOEXEC) != 0) return unexpected(std::string("cannot make a pipe: ") + std::strerror(errno));
  auto* raw = p.get();
  p->acceptor = std::thread([raw] { raw->accept_loop(); });
  return std::unique_ptr<link_front>(new link_front(std::move(p)));
}

link_front::~link_front() {
  p_->sh->stop = true;
  [[maybe_unused]] auto n = ::write(p_->wake[1], "x", 1);
  p_->acceptor.join();
  ::close(p_->listen_fd);
  ::close(p_->wake[0]);
  ::close(p_->wake[1]);
  std::unique_lock lock(p_->sh->m);
  p_->sh->cv.wait_for(lock, std::chrono::seconds(2), [&] { return p_->sh->threads == 0; });
}

int link_front::port() const { return p_->port; }

link_counters link_front::counters() const {
  std::lock_guard lock(p_->sh->m);
  return p_->sh->counters;
}

// ---- the dialer -------------------------------------------------------------------------------------------

result<int, std::string> dial_link(const std::string& host, int port, std::shared_ptr<tls_context> tls, const link_limits& limits,
                                   std::chrono::milliseconds deadline) {
  const auto until = clock::now() + deadline;
  const std::string service = std::to_string(port);
  auto c = transport::connect_tcp(host, port, deadline);
  if (!c) return unexpected(c.error());
  const int fd = *c;
  endpoint net{fd};
  if (tls) {
    net.ssl = SSL_new(tls->ctx);
    SSL_set_fd(net.ssl, fd);
    if (auto w = handshake(net.ssl, fd, false, until); !w.empty()) {
      net.close();
      return unexpected("the TLS handshake with " + host + ":" + service + " failed: " + w);
    }
  }
  auto pair = loopback_pair();
  if (!pair) {
    net.close();
    return unexpected(pair.error());
  }
  const std::uint32_t max_frame = limits.max_frame_bytes;
  std::thread([net, inner = pair->ours, max_frame, peer = host + ":" + service]() mutable {
    static const std::atomic<bool> never{false};
    frame_checker check(max_frame);
    auto r = pump(net, inner, check, never, std::nullopt, [] {});
    if (!r.why.empty()) spdlog::warn("event=link_refused peer={} reason={} action=closed", peer, r.why);
    ::close(inner);
    net.close();
  }).detach();
  return pair->theirs;
}

result<socket_pair, std::string> loopback_pair() {
  auto fail = [](const char* what, std::initializer_list<int> fds) {
    const std::string why = std::string(what) + ": " + std::strerror(errno);
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    return unexpected(why);
  };
  const int l = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l < 0) return fail("socket", {});
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(l, 8) != 0 || ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return fail("a loopback listener", {l});
  const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c < 0) return fail("socket", {l});
  if (::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return fail("connect", {l, c});
  sockaddr_in mine{};
  len = sizeof mine;
  ::getsockname(c, reinterpret_cast<sockaddr*>(&mine), &len);
  int s = -1;
  for (int tries = 0; tries < 16 && s < 0; ++tries) {
    pollfd p{l, POLLIN, 0};
    if (::poll(&p, 1, 1000) != 1) break;
    sockaddr_in peer{};
    len = sizeof peer;
    const int got = ::accept4(l, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
    if (got < 0) continue;
    if (peer.sin_port == mine.sin_port && peer.sin_addr.s_addr == mine.sin_addr.s_addr) s = got;
    else ::close(got);  // someone else's connection: not ours to join
  }
  ::close(l);
  if (s < 0) return fail("the loopback pair did not join", {c});
  set_nonblocking(s), set_nonblocking(c), no_delay(s), no_delay(c);
  return socket_pair{s, c};
}

}  // namespace troupe::cluster
