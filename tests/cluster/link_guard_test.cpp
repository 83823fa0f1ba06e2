// The link guard without CAF: BASP framing checks, `troupe certs`, the front's mutual TLS, its bounds
// (pending handshakes, deadlines, backoff) and the refusal of oversized frames from an authenticated
// peer. The inner side is an echo server on a loopback pair, standing where CAF's doorman would.
#include "tests/support/loopback.hpp"
#include "cluster/link_guard.hpp"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "cluster/certs.hpp"

namespace troupe::cluster {
namespace {

namespace fs = std::filesystem;

std::string frame(std::uint8_t op, const std::string& payload, std::uint32_t claimed = UINT32_MAX) {
  std::string h(32, '\0');
  h[0] = static_cast<char>(op);
  const std::uint32_t len = claimed == UINT32_MAX ? static_cast<std::uint32_t>(payload.size()) : claimed;
  h[4] = static_cast<char>(len >> 24), h[5] = static_cast<char>(len >> 16), h[6] = static_cast<char>(len >> 8), h[7] = static_cast<char>(len);
  return h + payload;
}

TEST(frame_checker, follows_frames_split_anywhere) {
  const std::string stream = frame(0, "hello") + frame(6, "") + frame(2, std::string(1000, 'x')) + frame(1, "abc");
  for (std::size_t step : {1u, 7u, 31u, 32u, 33u, 1000u}) {
    frame_checker c(4096);
    for (std::size_t i = 0; i < stream.size(); i += step) ASSERT_TRUE(c.feed(stream.data() + i, std::min(step, stream.size() - i))) << step;
    EXPECT_EQ(c.frames(), 4u) << step;
  }
}

TEST(frame_checker, refuses_a_header_claiming_4_gib_before_its_payload) {
  frame_checker c(8u << 20);
  const auto h = frame(2, "", 0xfffffff0u);
  EXPECT_FALSE(c.feed(h.data(), h.size()));
  EXPECT_NE(c.why().find("frame_too_large"), std::string::npos) << c.why();
  EXPECT_FALSE(c.feed("x", 1));  // stays refused
}

TEST(frame_checker, refuses_an_unknown_operation) {
  frame_checker c(1024);
  const auto h = frame(7, "");
  EXPECT_FALSE(c.feed(h.data(), h.size()));
  EXPECT_NE(c.why().find("unknown_operation_7"), std::string::npos);
}

struct certs_dir {
  fs::path dir = fs::temp_directory_path() / ("troupe-guard-" + std::to_string(::getpid()) + "-" +
                                              std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  certs_dir() {
    EXPECT_TRUE(init_ca(dir / "a"));
    EXPECT_TRUE(init_ca(dir / "b"));  // another cluster's CA
    for (const char* n : {"coordinator", "node-1"}) EXPECT_TRUE(issue(dir / "a", n));
    EXPECT_TRUE(issue(dir / "b", "stranger"));
  }
  ~certs_dir() { fs::remove_all(dir); }
  tls_files of(const std::string& ca, const std::string& who) const {
    return {(dir / ca / (who + ".pem")).string(), (dir / ca / (who + ".key")).string(), (dir / ca / "ca.pem").string()};
  }
};

TEST(certs, init_and_issue_refuse_to_overwrite_and_bad_names) {
  certs_dir c;
  EXPECT_FALSE(init_ca(c.dir / "a"));
  EXPECT_FALSE(issue(c.dir / "a", "node-1"));
  EXPECT_FALSE(issue(c.dir / "a", "../evil"));
  EXPECT_FALSE(issue(c.dir / "a", ""));
  EXPECT_FALSE(issue(c.dir / "nowhere", "n"));
  EXPECT_EQ(fs::status(c.dir / "a" / "node-1.key").permissions() & (fs::perms::group_all | fs::perms::others_all), fs::perms::none);
  EXPECT_TRUE(server_tls(c.of("a", "coordinator")));
  EXPECT_TRUE(client_tls(c.of("a", "node-1")));
  // A key that is not the certificate's.
  auto mixed = c.of("a", "node-1");
  mixed.key = (c.dir / "a" / "coordinator.key").string();
  EXPECT_FALSE(client_tls(mixed));
}

// An inner side that echoes every byte back (what CAF's doorman would get), counting its connections.
struct echo_inner {
  std::atomic<int> opened{0};
  std::mutex m;
  std::vector<std::thread> threads;
  std::atomic<bool> stop{false};
  std::function<int()> fn() {
    return [this] {
      auto p = loopback_pair();
      if (!p) return -1;
      ++opened;
      std::lock_guard lock(m);
      threads.emplace_back([this, fd = p->theirs] {
        char buf[65536];
        while (!stop) {
          pollfd q{fd, POLLIN, 0};
          if (::poll(&q, 1, 50) <= 0) continue;
          const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
          if (n <= 0) break;
          for (ssize_t off = 0; off < n;) {
            const ssize_t w = ::send(fd, buf + off, static_cast<std::size_t>(n - off), MSG_NOSIGNAL);
            if (w > 0) off += w;
            else if (w < 0 && errno != EAGAIN) break;
          }
        }
        ::close(fd);
      });
      return p->ours;
    };
  }
  ~echo_inner() {
    stop = true;
    std::lock_guard lock(m);
    for (auto& t : threads) t.join();
  }
};

std::string read_exactly(int fd, std::size_t n, int timeout_ms = 5000) {
  std::string out;
  char buf[65536];
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (out.size() < n && std::chrono::steady_clock::now() < until) {
    pollfd q{fd, POLLIN, 0};
    if (::poll(&q, 1, 50) <= 0) continue;
    const ssize_t r = ::recv(fd, buf, std::min(sizeof buf, n - out.size()), 0);
    if (r == 0) break;
    if (r > 0) out.append(buf, static_cast<std::size_t>(r));
  }
  return out;
}

bool closed_within(int fd, int timeout_ms) {
  char buf[4096];
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < until) {
    pollfd q{fd, POLLIN, 0};
    if (::poll(&q, 1, 50) <= 0) continue;
    const ssize_t r = ::recv(fd, buf, sizeof buf, 0);
    if (r == 0 || (r < 0 && errno != EAGAIN)) return true;
  }
  return false;
}

int tcp_connect(int port) { return test::loopback_connect(port); }

TEST(link_front, carries_frames_over_mutual_tls) {
  certs_dir c;
  echo_inner inner;
  auto front = link_front::start("127.0.0.1", 0, *server_tls(c.of("a", "coordinator")), inner.fn());
  ASSERT_TRUE(front) << front.error();
  auto fd = dial_link("127.0.0.1", (*front)->port(), *client_tls(c.of("a", "node-1")), {}, std::chrono::seconds(5));
  ASSERT_TRUE(fd) << fd.error();
  const std::string msg = frame(1, "client handshake") + frame(2, std::string(300000, 'q'));
  ASSERT_EQ(::send(*fd, msg.data(), msg.size(), MSG_NOSIGNAL), static_cast<ssize_t>(msg.size()));
  EXPECT_EQ(read_exactly(*fd, msg.size()), msg);
  const auto k = (*front)->counters();
  EXPECT_EQ(k.authenticated, 1u);
  EXPECT_EQ(k.links, 1);
  EXPECT_EQ(k.pending, 0);
  ::close(*fd);
}

TEST(link_front, a_peer_without_a_certificate_of_the_ca_reaches_nothing) {
  certs_dir c;
  echo_inner inner;
  auto front = link_front::start("127.0.0.1", 0, *server_tls(c.of("a", "coordinator")), inner.fn());
  ASSERT_TRUE(front);
  // Another cluster's certificate.
  EXPECT_FALSE(dial_link("127.0.0.1", (*front)->port(), *client_tls(c.of("b", "stranger")), {}, std::chrono::seconds(5)));
  // No TLS at all: CAF's handshake bytes, a forged job, as a plain peer would send them.
  const int fd = tcp_connect((*front)->port());
  ASSERT_GE(fd, 0);
  const std::string forged = frame(1, "forged client handshake") + frame(2, "job for actor 7");
  ::send(fd, forged.data(), forged.size(), MSG_NOSIGNAL);
  EXPECT_TRUE(closed_within(fd, 3000));
  ::close(fd);
  EXPECT_EQ(inner.opened.load(), 0) << "bytes of an unauthenticated peer reached the inner side";
  // The front counts a failure on its own thread, after the peer may already have seen the close.
  for (int i = 0; i < 100 && (*front)->counters().handshake_failed < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GE((*front)->counters().handshake_failed, 2u);
}

TEST(link_front, an_authenticated_peer_claiming_4_gib_is_cut_before_anything_is_reserved) {
  certs_dir c;
  echo_inner inner;
  auto front = link_front::start("127.0.0.1", 0, *server_tls(c.of("a", "coordinator")), inner.fn());
  ASSERT_TRUE(front);
  auto fd = dial_link("127.0.0.1", (*front)->port(), *client_tls(c.of("a", "node-1")), {}, std::chrono::seconds(5));
  ASSERT_TRUE(fd);
  const auto h = frame(2, "", 0xfffffff0u);
  ::send(*fd, h.data(), h.size(), MSG_NOSIGNAL);
  EXPECT_TRUE(closed_within(*fd, 3000));
  ::close(*fd);
  for (int i = 0; i < 100 && (*front)->counters().links != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ((*front)->counters().frames_refused, 1u);
  EXPECT_EQ((*front)->counters().links, 0);
}

TEST(link_front, silent_connections_are_bounded_and_never_lock_a_peer_out) {
  certs_dir c;
  echo_inner inner;
  link_limits l;
  l.max_silent = 8;
  l.max_silent_per_address = 8;
  l.handshake_deadline = std::chrono::milliseconds(1500);
  auto front = link_front::start("127.0.0.1", 0, *server_tls(c.of("a", "coordinator")), inner.fn(), l);
  ASSERT_TRUE(front);
  std::vector<int> silent;
  for (int i = 0; i < 200; ++i) silent.push_back(tcp_connect((*front)->port()));
  for (int i = 0; i < 100 && (*front)->counters().accepted < 200; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto k = (*front)->counters();
  EXPECT_LE(k.pending, 8);
  EXPECT_GE(k.evicted_silent, 150u);
  // While the 200 are still open (8 of them held), a node from the same address joins at once: it
  // speaks, so it leaves the silent set before newer silent connections could push it out.
  auto fd = dial_link("127.0.0.1", (*front)->port(), *client_tls(c.of("a", "node-1")), l, std::chrono::seconds(5));
  ASSERT_TRUE(fd) << fd.error();
  const auto msg = frame(6, "");
  ::send(*fd, msg.data(), msg.size(), MSG_NOSIGNAL);
  EXPECT_EQ(read_exactly(*fd, msg.size()), msg);
  // The deadline closes the silent ones still held; loopback is never backed off for it.
  std::this_thread::sleep_for(std::chrono::milliseconds(1800));
  EXPECT_EQ((*front)->counters().pending, 0);
  EXPECT_GE((*front)->counters().handshake_timeout, 1u);
  EXPECT_EQ((*front)->counters().refused_backoff, 0u);
  ::close(*fd);
  for (int s : silent) ::close(s);
}

TEST(link_front, a_flood_of_junk_and_stalled_handshakes_leaves_room_for_a_node) {
  certs_dir c;
  echo_inner inner;
  link_limits l;
  l.max_pending = 8;
  l.max_pending_per_address = 4;
  auto front = link_front::start("127.0.0.1", 0, *server_tls(c.of("a", "coordinator")), inner.fn(), l);
  ASSERT_TRUE(front);
  const int port = (*front)->port();
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0};
  std::vector<int> stalled;
  // Stalled handshakes: the first bytes of a TLS record, then nothing; and junk records, closed.
  std::thread flood([&] {
    while (!stop) {
      const int s = tcp_connect(port);
      if (s < 0) continue;
      static const char partial[] = "\x16\x03\x01\x02\x00\x01";
      static const char junk[] = "\x16\x03\x01\x00\x05hello";
      if (++sent % 2) {
        ::send(s, partial, sizeof partial - 1, MSG_NOSIGNAL);
        stalled.push_back(s);
        if (stalled.size() > 1000) ::close(stalled.front()), stalled.erase(stalled.begin());  // the test's own descriptors
      } else {
        ::send(s, junk, sizeof junk - 1, MSG_NOSIGNAL);
        ::close(s);
      }
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (int i = 0; i < 5; ++i) {
    auto fd = dial_link("127.0.0.1", port, *client_tls(c.of("a", "node-1")), l, std::chrono::seconds(5));
    ASSERT_TRUE(fd) << "join " << i << " during the flood: " << fd.error();
    const auto msg = frame(6, "");
    ::send(*fd, msg.data(), msg.size(), MSG_NOSIGNAL);
    EXPECT_EQ(read_exactly(*fd, msg.size()), msg);
    ::close(*fd);
  }
  stop = true;
  flood.join();
  const auto k = (*front)->counters();
  EXPECT_GE(sent.load(), 20);
  EXPECT_LE(k.pending, 8 + l.max_silent);
  EXPECT_GE(k.handshake_failed, 1u);
  EXPECT_EQ(k.refused_backoff, 0u);  // loopback: bounded by the caps, not backed off
  for (int s : stalled) ::close(s);
}

TEST(link_front, an_address_whose_handshakes_keep_failing_is_backed_off) {
  certs_dir c;
  echo_inner inner;
  link_limits l;
  l.backoff_loopback = true;  // every peer of a test is on loopback
  l.failures_before_backoff = 3;
  l.backoff = std::chrono::milliseconds(800);
  auto front = link_front::start("127.0.0.1", 0, *server_tls(c.of("a", "coordinator")), inner.fn(), l);
  ASSERT_TRUE(front);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(dial_link("127.0.0.1", (*front)->port(), *client_tls(c.of("b", "stranger")), l, std::chrono::seconds(5)));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // While backed off even a good certificate is refused at accept...
  EXPECT_FALSE(dial_link("127.0.0.1", (*front)->port(), *client_tls(c.of("a", "node-1")), l, std::chrono::seconds(5)));
  EXPECT_GE((*front)->counters().refused_backoff, 1u);
  // ...and after it, taken.
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  auto fd = dial_link("127.0.0.1", (*front)->port(), *client_tls(c.of("a", "node-1")), l, std::chrono::seconds(5));
  EXPECT_TRUE(fd) << (fd ? "" : fd.error());
  if (fd) ::close(*fd);
}

TEST(link_front, plain_links_need_a_first_frame_in_time) {
  echo_inner inner;
  link_limits l;
  l.handshake_deadline = std::chrono::milliseconds(300);
  auto front = link_front::start("127.0.0.1", 0, nullptr, inner.fn(), l);
  ASSERT_TRUE(front);
  const int silent = tcp_connect((*front)->port());
  EXPECT_TRUE(closed_within(silent, 2000));
  ::close(silent);
  auto fd = dial_link("127.0.0.1", (*front)->port(), nullptr, l, std::chrono::seconds(5));
  ASSERT_TRUE(fd);
  const auto msg = frame(1, "hello");
  ::send(*fd, msg.data(), msg.size(), MSG_NOSIGNAL);
  EXPECT_EQ(read_exactly(*fd, msg.size()), msg);
  ::close(*fd);
}

TEST(link_guard, loopback_is_recognised) {
  EXPECT_TRUE(is_loopback("127.0.0.1"));
  EXPECT_TRUE(is_loopback("127.1.2.3"));
  EXPECT_TRUE(is_loopback("localhost"));
  EXPECT_TRUE(is_loopback("::1"));
  EXPECT_FALSE(is_loopback("0.0.0.0"));
  EXPECT_FALSE(is_loopback("10.0.0.1"));
}

}  // namespace
}  // namespace troupe::cluster
