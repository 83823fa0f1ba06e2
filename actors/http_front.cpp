// The gateway's front (actors/http_front.hpp): one thread per client connection, which frames the
// client's requests (head, then a Content-Length body), checks them against the limits and forwards
// only whole requests to httplib on loopback; the answers flow back as they come.
#include "actors/http_front.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "transport/sockets.hpp"

namespace troupe::actors {

using clock_type = std::chrono::steady_clock;

struct http_front::impl {
  http_limits limits;
  int main_port = 0, lane_port = 0;
  transport::listener l;
  int wake[2] = {-1, -1};
  std::thread acceptor;
  std::atomic<bool> stop{false};
  mutable std::mutex m;
  std::condition_variable cv;
  int threads = 0;
  http_front_counters counters;
  std::map<std::string, int> open_of;

  // An open connection as the acceptor sees it. One that has not yet sent a whole request head
  // (a slow or silent client) may be closed to make room for a newer connection when its address or
  // the front is at its cap: a slowloris then only ever evicts itself, and a client that sends its
  // request at once (a monitor's /health) is served. Fields under `m`.
  struct slot {
    int fd = -1;
    std::string peer;
    bool forwarded = false;        // a whole request went on to httplib: never evicted
    bool evicted = false;          // closed by the acceptor; its count already released
  };
  std::map<std::uint64_t, std::shared_ptr<slot>> slots;  // by accept order
  std::uint64_t next_slot = 0;

