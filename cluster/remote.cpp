// The processes of a cluster (actors/remote.hpp): the coordinator and node processes, their HMAC joins
// through a gatekeeper, mutual TLS, heartbeats and drains, and the session a command-line client opens.
// The actors themselves are in actors.cpp.
#include "cluster/remote.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/io/basp_broker.hpp>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <set>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "actors/actor_internals.hpp"
#include "actors/model_needs.hpp"
#include "actors/status_text.hpp"
#include "cluster/guarded_middleman.hpp"
#include "engine/exec/cuda/cuda_executor.hpp"
#include "transport/codec.hpp"
#include "transport/collectives.hpp"

namespace troupe::actors {

// ---- across processes ------------------------------------------------------------------------------------

result<std::string, std::string> read_secret(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return unexpected("cannot read the secret file " + file.string());
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.size() < 16) return unexpected("the secret in " + file.string() + " is shorter than 16 bytes");
  return s;
}

std::string hmac_sha256_hex(const std::string& key, const std::string& message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &len);
  static constexpr char hex[] = "0123456789abcdef";
  std::string h;
  for (unsigned i = 0; i < len; ++i) {
    h += hex[out[i] >> 4];
    h += hex[out[i] & 15];
  }
  return h;
}

namespace {

std::string random_nonce() {
  std::random_device rd;
  std::string n;
  static constexpr char hex[] = "0123456789abcdef";
  for (int i = 0; i < 32; ++i) n += hex[rd() & 15];
  return n;
}

// Structured logs: one line per event, `key=value` fields after the time and level, the process's role
// and id first. TROUPE_LOG sets the level (trace, debug, info, warn, error; default info).
void init_logging(const std::string& role, const std::string& id) {
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ " + role + "=" + id + " %v");
  if (const char* lvl = std::getenv("TROUPE_LOG")) spdlog::set_level(spdlog::level::from_str(lvl));
}

struct gatekeeper_state {
  gatekeeper_state() = default;  // not an aggregate (CAF would build it from the actor's pointer)
  std::string secret;
  coordinator_actor coordinator;
  std::deque<std::string> nonces;  // issued, unused
  static inline const char* name = "gatekeeper";
};

// What a peer reaches before it is trusted (the one actor the coordinator process publishes): a nonce,
// then, for a proof of the secret, the coordinator's handle (or a typed Error).
using gatekeeper_actor_t =
    caf::typed_actor<caf::replies_to<join_atom>::with<std::string>,
                     caf::replies_to<join_atom, std::string, std::string, std::string, std::string, caf::actor, std::string, std::int32_t>::with<
                         caf::actor, std::string>>;

gatekeeper_actor_t::behavior_type gatekeeper_actor(caf::stateful_actor<gatekeeper_state, gatekeeper_actor_t::base>* self, std::string secret,
                                                   coordinator_actor coordinator) {
  self->state.secret = std::move(secret);
  self->state.coordinator = coordinator;
  return {
      [=](join_atom) {
        auto& n = self->state.nonces;
        if (n.size() >= 1024) n.pop_front();
        n.push_back(random_nonce());
        return n.back();
      },
      [=](join_atom, const std::string& role, const std::string& id, const std::string& nonce, const std::string& proof,
          const caf::actor& peer, const std::string& inventory, std::int32_t max_replicas) -> caf::typed_response_promise<caf::actor, std::string> {
        auto& st = self->state;
        auto rp = self->make_response_promise<caf::actor, std::string>();
        auto answer = [&](caf::actor a, std::string why, transport::error_code code = transport::error_code::unauthenticated) {
          rp.deliver(std::move(a), why.empty() ? std::string() : transport::encode(transport::error{0, code, std::move(why), transport::retry::failed}));
          return rp;
        };
        auto it = std::find(st.nonces.begin(), st.nonces.end(), nonce);
        if (it == st.nonces.end()) return answer(caf::actor{}, std::string("unknown or used nonce"));
        st.nonces.erase(it);
        const auto expected = hmac_sha256_hex(st.secret, nonce + "|" + role + "|" + id);
        if (proof.size() != expected.size() || CRYPTO_memcmp(proof.data(), expected.data(), expected.size()) != 0) {
          spdlog::warn("event=join_refused role={} id={} reason=bad_proof", role, id);
          return answer(caf::actor{}, std::string("the proof does not match the cluster secret"));
        }
        if (role != "node") return answer(caf::actor_cast<caf::actor>(st.coordinator), std::string());
        if (!peer) return answer(caf::actor{}, std::string("a node must send its handle"), transport::error_code::invalid_request);
        // The coordinator decides (node ids are unique); its handle goes out only once it took the node.
        self->request(st.coordinator, std::chrono::seconds(10), node_atom::value, id, peer, max_replicas, inventory)
            .then(
                [=](const std::string& why) mutable {
                  if (!why.empty()) {
                    const auto code = why.find("is taken") != std::string::npos ? transport::error_code::name_taken : transport::error_code::invalid_request;
                    rp.deliver(caf::actor{}, transport::encode(transport::error{0, code, why, transport::retry::failed}));
                    return;
                  }
                  rp.deliver(caf::actor_cast<caf::actor>(self->state.coordinator), std::string());
                },
                [=](caf::error& e) mutable {
                  rp.deliver(caf::actor{}, transport::encode(transport::error{0, transport::error_code::internal,
                                                                              "the coordinator did not answer: " + self->system().render(e), transport::retry::overloaded}));
                });
        return rp;
      },
  };
}

void configure(caf::actor_system_config& cfg, const heartbeat_options& hb, std::size_t threads) {
  cfg.load<caf::io::middleman>();
  cfg.set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(hb.interval_ms)});
  cfg.set("middleman.connection-timeout", caf::timespan{std::chrono::milliseconds(hb.timeout_ms)});
  cfg.set("scheduler.max-threads", threads);
  cfg.set("scheduler.policy", caf::atom("sharing"));
}

