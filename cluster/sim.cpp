// `troupe sim`: a simulated cluster on this machine. A coordinator and N node processes (this same
// binary) on loopback, joined with a fresh secret; optionally a model deployed on them. It prints the
// coordinator's address and secret file, then reads fault-injection commands on stdin
//   kill I | pause I | resume I | restart I | cut I | restore I | status | quit   (I: a node's index)
// (cut and restore act on a loopback relay between node I and the coordinator)
// and runs until `quit`, SIGINT or SIGTERM (stdin at its end only stops the commands).
#include "cluster/sim.hpp"
#include "cluster/certs.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>


#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

#include "cluster/remote.hpp"

#include <arpa/inet.h>
#include <mutex>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

namespace troupe::cluster {
namespace {

namespace fs = std::filesystem;

pid_t spawn(const std::vector<std::string>& args, const fs::path& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const std::string log_path = log.string();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    // The parent blocked SIGINT/SIGTERM for sigwait; the child must receive them.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

void stop(pid_t pid) {
  if (pid <= 0) return;
  ::kill(pid, SIGCONT);
  ::kill(pid, SIGTERM);
  for (int i = 0; i < 100; ++i) {
    if (::waitpid(pid, nullptr, WNOHANG) == pid) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

// Every process at once: SIGTERM, up to 3 s for them to leave, then SIGKILL; each reaped.
void stop_together(const std::vector<pid_t>& pids) {
  std::vector<pid_t> left;
  for (auto p : pids)
    if (p > 0) {
      ::kill(p, SIGCONT);
      ::kill(p, SIGTERM);
      left.push_back(p);
    }
  for (int i = 0; i < 60 && !left.empty(); ++i) {
    std::erase_if(left, [](pid_t p) { return ::waitpid(p, nullptr, WNOHANG) == p; });
    if (!left.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (auto p : left) {
    ::kill(p, SIGKILL);
    ::waitpid(p, nullptr, 0);
  }
}

// A loopback TCP relay between one node and the coordinator, so the sim can cut that node's link and
// restore it without network namespaces: while cut, open connections are shut down and new ones are
// accepted and closed at once.
class link_relay {
 public:
  explicit link_relay(int upstream_port) : upstream_(upstream_port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listen_fd_, 16);
    socklen_t len = sizeof a;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~link_relay() {
    stopping_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    ::close(listen_fd_);
    cut();
    acceptor_.join();
    std::lock_guard lock(m_);
    for (auto& t : pumps_) t.join();
  }
  int port() const { return port_; }
  void cut() {
    cut_ = true;
    std::lock_guard lock(m_);
    for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
  }
  void restore() { cut_ = false; }

 private:
  void accept_loop() {
    while (!stopping_) {
      const int c = ::accept(listen_fd_, nullptr, nullptr);
      if (c < 0) {
        if (stopping_) return;
        continue;
      }
      if (cut_) {
        ::close(c);
        continue;
      }
      const int u = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<std::uint16_t>(upstream_));
      if (::connect(u, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(c);
        ::close(u);
        continue;
      }
      std::lock_guard lock(m_);
      open_.push_back(c);
      open_.push_back(u);
      pumps_.emplace_back([this, c, u] { pump(c, u); });
    }
  }
  void pump(int a, int b) {
    char buf[1 << 16];
    pollfd fds[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    while (!cut_ && !stopping_) {
      if (::poll(fds, 2, 200) < 0) break;
      bool done = false;
      for (int k = 0; k < 2 && !done; ++k) {
        if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t n = ::read(fds[k].fd, buf, sizeof buf);
        if (n <= 0) {
          done = true;
          break;
        }
        for (ssize_t off = 0; off < n;) {
          const ssize_t w = ::send(fds[1 - k].fd, buf + off, static_cast<std::size_t>(n - off), MSG_NOSIGNAL);  // a closed side is an end, not SIGPIPE
          if (w <= 0) {
            done = true;
            break;
          }
          off += w;
        }
      }
      if (done) break;
    }
    std::lock_guard lock(m_);
    std::erase(open_, a);
    std::erase(open_, b);
    ::close(a);
    ::close(b);
  }

  int upstream_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> cut_{false}, stopping_{false};
  std::mutex m_;
  std::vector<int> open_;
  std::vector<std::thread> pumps_;
  std::thread acceptor_;
};

}  // namespace

int run_sim(const sim_options& o) {
  const std::vector<std::string>& models = o.models;
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const fs::path dir = o.dir.empty() ? fs::temp_directory_path() / ("troupe-sim-" + std::to_string(::getpid())) : fs::path(o.dir);
  fs::create_directories(dir);
  {
    std::random_device rd;
    std::ofstream f(dir / "secret");
    for (int i = 0; i < 32; ++i) f << "0123456789abcdef"[rd() & 15];
    f << "\n";
  }
  fs::permissions(dir / "secret", fs::perms::owner_read | fs::perms::owner_write);
  // A throw-away CA for this cluster: every link is mutual TLS, as in a real one. The coordinator, each
  // node and the clients (the sim itself, `troupe submit --cluster-file DIR/cluster.toml`) get a
  // certificate of their own.
  const fs::path certs = dir / "certs";
  {
    std::error_code ec;
    fs::remove_all(certs, ec);
    std::vector<std::string> names{"coordinator", "client"};
    for (int i = 0; i < o.nodes; ++i) names.push_back("sim-node-" + std::to_string(i));
    auto ca = init_ca(certs, "troupe-sim-ca", 30);
    for (std::size_t i = 0; ca && i < names.size(); ++i)
      if (auto r = issue(certs, names[i], 30); !r) ca = unexpected(r.error());
    if (!ca) {
      std::fprintf(stderr, "troupe sim: cannot make the cluster's certificates: %s\n", ca.error().c_str());
      return 1;
    }
  }
  auto tls_args = [&](const std::string& who) {
    return std::vector<std::string>{"--tls-cert", (certs / (who + ".pem")).string(), "--tls-key", (certs / (who + ".key")).string(), "--tls-ca",
                                    (certs / "ca.pem").string()};
  };
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // Until the command loop takes the signals over, a watcher does: a signal while the cluster starts (the
  // nodes joining, a model preparing) stops every process started so far and leaves at once.
  std::mutex started_m;
  std::vector<pid_t> started;
  auto started_add = [&](pid_t p) {
    std::lock_guard lock(started_m);
    started.push_back(p);
  };
  std::atomic<bool> loop_started{false};
  std::thread watcher([&] {
    const timespec tick{0, 100 * 1000 * 1000};
    while (!loop_started) {
      const int got = ::sigtimedwait(&set, nullptr, &tick);
      if (got <= 0) continue;
      std::vector<pid_t> pids;
      {
        std::lock_guard lock(started_m);
        pids = started;
      }
      std::fprintf(stderr, "troupe sim: %s while starting, stopping\n", got == SIGINT ? "SIGINT" : "SIGTERM");
      stop_together(pids);
      std::fflush(nullptr);
      std::_Exit(got == SIGINT ? 130 : 143);
    }
  });
  struct join_watcher {
    std::atomic<bool>& flag;
    std::thread& t;
    ~join_watcher() {
      flag = true;
      if (t.joinable()) t.join();
    }
  } watcher_guard{loop_started, watcher};

  const auto hb = {std::string("--heartbeat-ms"), std::to_string(o.heartbeat_ms), std::string("--timeout-ms"), std::to_string(o.timeout_ms)};
  std::vector<std::string> cargs{self, "coordinator", "--listen", "127.0.0.1:0", "--secret-file", (dir / "secret").string(), "--port-file",
                                 (dir / "port").string()};
  cargs.insert(cargs.end(), hb.begin(), hb.end());
  for (auto& a : tls_args("coordinator")) cargs.push_back(a);
  fs::remove(dir / "port");
  const pid_t coordinator = spawn(cargs, dir / "coordinator.log");
  started_add(coordinator);
  int port = 0;
  for (int i = 0; i < 200 && port == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream(dir / "port") >> port;
  }
  if (port == 0) {
    std::fprintf(stderr, "troupe sim: the coordinator did not start (see %s)\n", (dir / "coordinator.log").c_str());
    stop(coordinator);
    return 1;
  }
  // Each node reaches the coordinator through its own relay (cut / restore).
  std::vector<std::unique_ptr<link_relay>> relays;
  for (int i = 0; i < o.nodes; ++i) relays.push_back(std::make_unique<link_relay>(port));
  auto node_args = [&](int i) {
    std::vector<std::string> a{self, "node", "--join", "127.0.0.1:" + std::to_string(relays[static_cast<std::size_t>(i)]->port()), "--secret-file", (dir / "secret").string(),
                               "--node-id", "sim-node-" + std::to_string(i), "--threads", std::to_string(o.threads)};
    a.insert(a.end(), hb.begin(), hb.end());
    for (auto& t : tls_args("sim-node-" + std::to_string(i))) a.push_back(t);
    if (!o.device_memory.empty()) {
      a.push_back("--device-memory");
      a.push_back(o.device_memory);
    }
    return a;
  };
  std::vector<pid_t> nodes;
  for (int i = 0; i < o.nodes; ++i) {
    nodes.push_back(spawn(node_args(i), dir / ("node-" + std::to_string(i) + ".log")));
    started_add(nodes.back());
  }
  auto stop_all = [&] {
    std::vector<pid_t> all = nodes;
    all.push_back(coordinator);
    stop_together(all);
  };
  auto secret = actors::read_secret(dir / "secret");
  {
    std::ofstream f(dir / "cluster.toml");
    f << "# written by troupe sim: a client's view of this cluster (troupe submit --cluster-file " << (dir / "cluster.toml").string() << ")\n"
      << "[cluster]\ncoordinator = \"127.0.0.1:" << port << "\"\nsecret_file = \"" << (dir / "secret").string() << "\"\n"
      << "tls_cert = \"" << (certs / "client.pem").string() << "\"\ntls_key = \"" << (certs / "client.key").string() << "\"\ntls_ca = \""
      << (certs / "ca.pem").string() << "\"\n";
  }
  auto s = actors::session::connect("127.0.0.1", port, secret ? *secret : std::string(), {o.heartbeat_ms, o.timeout_ms},
                                    {(certs / "client.pem").string(), (certs / "client.key").string(), (certs / "ca.pem").string()});
  if (!s) {
    std::fprintf(stderr, "troupe sim: %s\n", describe(s.error()).c_str());
    stop_all();
    return 1;
  }
  for (int i = 0; i < 200; ++i) {
    // Every node joined (they join in any order), so a deployment spreads over all of them.
    if (auto st = (*s)->cluster_status(); st && st->nodes.size() >= static_cast<std::size_t>(o.nodes)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::printf("troupe sim: coordinator 127.0.0.1:%d, secret %s, %d node(s), logs in %s, cluster file %s (mutual TLS, a throw-away CA)\n", port,
              (dir / "secret").c_str(), o.nodes, dir.c_str(), (dir / "cluster.toml").c_str());
  for (const auto& model : models) {
    driver::driver_options d;
    d.max_rows = o.max_rows;
    d.capacity = o.capacity;
    d.prefill_chunk = 0;  // the node derives the chunk and the budget from the capacity
    d.token_budget = 0;
    // --replicas as given; left out, one per node, or as many as the nodes' declared memory holds.
    int replicas = o.replicas > 0 ? o.replicas : o.nodes;
    auto r = (*s)->deploy(model, replicas, d);
    while (!r && o.replicas == 0 && replicas > 1 && r.error().code == transport::error_code::no_room) r = (*s)->deploy(model, --replicas, d);
    if (!r) {
      std::fprintf(stderr, "troupe sim: deploy: %s\n", describe(r.error()).c_str());
      stop_all();
      return 1;
    }
    std::printf("troupe sim: '%s' deployed on %d replica(s)\n", r->c_str(), replicas);
  }
  const char* help =
      "commands: kill I | pause I | resume I | restart I | cut I | restore I | status | help | quit   (I: a node's index, 0 to %d)\n";
  std::printf(help, o.nodes - 1);
  const bool tty = ::isatty(0) != 0;
  auto prompt = [&] {
    if (tty) std::printf("troupe> ");
    std::fflush(stdout);
  };
  prompt();

  // The command loop polls stdin and the stop signals together (sigtimedwait), so SIGINT and SIGTERM
  // stop the sim at once even while it waits at its prompt.
  int sig = 0;
  bool quit = false, input_open = true;
  std::string pending;
  auto handle = [&](const std::string& line) {
    std::istringstream in(line);
    std::string cmd, arg;
    in >> cmd >> arg;
    const bool indexed = cmd == "kill" || cmd == "pause" || cmd == "resume" || cmd == "restart" || cmd == "cut" || cmd == "restore";
    int i = -1;
    if (indexed) {
      char* end = nullptr;
      const long v = arg.empty() ? -1 : std::strtol(arg.c_str(), &end, 10);
      if (!arg.empty() && *end == '\0' && v >= 0 && v < static_cast<long>(nodes.size())) i = static_cast<int>(v);
    }
    if (indexed && i < 0) {
      std::printf("%s takes a node index 0 to %d, got '%s'\n", cmd.c_str(), o.nodes - 1, arg.c_str());
    } else if (cmd == "kill") {
      if (nodes[static_cast<std::size_t>(i)] > 0) {
        ::kill(nodes[static_cast<std::size_t>(i)], SIGKILL);
        ::waitpid(nodes[static_cast<std::size_t>(i)], nullptr, 0);
      }
      nodes[static_cast<std::size_t>(i)] = -1;
      std::printf("node %d killed\n", i);
    } else if (cmd == "pause") {
      ::kill(nodes[static_cast<std::size_t>(i)], SIGSTOP);
      std::printf("node %d paused\n", i);
    } else if (cmd == "resume") {
      ::kill(nodes[static_cast<std::size_t>(i)], SIGCONT);
      std::printf("node %d resumed\n", i);
    } else if (cmd == "restart") {
      stop(nodes[static_cast<std::size_t>(i)]);
      nodes[static_cast<std::size_t>(i)] = spawn(node_args(i), dir / ("node-" + std::to_string(i) + ".log"));
      std::printf("node %d restarted\n", i);
    } else if (cmd == "cut") {
      relays[static_cast<std::size_t>(i)]->cut();
      std::printf("node %d's link cut\n", i);
    } else if (cmd == "restore") {
      relays[static_cast<std::size_t>(i)]->restore();
      std::printf("node %d's link restored\n", i);
    } else if (cmd == "status") {
      auto st = (*s)->status();
      std::printf("%s\n", st ? st->c_str() : describe(st.error()).c_str());
    } else if (cmd == "help") {
      std::printf(help, o.nodes - 1);
    } else if (cmd == "quit") {
      quit = true;
    } else if (!cmd.empty()) {
      std::printf("unknown command '%s' (help lists them)\n", cmd.c_str());
    }
    if (!quit) prompt();
  };
  loop_started = true;
  watcher.join();
  const timespec tick{0, 100 * 1000 * 1000};
  while (!quit) {
    if (const int got = ::sigtimedwait(&set, nullptr, &tick); got > 0) {
      sig = got;
      break;
    }
    // Reap nodes that died on their own (no zombies while the sim runs).
    for (auto& p : nodes)
      if (p > 0 && ::waitpid(p, nullptr, WNOHANG) == p) p = -1;
    if (!input_open) continue;  // without a terminal (stdin at its end) the cluster runs until a signal
    pollfd in{0, POLLIN, 0};
    if (::poll(&in, 1, 0) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(0, buf, sizeof buf);
    if (n <= 0) {
      input_open = false;
      if (!pending.empty()) handle(pending);
      pending.clear();
      continue;
    }
    pending.append(buf, static_cast<std::size_t>(n));
    if (pending.size() > (1 << 16)) pending.clear();  // a line that long is no command
    for (auto nl = pending.find('\n'); nl != std::string::npos && !quit; nl = pending.find('\n')) {
      const std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      handle(line);
    }
  }
  if (sig) std::printf("\ntroupe sim: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  std::fflush(stdout);
  s->reset();
  stop_all();
  relays.clear();
  std::printf("troupe sim: stopped\n");
  std::fflush(stdout);
  return sig == SIGINT ? 130 : sig == SIGTERM ? 143 : 0;
}

}  // namespace troupe::cluster
