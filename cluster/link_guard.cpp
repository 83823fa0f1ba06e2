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
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <spdlog/spdlog.h>

#include <algorithm>
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

// 127/8, ::1 or a v4-mapped 127/8 address.
bool loopback_address(const sockaddr* a) {
  if (a->sa_family == AF_INET) return (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;
  if (a->sa_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  }
  return false;
}

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

// Why a TLS handshake failed: OpenSSL's reasons, or a peer that closed without one.
std::string handshake_failure() {
  const auto why = ssl_reason();
  return why == "no reason given" ? std::string("the peer closed the connection") : why;
}

// Runs the client side of a TLS handshake on a non-blocking socket until `until` (the front runs the
// server side in its event loop). Empty on success, otherwise why not ("timeout" when the deadline
// passed).
std::string connect_handshake(SSL* ssl, int fd, clock::time_point until) {
  for (;;) {
    ERR_clear_error();
    const int r = SSL_connect(ssl);
    if (r == 1) return {};
    const int e = SSL_get_error(ssl, r);
    short events = 0;
    if (e == SSL_ERROR_WANT_READ) events = POLLIN;
    else if (e == SSL_ERROR_WANT_WRITE) events = POLLOUT;
    else return handshake_failure();
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
  for (auto* a = res; a; a = a->ai_next) all &= loopback_address(a->ai_addr);
  ::freeaddrinfo(res);
  return all;
}

// ---- the front --------------------------------------------------------------------------------------------
//
// One event loop takes every connection until it is authenticated: accepts, the silent set (nothing
// received yet), TLS handshakes as non-blocking state machines, deadlines, evictions and backoff. Only an
// authenticated link (or, on a plain loopback front, a connection that has spoken) gets a thread of its
// own, which pumps it to CAF. So an unauthenticated peer costs a descriptor and, once it speaks, one
// SSL object; neither a thread nor anything CAF holds.

struct link_front::impl {
  struct shared {
    link_limits limits;
    std::shared_ptr<tls_context> tls;
    std::function<int()> inner;
    std::atomic<bool> stop{false};
    std::mutex m;
    std::condition_variable cv;
    int threads = 0;  // link threads still running
    link_counters counters;
    std::int64_t waiting = 0;        // silent and handshaking, in the event loop
    std::int64_t plain_pending = 0;  // plain connections waiting for their first frame, in threads
    std::map<std::string, int> links_of, plain_pending_of;
    std::map<std::string, std::deque<clock::time_point>> failures_of;
    std::map<std::string, clock::time_point> backoff_until;
    refusal_log refusals;

    // A failed handshake of `peer`; enough of them within `backoff` back the address off.
    void failed(const std::string& peer, bool loopback, bool timeout, const std::string& why) {
      {
        std::lock_guard lock(m);
        ++(timeout ? counters.handshake_timeout : counters.handshake_failed);
        if (!loopback || limits.backoff_loopback) {
          auto& f = failures_of[peer];
          const auto now = clock::now();
          f.push_back(now);
          while (!f.empty() && now - f.front() > limits.backoff) f.pop_front();
          if (static_cast<int>(f.size()) >= limits.failures_before_backoff) {
            backoff_until[peer] = now + limits.backoff;
            f.clear();
            spdlog::warn("event=link_backoff peer={} seconds={}", peer, std::chrono::duration_cast<std::chrono::seconds>(limits.backoff).count());
          }
          // Addresses seen once and long quiet are forgotten, so the table stays bounded.
          if (failures_of.size() > 4096)
            std::erase_if(failures_of, [&](const auto& kv) { return kv.second.empty() || now - kv.second.back() > limits.backoff; });
        }
      }
      refusals.note(timeout ? "handshake_timeout" : "handshake_failed", peer + " (" + why + ")");
    }
    void publish_pending() { counters.pending = waiting + plain_pending; }
  };
  std::shared_ptr<shared> sh = std::make_shared<shared>();
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  int port = 0;
  std::thread loop;

  void event_loop();
};

namespace {

using shared_ptr_t = std::shared_ptr<link_front::impl::shared>;

// An authenticated link (or a plain one that has spoken), pumped to CAF until either side closes.
// `plain_pending`: a plain connection counted as pending until its first whole frame.
void serve_link(shared_ptr_t sh, endpoint net, std::string peer, bool loopback, bool plain_pending, clock::time_point until) {
  bool linked = !plain_pending;
  auto become_link = [&] {
    std::lock_guard lock(sh->m);
    if (linked) return;
    linked = true;
    --sh->plain_pending;
    if (--sh->plain_pending_of[peer] == 0) sh->plain_pending_of.erase(peer);
    ++sh->counters.authenticated;
    ++sh->counters.links;
    ++sh->links_of[peer];
    sh->publish_pending();
  };
  auto drop_pending = [&] {
    std::lock_guard lock(sh->m);
    if (linked) return false;
    linked = true;  // no longer pending, never a link
    --sh->plain_pending;
    if (--sh->plain_pending_of[peer] == 0) sh->plain_pending_of.erase(peer);
    sh->publish_pending();
    return true;
  };
  bool was_link = !plain_pending;
  const int inner = sh->inner();
  if (inner < 0) {
    spdlog::error("event=link_inner_unreachable peer={}", peer);
  } else {
    frame_checker check(sh->limits.max_frame_bytes);
    std::optional<clock::time_point> first_by;
    if (plain_pending) first_by = until;
    auto r = pump(net, inner, check, sh->stop, first_by, [&] {
      become_link();
      was_link = true;
    });
    ::close(inner);
    if (r.why == "timeout") {
      if (drop_pending()) sh->failed(peer, loopback, true, "no frame in time");
    } else if (!r.why.empty()) {
      std::lock_guard lock(sh->m);
      ++sh->counters.frames_refused;
      spdlog::warn("event=link_refused peer={} reason={} action=closed", peer, r.why);
    }
  }
  drop_pending();
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

void link_front::impl::event_loop() {
  struct waiting {
    int fd = -1;
    std::string peer;
    bool loopback = false;
    clock::time_point deadline;
    SSL* ssl = nullptr;  // set once the connection has spoken (TLS)
    short events = POLLIN;
    bool advanced = false;  // its ClientHello was whole and answered: a round trip from done
  };
  // Keyed by accept order: the first entry is the oldest and has the earliest deadline.
  std::map<std::uint64_t, waiting> silent, handshaking;
  std::map<std::string, int> silent_of, handshaking_of;
  std::uint64_t next_seq = 0;
  const auto& lim = sh->limits;

  auto publish = [&] {
    std::lock_guard lock(sh->m);
    sh->waiting = static_cast<std::int64_t>(silent.size() + handshaking.size());
    sh->publish_pending();
  };
  auto forget = [](std::map<std::string, int>& of, const std::string& peer) {
    if (--of[peer] <= 0) of.erase(peer);
  };
  auto close_waiting = [](waiting& w) {
    if (w.ssl) SSL_free(w.ssl), w.ssl = nullptr;
    if (w.fd >= 0) ::close(w.fd), w.fd = -1;
  };
  // Closes the oldest entry of `set` (of `peer` when given) to make room; false when there is none.
  // Handshakes still waiting for a whole ClientHello go first: one that was answered is a round trip
  // from done, and a flood of stalled records must not push a real peer's out while its Finished is on
  // the way.
  auto evict_oldest = [&](std::map<std::uint64_t, waiting>& set, std::map<std::string, int>& of, const std::string* peer,
                          std::uint64_t link_counters::*counter) {
    auto match = [&](const auto& kv) { return !peer || kv.second.peer == *peer; };
    auto it = std::find_if(set.begin(), set.end(), [&](const auto& kv) { return match(kv) && !kv.second.advanced; });
    if (it == set.end()) it = std::find_if(set.begin(), set.end(), match);
    if (it == set.end()) return false;
    const std::string victim = it->second.peer;
    const bool lb = it->second.loopback;
    close_waiting(it->second);
    forget(of, victim);
    set.erase(it);
    {
      std::lock_guard lock(sh->m);
      ++(sh->counters.*counter);
    }
    sh->failed(victim, lb, false, "closed for a newer connection");
    return true;
  };
  auto authenticated = [&](waiting& w) {
    spdlog::info("event=link_authenticated peer={} subject={}", w.peer, subject_of(w.ssl));
    {
      std::lock_guard lock(sh->m);
      ++sh->counters.authenticated;
      ++sh->counters.links;
      ++sh->links_of[w.peer];
      ++sh->threads;
    }
    endpoint net{w.fd, w.ssl};
    w.fd = -1, w.ssl = nullptr;
    std::thread(serve_link, sh, net, w.peer, w.loopback, false, w.deadline).detach();
  };
  // One step of a TLS handshake: true when the entry is done with (authenticated or failed).
  auto step = [&](waiting& w) {
    ERR_clear_error();
    const int r = SSL_accept(w.ssl);
    if (r == 1) return authenticated(w), true;
    const int e = SSL_get_error(w.ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
      w.advanced = w.advanced || BIO_number_written(SSL_get_wbio(w.ssl)) > 0;
      w.events = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
      return false;
    }
    sh->failed(w.peer, w.loopback, false, handshake_failure());
    close_waiting(w);
    return true;
  };
  // A silent connection has spoken: its handshake starts (TLS) or a thread waits for its first frame.
  auto spoke = [&](std::uint64_t seq, waiting w) {
    if (!sh->tls) {
      std::unique_lock lock(sh->m);
      if (sh->plain_pending >= lim.max_pending || sh->plain_pending_of[w.peer] >= lim.max_pending_per_address) {
        ++sh->counters.refused_pending;
        if (sh->plain_pending_of[w.peer] == 0) sh->plain_pending_of.erase(w.peer);
        lock.unlock();
        sh->refusals.note("too_many_pending", w.peer);
        close_waiting(w);
        return;
      }
      ++sh->plain_pending;
      ++sh->plain_pending_of[w.peer];
      ++sh->threads;
      sh->publish_pending();
      lock.unlock();
      std::thread(serve_link, sh, endpoint{w.fd}, w.peer, w.loopback, true, w.deadline).detach();
      return;
    }
    if (handshaking_of[w.peer] >= lim.max_pending_per_address) evict_oldest(handshaking, handshaking_of, &w.peer, &link_counters::evicted_pending);
    if (static_cast<int>(handshaking.size()) >= lim.max_pending) evict_oldest(handshaking, handshaking_of, nullptr, &link_counters::evicted_pending);
    w.ssl = SSL_new(sh->tls->ctx);
    if (!w.ssl) {
      spdlog::error("event=link_refused peer={} reason=ssl_new_failed", w.peer);
      close_waiting(w);
      return;
    }
    SSL_set_fd(w.ssl, w.fd);
    if (step(w)) return;
    ++handshaking_of[w.peer];
    handshaking.emplace(seq, std::move(w));
  };
  auto admit = [&](int fd, const sockaddr_storage& a) {
    const std::string peer = peer_of(a);
    const bool lb = loopback_address(reinterpret_cast<const sockaddr*>(&a));
    const char* refused = nullptr;
    {
      std::lock_guard lock(sh->m);
      ++sh->counters.accepted;
      auto bo = sh->backoff_until.find(peer);
      if (bo != sh->backoff_until.end()) {
        if (clock::now() < bo->second) refused = "backoff", ++sh->counters.refused_backoff;
        else sh->backoff_until.erase(bo);
      }
      if (!refused) {
        auto lo = sh->links_of.find(peer);
        if (sh->counters.links >= lim.max_links || (lo != sh->links_of.end() && lo->second >= lim.max_links_per_address))
          refused = "too_many_links", ++sh->counters.refused_links;
      }
    }
    if (refused) {
      ::close(fd);
      sh->refusals.note(refused, peer);
      return;
    }
    if (silent_of[peer] >= lim.max_silent_per_address) evict_oldest(silent, silent_of, &peer, &link_counters::evicted_silent);
    if (static_cast<int>(silent.size()) >= lim.max_silent) evict_oldest(silent, silent_of, nullptr, &link_counters::evicted_silent);
    no_delay(fd);
    ++silent_of[peer];
    silent.emplace(next_seq++, waiting{fd, peer, lb, clock::now() + lim.handshake_deadline});
  };

  std::vector<pollfd> fds;
  std::vector<std::pair<bool, std::uint64_t>> who;  // (handshaking?, seq) of fds[2 + i]
  std::vector<char> probe(1);
  while (!sh->stop) {
    // Deadlines: the oldest entries first.
    const auto now = clock::now();
    for (auto* set : {&silent, &handshaking}) {
      auto& of = set == &silent ? silent_of : handshaking_of;
      while (!set->empty() && set->begin()->second.deadline <= now) {
        auto& w = set->begin()->second;
        sh->failed(w.peer, w.loopback, true, set == &silent ? "silent past the deadline" : "handshake past the deadline");
        forget(of, w.peer);
        close_waiting(w);
        set->erase(set->begin());
      }
    }
    publish();
    fds.assign({{listen_fd, POLLIN, 0}, {wake[0], POLLIN, 0}});
    who.clear();
    for (auto& [seq, w] : silent) fds.push_back({w.fd, POLLIN, 0}), who.emplace_back(false, seq);
    for (auto& [seq, w] : handshaking) fds.push_back({w.fd, w.events, 0}), who.emplace_back(true, seq);
    auto first_deadline = clock::time_point::max();
    if (!silent.empty()) first_deadline = silent.begin()->second.deadline;
    if (!handshaking.empty()) first_deadline = std::min(first_deadline, handshaking.begin()->second.deadline);
    int timeout_ms = 200;
    if (first_deadline != clock::time_point::max())
      timeout_ms = static_cast<int>(std::clamp<std::int64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(first_deadline - now).count() + 1, 0, 200));
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (fds[1].revents) break;
    // Connections that spoke or whose handshake can go on, before new ones may evict them.
    for (std::size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      const auto [is_handshake, seq] = who[i - 2];
      if (is_handshake) {
        auto it = handshaking.find(seq);
        if (it == handshaking.end()) continue;  // evicted meanwhile
        if (step(it->second)) {
          forget(handshaking_of, it->second.peer);
          handshaking.erase(it);
        }
        continue;
      }
      auto it = silent.find(seq);
      if (it == silent.end()) continue;
      waiting w = std::move(it->second);
      forget(silent_of, w.peer);
      silent.erase(it);
      const ssize_t n = ::recv(w.fd, probe.data(), 1, MSG_PEEK);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        sh->failed(w.peer, w.loopback, false, "the peer closed the connection");
        close_waiting(w);
        continue;
      }
      spoke(seq, std::move(w));
    }
    if (fds[0].revents) {
      for (int k = 0; k < 128; ++k) {
        sockaddr_storage a{};
        socklen_t len = sizeof a;
        const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&a), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EMFILE || errno == ENFILE) {
            // Out of descriptors: the oldest silent connection makes room, else wait a moment.
            if (!evict_oldest(silent, silent_of, nullptr, &link_counters::evicted_silent)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
          break;
        }
        admit(fd, a);
      }
    }
  }
  for (auto* set : {&silent, &handshaking})
    for (auto& [seq, w] : *set) close_waiting(w);
  silent.clear(), handshaking.clear();
  publish();
}

link_front::link_front(std::unique_ptr<impl> p) : p_(std::move(p)) {}

result<std::unique_ptr<link_front>, std::string> link_front::start(const std::string& host, int port, std::shared_ptr<tls_context> tls, std::function<int()> inner,
                                                                   link_limits limits) {
  // Silent connections are the front's only unbounded-looking cost: a descriptor each. Take what the
  // process may have and keep room for links and everything else.
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    if (nofile.rlim_cur < nofile.rlim_max) {
      nofile.rlim_cur = nofile.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &nofile);
      ::getrlimit(RLIMIT_NOFILE, &nofile);
    }
    const auto spare = static_cast<std::int64_t>(std::min<rlim_t>(nofile.rlim_cur, 1 << 20)) - 256 - 3 * std::int64_t{limits.max_links} - limits.max_pending;
    const int fit = static_cast<int>(std::clamp<std::int64_t>(spare, 16, limits.max_silent));
    if (fit < limits.max_silent) {
      spdlog::warn("event=link_limits max_silent={} reason=\"the descriptor limit ({}) holds no more\"", fit, nofile.rlim_cur);
      limits.max_silent = fit;
      limits.max_silent_per_address = std::min(limits.max_silent_per_address, fit);
    }
  }
  auto p = std::make_unique<impl>();
  p->sh->limits = limits;
  p->sh->tls = std::move(tls);
  p->sh->inner = std::move(inner);
  auto l = transport::listen_tcp(host, port, 4096);
  if (!l) return unexpected(l.error());
  p->listen_fd = l->fd;
  p->port = l->port;
  set_nonblocking(l->fd);  // the event loop accepts until EAGAIN and must never block in accept
  if (::pipe2(p->wake, O_CLOEXEC) != 0) return unexpected(std::string("cannot make a pipe: ") + std::strerror(errno));
  auto* raw = p.get();
  p->loop = std::thread([raw] { raw->event_loop(); });
  return std::unique_ptr<link_front>(new link_front(std::move(p)));
}

link_front::~link_front() {
  p_->sh->stop = true;
  [[maybe_unused]] auto n = ::write(p_->wake[1], "x", 1);
  p_->loop.join();
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
    if (auto w = connect_handshake(net.ssl, fd, until); !w.empty()) {
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