// The guard's settings for a process's links (cluster/link_guard.hpp): TLS from the files, or plain
// links, which only a loopback address may use.
result<cluster::guarded_links, std::string> links_for(const tls_options& tls, const std::string& host, bool server) {
  cluster::guarded_links l;
  if (!tls.enabled()) {
    if (!cluster::is_loopback(host))
      return unexpected("plain links are for loopback addresses only; " + host + " needs mutual TLS (--tls-cert, --tls-key, --tls-ca; troupe certs)");
    return l;
  }
  auto ctx = server ? cluster::server_tls({tls.certificate, tls.key, tls.ca_file}) : cluster::client_tls({tls.certificate, tls.key, tls.ca_file});
  if (!ctx) return unexpected(ctx.error());
  l.tls = *ctx;
  return l;
}

// CAF 0.17 keeps the proxies of actors on nodes this process reached only through a link that died
// (the clients, reached through the coordinator): after a rejoin, messages to them would go nowhere.
// Every proxy goes when the coordinator is lost; the next message naming a remote actor makes a fresh
// one, with its route through the new link. Runs on the multiplexer's thread, where the BASP broker runs.
void forget_remote_proxies(caf::actor_system& sys) {
  auto basp = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  auto* bb = dynamic_cast<caf::io::basp_broker*>(caf::actor_cast<caf::abstract_actor*>(basp));
  if (!bb) return;
  // Done before the rejoin starts: cleared in the middle of the new link's handshake, it would take
  // the new gatekeeper's proxy with it.
  auto done = std::make_shared<std::promise<void>>();
  auto cleared = done->get_future();
  sys.middleman().backend().post([bb, keep = basp, done] {
    bb->proxy_registry_ptr()->clear();
    done->set_value();
  });
  cleared.wait_for(std::chrono::seconds(5));
}

// The guarded middleman actor of a process, stopped before its actor system goes.
struct guarded_mm {
  caf::io::middleman_actor handle;
  ~guarded_mm() {
    if (handle) caf::anon_send_exit(handle, caf::exit_reason::kill);
    handle = caf::io::middleman_actor{};
  }
};

sigset_t block_stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