  void accept_loop();
  // Under `m`: closes the oldest connection (of `peer` when given) still waiting for its first
  // request head; false when there is none.
  bool evict_locked(const std::string* peer);
  // `probes_only`: a connection past its address's cap, which may only ask /health, /ready or /metrics
  // (its head within a second), so a monitor behind the same address as a flood is still answered.
  void serve(int fd, std::shared_ptr<slot> me, bool probes_only);
};

namespace {

const char* reason_of(int status) {
  switch (status) {
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 400: return "Bad Request";
    default: return "Service Unavailable";
  }
}

// An answer of the front's own, in the API's error shape, after which the connection closes.
std::string refusal(int status, const std::string& message) {
  std::string type = status == 413 ? "payload_too_large" : status == 503 ? "overloaded" : "invalid_request";
  std::string body = R"({"error":{"message":")" + message + R"(","type":")" + type + R"(","param":null,"code":null}})";
  std::string r = "HTTP/1.1 " + std::to_string(status) + " " + reason_of(status) + "\r\nContent-Type: application/json\r\nContent-Length: " +
                  std::to_string(body.size()) + "\r\nConnection: close\r\n";
  if (status == 503) r += "Retry-After: 1\r\n";
  return r + "\r\n" + body;
}

void send_all(int fd, const std::string& s, clock_type::time_point until) {
  std::size_t off = 0;
  while (off < s.size() && clock_type::now() < until) {
    const ssize_t w = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (w > 0) off += static_cast<std::size_t>(w);
    else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return;
    else {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 50);
    }
  }
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// One request head, checked.
struct head_check {
  int status = 0;  // 0: fine
  std::string why;
  std::size_t body = 0;
  std::string path;
};

head_check check_head(const std::string& head, const http_limits& lim) {
  head_check out;
  std::size_t pos = 0, lines = 0;
  bool first = true;
  while (pos < head.size()) {
    const auto eol = head.find("\r\n", pos);
    const std::string line = head.substr(pos, (eol == std::string::npos ? head.size() : eol) - pos);
    pos = eol == std::string::npos ? head.size() : eol + 2;
    if (line.empty()) break;
    if (line.size() > lim.max_line_bytes) return {431, "a header line is longer than " + std::to_string(lim.max_line_bytes) + " bytes"};
    if (first) {
      first = false;
      const auto a = line.find(' '), b = line.rfind(' ');
      if (a == std::string::npos || b == a) return {400, "a malformed request line"};
      out.path = line.substr(a + 1, b - a - 1);
      if (auto q = out.path.find('?'); q != std::string::npos) out.path.resize(q);
      continue;
    }
    if (++lines > static_cast<std::size_t>(lim.max_headers)) return {431, "more than " + std::to_string(lim.max_headers) + " headers"};
    const auto colon = line.find(':');
    if (colon == std::string::npos) return {400, "a header without a colon"};
    const std::string name = lower(line.substr(0, colon));
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.pop_back();
    if (name == "transfer-encoding" && lower(value) != "identity") return {411, "a request body needs a Content-Length (chunked bodies are not taken)"};
    if (name == "content-length") {
      if (value.empty() || value.size() > 18 || value.find_first_not_of("0123456789") != std::string::npos) return {400, "a malformed Content-Length"};
      out.body = std::stoull(value);
      if (out.body > lim.max_body_bytes) return {413, "the request body is larger than " + std::to_string(lim.max_body_bytes) + " bytes"};
    }
  }
  return out;
}

}  // namespace

bool http_front::impl::evict_locked(const std::string* peer) {
  for (auto& [id, sl] : slots) {
    if (sl->forwarded || sl->evicted || (peer && sl->peer != *peer)) continue;
    sl->evicted = true;
    --counters.open;
    if (--open_of[sl->peer] == 0) open_of.erase(sl->peer);
    ++counters.evicted;
    // The serving thread wakes (its poll sees the hang-up), closes and leaves the counts alone.
    ::shutdown(sl->fd, SHUT_RDWR);
    return true;
  }
  return false;
}

void http_front::impl::serve(int fd, std::shared_ptr<slot> me, bool probes_only) {
  const std::string& peer = me->peer;
  http_limits lim = limits;
  if (probes_only) lim.head_deadline = std::min(lim.head_deadline, std::chrono::milliseconds(1000));
  int inner = -1;
  std::string in;            // client bytes not yet framed
  std::string to_inner, to_client;
  std::size_t to_inner_off = 0, to_client_off = 0;
  enum class phase { head, body } ph = phase::head;
  std::size_t body_left = 0;
  constexpr auto none = clock_type::time_point::max();
  // The first request's head is due within the deadline from the accept (a connection that says
  // nothing holds its slot no longer); later ones from their first byte (between requests, httplib's
  // keep-alive timeout closes an idle connection).
  clock_type::time_point deadline = clock_type::now() + lim.head_deadline;
  auto last_activity = clock_type::now();
  bool client_closed = false, inner_closed = false;
  std::vector<char> buf(1 << 16);
  bool finished = false;
  auto refuse = [&](int status, const std::string& why, std::uint64_t http_front_counters::*counter) {
    {
      std::lock_guard lock(m);
      ++(counters.*counter);
    }
    spdlog::warn("event=http_refused peer={} status={} reason=\"{}\"", peer, status, why);
    send_all(fd, refusal(status, why), clock_type::now() + std::chrono::seconds(2));
    // A lingering close: a client still sending its body reads the answer instead of a reset. What it
    // sends meanwhile is discarded (at most 2 s and 64 MiB), never kept.
    ::shutdown(fd, SHUT_WR);
    const auto until = clock_type::now() + std::chrono::seconds(2);
    std::size_t drained = 0;
    while (clock_type::now() < until && drained < (std::size_t{64} << 20)) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
      if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR))) break;
      if (n > 0) drained += static_cast<std::size_t>(n);
    }
  };
  while (!stop) {
    // Frame what the client sent: whole requests go on to httplib.
    bool progressed = true;
    while (progressed) {
      progressed = false;
      if (ph == phase::head) {
        const auto end = in.find("\r\n\r\n");
        if (end == std::string::npos) {
          if (in.size() > lim.max_head_bytes) {
            refuse(431, "the request head is larger than " + std::to_string(lim.max_head_bytes) + " bytes", &http_front_counters::head_too_large);
            finished = true;
            break;
          }
          if (!in.empty() && deadline == none) deadline = clock_type::now() + lim.head_deadline;
          break;
        }
        const std::string head = in.substr(0, end + 4);
        auto c = head.size() > lim.max_head_bytes + 4
                     ? head_check{431, "the request head is larger than " + std::to_string(lim.max_head_bytes) + " bytes"}
                     : check_head(head, lim);
        if (c.status) {
          auto counter = c.status == 431 ? (c.why.find("headers") != std::string::npos ? &http_front_counters::too_many_headers : &http_front_counters::head_too_large)
                         : c.status == 413 ? &http_front_counters::body_too_large
                         : c.status == 411 ? &http_front_counters::chunked
                                           : &http_front_counters::head_too_large;
          refuse(c.status, c.why, counter);
          finished = true;
          break;
        }
        const bool probe_path = c.path == "/health" || c.path == "/ready" || c.path == "/metrics";
        if (probes_only && !probe_path) {
          refuse(503, "too many connections from this address", &http_front_counters::refused_connections);
          finished = true;
          break;
        }
        {
          std::lock_guard lock(m);
          if (me->evicted) {
            finished = true;
            break;
          }
          me->forwarded = true;
        }
        if (inner < 0) {
          const bool probe = probe_path;
          auto conn = transport::connect_tcp("127.0.0.1", probe ? lane_port : main_port, std::chrono::seconds(5));
          if (!conn) {
            refuse(503, "the gateway is not serving", &http_front_counters::refused_connections);
            finished = true;
            break;
          }
          inner = *conn;
          if (probe) {
            std::lock_guard lock(m);
            ++counters.lane;
          }
        }
        to_inner += head;
        in.erase(0, head.size());
        body_left = c.body;
        ph = body_left > 0 ? phase::body : phase::head;
        deadline = body_left > 0 ? clock_type::now() + lim.body_deadline : none;
        if (ph == phase::head) {
          std::lock_guard lock(m);
          ++counters.forwarded;
        }
        progressed = true;
      } else {
        // The body is held back until it is whole: httplib never waits on a slow client.
        if (in.size() < body_left) break;
        to_inner.append(in, 0, body_left);
        in.erase(0, body_left);
        body_left = 0;
        ph = phase::head;
        deadline = none;
        {
          std::lock_guard lock(m);
          ++counters.forwarded;
        }
        progressed = true;
      }
    }
    if (finished) break;
    const auto now = clock_type::now();
    if (now > deadline) {
      refuse(408, ph == phase::head ? "the request head did not arrive in time" : "the request body did not arrive in time", &http_front_counters::timed_out);
      break;
    }
    if (now - last_activity > lim.idle_timeout) break;
    if (client_closed && to_client.size() == to_client_off) break;
    if (inner_closed && to_client.size() == to_client_off) break;
    pollfd p[2] = {{client_closed ? -1 : fd, 0, 0}, {inner < 0 || inner_closed ? -1 : inner, 0, 0}};
    // Reading from the client pauses while a request waits for httplib (bounded buffering).
    if (to_inner.size() - to_inner_off < (std::size_t{1} << 20) && in.size() <= lim.max_head_bytes + lim.max_body_bytes + 4) p[0].events |= POLLIN;
    if (to_client.size() > to_client_off) p[0].events |= POLLOUT;
    if (to_client.size() - to_client_off < (std::size_t{4} << 20)) p[1].events |= POLLIN;
    if (to_inner.size() > to_inner_off) p[1].events |= POLLOUT;
    if (::poll(p, 2, 200) < 0 && errno != EINTR) break;
    if (p[0].revents & POLLIN || p[0].revents & POLLHUP) {
      const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
      if (n > 0) in.append(buf.data(), static_cast<std::size_t>(n)), last_activity = clock_type::now();
      else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) client_closed = true;
    }
    if (inner >= 0 && (p[1].revents & (POLLIN | POLLHUP))) {
      const ssize_t n = ::recv(inner, buf.data(), buf.size(), 0);
      if (n > 0) to_client.append(buf.data(), static_cast<std::size_t>(n)), last_activity = clock_type::now();
      else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) inner_closed = true;
    }
    if (inner >= 0 && to_inner.size() > to_inner_off) {
      const ssize_t w = ::send(inner, to_inner.data() + to_inner_off, to_inner.size() - to_inner_off, MSG_NOSIGNAL);
      if (w > 0) to_inner_off += static_cast<std::size_t>(w);
      else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) inner_closed = true;
      if (to_inner_off == to_inner.size()) to_inner.clear(), to_inner_off = 0;
    }
    if (to_client.size() > to_client_off) {
      const ssize_t w = ::send(fd, to_client.data() + to_client_off, to_client.size() - to_client_off, MSG_NOSIGNAL);
      if (w > 0) to_client_off += static_cast<std::size_t>(w), last_activity = clock_type::now();
      else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) break;
      if (to_client_off == to_client.size()) to_client.clear(), to_client_off = 0;
    }
    // A client gone while its request runs: close httplib's side too, so the stream is cancelled.
    if (client_closed && ph == phase::head && in.empty() && to_inner.empty()) break;
  }
  // The client's socket is closed by the caller once the slot is gone from `slots` (the acceptor may
  // shut a listed slot's socket down; it must never reach a number the kernel has handed out again).
  if (inner >= 0) ::close(inner);
}