// How long reaching a gatekeeper may take (the TCP connection and CAF's handshake), and each of the two
// steps of proving the secret to it: a coordinator gone mid-join (its old link not yet torn down) is
// noticed within this.
constexpr auto connect_timeout = std::chrono::seconds(30);

// Proves the secret to a gatekeeper; the coordinator's handle, or why not.
// `inventory`: a node's devices (an encoded Inventory) and `max_replicas` its bound; the coordinator
// takes both with the join, so a joined node is placeable at once.
result<caf::actor, join_error> join(caf::actor_system& sys, const std::string& host, int port, const std::string& secret,
                                     const std::string& role, const std::string& id, const caf::actor& peer, const caf::io::middleman_actor& mm,
                                     const std::string& inventory = {}, std::int32_t max_replicas = 0) {
  // The connection is asked of the middleman with a bound rather than through remote_actor(), which
  // waits without one: CAF 0.17's handshake has no timeout of its own (actor-framework issue #504), so a
  // peer that accepts and never answers would hold a rejoining node forever.
  caf::scoped_actor self{sys};
  caf::actor gatekeeper;
  std::string reach_err = "no answer within " + std::to_string(connect_timeout.count()) + " s";
  self->request(mm, connect_timeout, caf::connect_atom::value, host, static_cast<std::uint16_t>(port))
      .receive([&](const caf::node_id&, caf::strong_actor_ptr& p, const std::set<std::string>&) { gatekeeper = caf::actor_cast<caf::actor>(std::move(p)); },
               [&](caf::error& e) { reach_err = sys.render(e); });
  if (!gatekeeper)
    return unexpected(join_error{join_error_code::unreachable, "cannot reach the coordinator at " + host + ":" + std::to_string(port) + ": " + reach_err});
  auto gk = &gatekeeper;
  std::string nonce, err;
  // A loaded coordinator (dozens of peers joining at once on two cores) may answer a first challenge
  // late: ask up to three times within the same overall bound.
  for (int attempt = 0; attempt < 3 && nonce.empty(); ++attempt)
    self->request(*gk, connect_timeout / 3, join_atom::value).receive([&](const std::string& n) { nonce = n; }, [&](caf::error& e) { err = sys.render(e); });
  if (nonce.empty()) return unexpected(join_error{join_error_code::no_challenge, "no challenge from the coordinator: " + err});
  caf::actor coordinator;
  std::string refusal;
  self->request(*gk, connect_timeout, join_atom::value, role, id, nonce, hmac_sha256_hex(secret, nonce + "|" + role + "|" + id), peer, inventory,
                max_replicas)
      .receive([&](const caf::actor& c, const std::string& e) { coordinator = c, refusal = e; }, [&](caf::error& e) { err = sys.render(e); });
  if (coordinator) return coordinator;
  if (refusal.empty()) return unexpected(join_error{join_error_code::no_challenge, "no answer to the proof: " + err});
  auto m = transport::decode(refusal);
  if (!m || !std::holds_alternative<transport::error>(*m)) return unexpected(join_error{join_error_code::bad_answer, "the gatekeeper's answer did not decode"});
  const auto& e = std::get<transport::error>(*m);
  return unexpected(join_error{e.code == transport::error_code::name_taken ? join_error_code::id_taken : join_error_code::refused, e.message});
}

}  // namespace

int run_coordinator(const coordinator_process_options& o) {
  init_logging("coordinator", o.host + ":" + std::to_string(o.port));
  auto set = block_stop_signals();
  auto links = links_for(o.tls, o.host, true);
  if (!links) {
    spdlog::error("event=listen_refused address={}:{} reason=\"{}\"", o.host, o.port, links.error());
    std::fprintf(stderr, "troupe coordinator: %s\n", links.error().c_str());
    return 2;
  }
  caf::actor_system_config cfg;
  configure(cfg, o.heartbeat, 2);
  caf::actor_system sys{cfg};
  guarded_mm mm{cluster::spawn_guarded_middleman(sys, *links)};
  auto registry = spawn_registry(sys);
  std::string journal;
  if (!o.state_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.state_dir, ec);
    if (ec) {
      spdlog::error("event=state_dir_unusable path={} reason=\"{}\"", o.state_dir.string(), ec.message());
      return 1;
    }
    journal = (o.state_dir / "deployments.journal").string();
  }
  auto coordinator = spawn_coordinator(sys, registry, caf::actor{}, o.max_outstanding, o.max_per_replica, journal,
                                       std::chrono::milliseconds(o.progress_timeout_ms));
  auto gatekeeper = sys.spawn(gatekeeper_actor, o.secret, coordinator);
  auto stop = [&] {
    caf::anon_send_exit(gatekeeper, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(registry, caf::exit_reason::user_shutdown);
  };
  std::string published_err;
  bool published = false;
  {
    caf::scoped_actor self{sys};
    self->request(mm.handle, std::chrono::seconds(10), caf::publish_atom::value, std::uint16_t{0}, caf::actor_cast<caf::strong_actor_ptr>(gatekeeper),
                  std::set<std::string>{}, std::string(), true)
        .receive([&](std::uint16_t) { published = true; }, [&](caf::error& e) { published_err = sys.render(e); });
  }
  auto front = published ? cluster::link_front::start(o.host, o.port, links->tls, [feed = links->feed] { return cluster::feed_connection(*feed); }, links->limits)
                         : result<std::unique_ptr<cluster::link_front>, std::string>(unexpected(published_err));
  if (!front) {
    spdlog::error("event=listen_failed address={}:{} reason=\"{}\"", o.host, o.port, front.error());
    stop();
    return 1;
  }
  const int port = (*front)->port();
  if (!o.port_file.empty()) {
    std::ofstream f(o.port_file);
    f << port << "\n";
  }
  spdlog::info("event=listening address={}:{} links={}", o.host, port, links->tls ? "mutual_tls" : "plain_loopback");
  std::printf("troupe coordinator: listening on %s:%d\n", o.host.c_str(), port);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  spdlog::info("event=stopping");
  front->reset();
  cluster::close_feed(*links->feed);
  stop();
  return 0;
}

namespace {

// The devices a node declares when it joins: a simulated CPU device of --device-memory, or its GPU with
// the free memory the CUDA runtime reports (or --device-memory when given).
std::vector<transport::device> node_devices(const node_process_options& o) {
  if (!o.cuda_devices.empty()) {
    std::vector<transport::device> out;
    const auto devs = exec::cuda::devices();
    for (int d : o.cuda_devices) {
      std::uint64_t memory = o.device_memory;
      if (memory == 0 && devs && d < static_cast<int>(devs->size())) memory = (*devs)[static_cast<std::size_t>(d)].memory_bytes;
      out.push_back({"cuda:" + std::to_string(d), transport::device_kind::cuda, memory});
    }
    return out;
  }
  return {{"cpu:0", transport::device_kind::cpu, o.device_memory}};
}

}  // namespace