void http_front::impl::accept_loop() {
  while (!stop) {
    pollfd p[2] = {{l.fd, POLLIN, 0}, {wake[0], POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) continue;
    if (p[1].revents) return;
    const int fd = ::accept4(l.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    transport::set_no_delay(fd);
    const std::string peer = transport::peer_address(fd);
    std::unique_lock lock(m);
    ++counters.accepted;
    // At a cap, a connection still waiting for its first request head makes room (its address's
    // first); past its address's cap a connection may still ask a probe (a bounded few per address).
    if (open_of[peer] >= limits.max_connections_per_client) evict_locked(&peer);
    if (counters.open >= limits.max_connections) evict_locked(nullptr);
    const bool probes_only = open_of[peer] >= limits.max_connections_per_client;
    if (counters.open >= limits.max_connections || open_of[peer] >= limits.max_connections_per_client + 16) {
      ++counters.refused_connections;
      if (open_of[peer] == 0) open_of.erase(peer);
      lock.unlock();
      send_all(fd, refusal(503, "too many connections"), clock_type::now() + std::chrono::milliseconds(200));
      ::close(fd);
      continue;
    }
    ++counters.open;
    ++open_of[peer];
    ++threads;
    auto me = std::make_shared<slot>(slot{fd, peer});
    const auto id = next_slot++;
    slots.emplace(id, me);
    lock.unlock();
    std::thread([this, fd, me, id, probes_only] {
      serve(fd, me, probes_only);
      std::lock_guard lock(m);
      slots.erase(id);
      ::close(fd);
      if (!me->evicted) {
        --counters.open;
        if (--open_of[me->peer] == 0) open_of.erase(me->peer);
      }
      --threads;
      cv.notify_all();
    }).detach();
  }
}

http_front::http_front(std::unique_ptr<impl> p) : p_(std::move(p)) {}

result<std::unique_ptr<http_front>, std::string> http_front::start(const std::string& host, int port, int main_port, int lane_port, http_limits limits) {
  auto p = std::make_unique<impl>();
  p->limits = limits;
  p->main_port = main_port;
  p->lane_port = lane_port;
  auto l = transport::listen_tcp(host, port);
  if (!l) return unexpected(l.error());
  p->l = *l;
  if (::pipe2(p->wake, O_CLOEXEC) != 0) return unexpected(std::string("cannot make a pipe"));
  auto* raw = p.get();
  p->acceptor = std::thread([raw] { raw->accept_loop(); });
  return std::unique_ptr<http_front>(new http_front(std::move(p)));
}

http_front::~http_front() {
  p_->stop = true;
  [[maybe_unused]] auto n = ::write(p_->wake[1], "x", 1);
  p_->acceptor.join();
  ::close(p_->l.fd);
  std::unique_lock lock(p_->m);
  p_->cv.wait_for(lock, std::chrono::seconds(3), [&] { return p_->threads == 0; });
  lock.unlock();
  ::close(p_->wake[0]);
  ::close(p_->wake[1]);
}

int http_front::port() const { return p_->l.port; }

http_front_counters http_front::counters() const {
  std::lock_guard lock(p_->m);
  return p_->counters;
}

}  // namespace troupe::actors