int run_node(const node_process_options& o) {
  auto set = block_stop_signals();
  const std::string id = o.node_id.empty() ? "node-" + std::to_string(::getpid()) : o.node_id;
  init_logging("node", id);
  auto links = links_for(o.tls, o.host, false);
  if (!links) {
    spdlog::error("event=join_refused reason=\"{}\"", links.error());
    std::fprintf(stderr, "troupe node: %s\n", links.error().c_str());
    return 2;
  }
  std::atomic<bool> signalled{false};
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&set, &sig);
    signalled = true;
  });
  int rc = 0;
  bool joined_once = false;
  // Joins, serves until the coordinator is lost, then (its replicas gone with the link) joins again
  // with a fresh node actor. One actor system serves every membership: tearing one down waits for
  // every detached replica thread to be released, and a replica the lost link still references would
  // hold that wait forever (seen once in thirty cut-and-restore runs).
  caf::actor_system_config cfg;
  configure(cfg, o.heartbeat, 2);
  caf::actor_system sys{cfg};
  guarded_mm mm{cluster::spawn_guarded_middleman(sys, *links)};
  const std::string collective_host = o.collective_host.empty() ? local_address_toward(o.host, o.port) : o.collective_host;
  spdlog::info("event=collectives_listen host={}", collective_host);
  // One node actor for every membership: the replicas it runs outlive a lost coordinator, and the next
  // coordinator it joins (the same one after a cut, or a restarted one) takes them back without a
  // reload (held_atom); those it does not want, it stops.
  auto node = spawn_node(sys, o.executor_threads, o.max_per_replica, o.device_memory, collective_host, o.cuda_devices);
  while (!signalled) {
    if (joined_once) spdlog::info("event=rejoining coordinator={}:{}", o.host, o.port);
    auto coordinator = join(sys, o.host, o.port, o.secret, "node", id, caf::actor_cast<caf::actor>(node), mm.handle,
                            transport::encode(transport::inventory{{transport::node_inventory{id, node_devices(o)}}}), o.max_replicas);
    if (!coordinator) {
      // A rejoin may find its old membership not yet noticed as lost (its id still taken): ask again.
      const auto& e = coordinator.error();
      const bool refused = !e.retryable() && !(e.code == join_error_code::id_taken && joined_once);
      if (refused || !joined_once) {
        spdlog::error("event=join_failed code={} reason=\"{}\"", name(e.code), e.reason);
        std::fprintf(stderr, "troupe node: %s\n", e.message().c_str());
        rc = refused ? 3 : 1;
        break;
      }
      spdlog::info("event=rejoin_failed code={} reason=\"{}\" action=retry", name(e.code), e.reason);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      continue;
    }
    joined_once = true;
    std::printf("troupe node: '%s' joined %s:%d\n", id.c_str(), o.host.c_str(), o.port);
    std::fflush(stdout);
    spdlog::info("event=joined coordinator={}:{}", o.host, o.port);
    caf::scoped_actor self{sys};
    self->monitor(*coordinator);
    bool lost = false;
    while (!signalled && !lost)
      self->receive([&](caf::down_msg&) { lost = true; }, caf::after(std::chrono::milliseconds(200)) >> [] {});
    if (signalled && !lost) {
      // Graceful leave: the coordinator routes nothing new here, running jobs finish, then we go.
      spdlog::info("event=draining");
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(o.drain_timeout_s);
      std::int32_t left = 1;
      while (left > 0 && !lost && std::chrono::steady_clock::now() < deadline) {
        // A short bound: a coordinator that went down with us answers nothing, and we should not linger.
        self->request(caf::actor_cast<coordinator_actor>(*coordinator), std::chrono::seconds(5), drain_atom::value, caf::actor_cast<caf::actor>(node))
            .receive([&](std::int32_t n) { left = n; }, [&](caf::error&) { lost = true; });
        if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      if (left == 0) spdlog::info("event=drained");
      else spdlog::warn("event=drain_timeout replicas_running={}", left);
    }
    if (lost && !signalled) {
      spdlog::warn("event=coordinator_lost action=rejoin replicas=kept");
      forget_remote_proxies(sys);
    }
  }
  caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
  if (!signalled) pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  // The actor system's teardown waits for the last reference to every detached actor (each replica's
  // driver), and one still held on behalf of a peer whose link is gone keeps it waiting for good (seen
  // with the coordinator stopped first). The replicas have drained or lost their coordinator by now:
  // the process leaves without that teardown.
  spdlog::info("event=stopped");
  if (auto l = spdlog::default_logger()) l->flush();
  std::fflush(nullptr);
  std::_Exit(rc);
}

struct session_state {
  std::string model;  // what deploy() named, when this session deployed
  std::shared_ptr<std::atomic<bool>> lost = std::make_shared<std::atomic<bool>>(false);  // the coordinator's link
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  coordinator_actor coordinator;
  caf::actor watcher;  // monitors the coordinator (sets `lost`)
  caf::io::middleman_actor mm;  // the guarded middleman (cluster/guarded_middleman.hpp)
  client_set clients;
  // Reconnection: while the coordinator is lost, a thread joins again every half second; once back,
  // the queries and every open client use the new link.
  std::string host, secret;
  int port = 0;
  std::mutex m;  // guards `coordinator` and `clients` against the reconnecting thread
  std::atomic<bool> stopping{false};
  std::thread reconnector;
  coordinator_actor current() {
    std::lock_guard lock(m);
    return coordinator;
  }
  void watch(const caf::actor& c) {
    watcher = sys->spawn([lost = lost, c](caf::event_based_actor* self) -> caf::behavior {
      self->monitor(c);
      self->set_down_handler([lost, self](caf::down_msg&) {
        *lost = true;
        self->quit();
      });
      return {[](ping_atom) { return ping_atom::value; }};
    });
  }
  void reconnect_loop() {
    while (!stopping) {
      for (int i = 0; i < 5 && !stopping; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (stopping || !*lost) continue;
      auto c = join(*sys, host, port, secret, "client", "client-" + std::to_string(::getpid()), caf::actor{}, mm);
      if (!c || stopping) continue;
      {
        std::lock_guard lock(m);
        coordinator = caf::actor_cast<coordinator_actor>(*c);
        if (watcher) caf::anon_send_exit(watcher, caf::exit_reason::user_shutdown);
        watch(*c);
        clients.rehome(coordinator);
      }
      *lost = false;
      spdlog::info("event=coordinator_back address={}:{}", host, port);
    }
  }
  ~session_state() {
    stopping = true;
    if (reconnector.joinable()) reconnector.join();
    clients.close_all();
    if (watcher) caf::anon_send_exit(watcher, caf::exit_reason::user_shutdown);
    if (mm) caf::anon_send_exit(mm, caf::exit_reason::kill);
    mm = caf::io::middleman_actor{};  // the last strong reference: the actor system waits for it
    coordinator = coordinator_actor{};
    sys.reset();
  }
};

session::session(std::unique_ptr<session_state> s) : s_(std::move(s)) {}
session::~session() = default;

std::string_view name(join_error_code c) {
  switch (c) {
    case join_error_code::unreachable: return "unreachable";
    case join_error_code::no_challenge: return "no_challenge";
    case join_error_code::refused: return "refused";
    case join_error_code::id_taken: return "id_taken";
    case join_error_code::bad_answer: return "bad_answer";
  }
  return "unknown";
}

result<std::unique_ptr<session>, join_error> session::connect(const std::string& host, int port, const std::string& secret, heartbeat_options hb,
                                                              tls_options tls) {
  auto links = links_for(tls, host, false);
  if (!links) return unexpected(join_error{join_error_code::refused, links.error()});
  auto s = std::make_unique<session_state>();
  configure(s->cfg, hb, 2);
  s->sys = std::make_unique<caf::actor_system>(s->cfg);
  s->mm = cluster::spawn_guarded_middleman(*s->sys, *links);
  auto c = join(*s->sys, host, port, secret, "client", "client-" + std::to_string(::getpid()), caf::actor{}, s->mm);
  if (!c) return unexpected(c.error());
  s->coordinator = caf::actor_cast<coordinator_actor>(*c);
  s->host = host, s->port = port, s->secret = secret;
  // A watcher of the coordinator's link: a lost coordinator is known at once (healthy(), the queries),
  // not after a request's timeout; then the reconnector tries to join again.
  s->watch(*c);
  s->reconnector = std::thread([st = s.get()] { st->reconnect_loop(); });
  return std::unique_ptr<session>(new session(std::move(s)));
}

std::unique_ptr<client> session::connect() { return client_session(); }

std::unique_ptr<client> session::client_session() {
  std::lock_guard lock(s_->m);
  return s_->clients.open(*s_->sys, s_->coordinator);
}

result<std::string, cluster_error> session::deploy(const std::filesystem::path& model, std::int32_t replicas, const driver::driver_options& o,
                                                  std::int32_t tensor_parallel, std::int32_t pipeline_parallel, bool across_nodes) {
  deploy_request r;
  r.model = model;
  r.replicas = replicas;
  r.options = o;
  r.tensor_parallel = tensor_parallel;
  r.pipeline_parallel = pipeline_parallel;
  r.across_nodes = across_nodes;
  return deploy(r);
}

namespace {

cluster_error no_answer(std::string why) { return {0, transport::error_code::disconnected, std::move(why), transport::retry::disconnected}; }

// A deploy or scale reply: the served name, or the refusal.
result<std::string, cluster_error> reply_of(const std::string& bytes, const std::string& fallback) {
  if (bytes.empty()) return unexpected(no_answer(fallback));
  auto m = transport::decode(bytes);
  if (!m) return unexpected(cluster_error{0, transport::error_code::bad_message, m.error().message(), transport::retry::failed});
  if (auto* e = std::get_if<transport::error>(&*m)) return unexpected(*e);
  if (auto* d = std::get_if<transport::deploy>(&*m)) return d->model;
  if (auto* s = std::get_if<transport::scale>(&*m)) return s->model;
  return unexpected(cluster_error{0, transport::error_code::bad_message, "an answer of kind " + std::string(transport::kind(*m)), transport::retry::failed});
}

}  // namespace

result<std::string, cluster_error> session::deploy(const deploy_request& r) {
  const auto& o = r.options;
  transport::deploy d;
  d.model = r.name.empty() ? served_name(r.model) : r.name;
  d.replicas = r.replicas;
  d.goal = r.goal;
  d.load.model = std::filesystem::absolute(r.model).lexically_normal().string();
  d.load.device = "cpu";
  d.load.max_rows = o.max_rows;
  d.load.capacity = o.capacity;
  d.load.block_size = o.block_size;
  d.load.pool_blocks = o.pool_blocks;
  d.load.prefill_chunk = o.prefill_chunk;
  d.load.token_budget = o.token_budget;
  d.load.no_prefix_cache = !o.prefix_cache;
  d.load.no_preempt = !o.preempt;
  d.load.tensor_parallel = r.tensor_parallel;
  d.load.pipeline_parallel = r.pipeline_parallel;
  d.load.across_nodes = r.across_nodes;
  d.load.expert_parallel = r.expert_parallel;
  d.load.kv_type = r.kv_type;
  d.load.mmproj = r.mmproj.string();
  put_speculation(d.load, o.speculation);
  caf::scoped_actor self{*s_->sys};
  std::string bytes, err = "no answer";
  self->request(s_->current(), request_timeout, deploy_atom::value, transport::encode(d))
      .receive([&](const std::string& b) { bytes = b; }, [&](caf::error& e) { err = s_->sys->render(e); });
  auto name = reply_of(bytes, err);
  if (name) s_->model = *name;
  return name;
}

std::shared_ptr<transport::rendezvous_store> session::rendezvous_store() { return coordinator_rendezvous(*s_->sys, s_->current()); }

result<std::string, cluster_error> session::scale(const std::string& model, std::int32_t replicas) {
  caf::scoped_actor self{*s_->sys};
  std::string bytes, err = "no answer";
  self->request(s_->current(), request_timeout, scale_atom::value, transport::encode(transport::scale{model, replicas}))
      .receive([&](const std::string& b) { bytes = b; }, [&](caf::error& e) { err = s_->sys->render(e); });
  return reply_of(bytes, err);
}

std::vector<transport::stats> session::replica_stats() {
  if (*s_->lost) return {};
  return collect_replica_stats(*s_->sys, s_->current());
}

std::string session::model_name() const {
  if (!s_->model.empty()) return s_->model;
  auto names = served_models(*s_->sys, s_->current());
  return names.empty() ? std::string() : names.front();
}

std::vector<std::string> session::models() {
  if (*s_->lost) return {};
  return served_models(*s_->sys, s_->current());
}

bool session::healthy() { return !*s_->lost; }

result<transport::cluster_status, cluster_error> session::cluster_status() {
  auto s = cluster_status_of(*s_->sys, s_->current());
  if (!s) return unexpected(no_answer(s.error()));
  return *s;
}

result<std::string, cluster_error> session::status() {
  auto s = cluster_status();
  if (!s) return unexpected(s.error());
  return status_json(*s);
}

}  // namespace troupe::actors
