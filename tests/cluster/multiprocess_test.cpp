// A cluster of processes on loopback: a coordinator and three nodes (the troupe binary), sessions from
// this process. 100 jobs survive a node killed with SIGKILL mid-generation, each token delivered once
// and every output equal to the driver alone with the same seeds; a paused node past the heartbeat
// timeout costs nothing and rejoins; a node with the wrong secret is refused.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "tests/support/loopback.hpp"
#include "actors/gateway.hpp"
#include "cluster/remote.hpp"
#include "transport/collectives.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "actors/model_needs.hpp"
#include "families/fixtures/fixture.hpp"
#include "placement/assign.hpp"
#include "tests/support/served_model.hpp"

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;

struct process {
  pid_t pid = -1;
  process() = default;
  process(process&& o) noexcept : pid(std::exchange(o.pid, -1)) {}
  process& operator=(process&& o) noexcept {
    if (this != &o) {
      stop();
      pid = std::exchange(o.pid, -1);
    }
    return *this;
  }
  ~process() { stop(); }
  void stop() {
    if (pid <= 0) return;
    ::kill(pid, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid, nullptr, WNOHANG) == pid) {
        pid = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
  int wait_exit() {
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
};

// Everything the child needs is prepared before fork: between fork and exec a child of a threaded
// process may only make async-signal-safe calls (no allocation).
process spawn(const std::vector<std::string>& args, const fs::path& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const std::string log_path = log.string();
  process p;
  p.pid = ::fork();
  if (p.pid == 0) {
    const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return p;
}

struct cluster_fixture {
  fs::path dir;
  std::string secret = "test-cluster-secret-0123456789";
  process coordinator;
  std::vector<process> nodes;
  int port = 0;

  cluster_fixture() {
    dir = fs::temp_directory_path() / ("troupe-mp-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    std::ofstream(dir / "secret") << secret << "\n";
    coordinator = spawn({TROUPE_BIN, "coordinator", "--listen", "127.0.0.1:0", "--insecure", "--secret-file", (dir / "secret").string(), "--port-file",
                         (dir / "port").string(), "--heartbeat-ms", "200", "--timeout-ms", "800"},
                        dir / "coordinator.log");
    for (int i = 0; i < 600 && port == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::ifstream(dir / "port") >> port;
    }
  }
  // A coordinator on this fixture's port that keeps its desired state in dir/state (stop the
  // fixture's own first).
  process stateful_coordinator(const std::string& log) {
    return spawn({TROUPE_BIN, "coordinator", "--listen", "127.0.0.1:" + std::to_string(port), "--insecure", "--secret-file", (dir / "secret").string(),
                  "--state-dir", (dir / "state").string(), "--heartbeat-ms", "200", "--timeout-ms", "800"},
                 dir / log);
  }
  process node(const std::string& id, const std::string& secret_file) {
    return spawn({TROUPE_BIN, "node", "--join", "127.0.0.1:" + std::to_string(port), "--insecure", "--secret-file", secret_file, "--node-id", id,
                  "--heartbeat-ms", "200", "--timeout-ms", "800"},
                 dir / (id + ".log"));
  }
  ~cluster_fixture() {
    nodes.clear();
    coordinator.stop();
    if (!::testing::Test::HasFailure()) fs::remove_all(dir);
  }
};

families::fixture_dims model_dims() {
  families::fixture_dims d;
  d.vocab = 512;
  d.hidden = 256;
  d.ffn = 512;
  d.heads = 4;
  d.kv_heads = 2;
  d.head_dim = 64;
  d.layers = 4;
  return d;
}

fs::path model_path() {
  static const fs::path p = [] {
    const auto d = model_dims();
    const auto path = fs::temp_directory_path() / ("troupe-mp-model-" + std::to_string(::getpid()) + ".gguf");
    EXPECT_TRUE(families::write_fixture("llama", d, path, true));
    return path;
  }();
  return p;
}

driver::driver_options driver_opts() {
  driver::driver_options o;
  o.max_rows = 8;
  o.capacity = 128;
  o.block_size = 16;
  o.prefill_chunk = 32;
  o.token_budget = 64;
  return o;
}

transport::job_submit job_for(int i) {
  transport::job_submit j;
  std::vector<std::int32_t> ids;
  for (int t = 0; t < 4 + i % 13; ++t) ids.push_back(3 + (t * 29 + i * 13) % 500);
  j.prompt = ids;
  j.max_tokens = 40;
  j.ignore_eos = true;
  j.sampling.temperature = i % 2 ? 0.9f : 0.0f;
  j.sampling.seed = 500 + static_cast<std::uint64_t>(i);
  return j;
}

std::vector<std::vector<std::int32_t>> reference(int n) {
  auto h = test::served_model(model_path());
  exec::cpu::cpu_executor ex({1, std::nullopt});
  auto d = driver::driver<driver::unprepared>(h, ex, driver_opts()).prepare();
  std::vector<std::vector<std::int32_t>> out;
  for (int i = 0; i < n; ++i) {
    const auto j = job_for(i);
    driver::seq_request r;
    r.prompt = std::get<std::vector<std::int32_t>>(j.prompt);
    r.max_tokens = j.max_tokens;
    r.ignore_eos = true;
    r.sampling.temperature = j.sampling.temperature;
    r.sampling.seed = j.sampling.seed;
    out.push_back(d->generate(r)->tokens);
  }
  return out;
}

// `n` jobs submitted at once on a session over nodes `c.nodes` (their `names` joined first, the model
// deployed with `o` on one replica each); once the first job has produced tokens, node `victim` dies by
// SIGKILL. Every job must finish with the driver's tokens alone; returns how many were resumed.
int kill_mid_generation(cluster_fixture& c, session& s, const std::vector<std::string>& names, const driver::driver_options& o, int n,
                        int victim) {
  for (int i = 0; i < 100; ++i) {
    auto st = s.status();
    if (st && std::all_of(names.begin(), names.end(), [&](const std::string& nm) { return st->find("\"" + nm + "\"") != std::string::npos; })) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto d = s.deploy(model_path(), static_cast<int>(names.size()), o);
  EXPECT_TRUE(d) << describe(d.error());
  if (!d) return 0;
  const auto ref = reference(n);
  auto cl = s.client_session();
  std::vector<job> jobs;
  for (int i = 0; i < n; ++i) {
    auto jb = cl->submit(job_for(i));
    EXPECT_TRUE(jb) << jb.error().message;
    if (!jb) return 0;
    jobs.push_back(std::move(*jb));
  }
  EXPECT_TRUE(jobs.front().next());
  ::kill(c.nodes[static_cast<std::size_t>(victim)].pid, SIGKILL);
  ::waitpid(c.nodes[static_cast<std::size_t>(victim)].pid, nullptr, 0);
  c.nodes[static_cast<std::size_t>(victim)].pid = -1;
  int resumed = 0;
  double recovery = 0;
  for (int i = 0; i < n; ++i) {
    const auto r = jobs[static_cast<std::size_t>(i)].wait();
    resumed += r.resumes > 0;
    if (r.resumes > 0) recovery = std::max(recovery, r.longest_gap_s);
    EXPECT_FALSE(r.error) << "job " << i << ": " << (r.error ? r.error->message : "");
    EXPECT_EQ(r.finish_reason, "length") << "job " << i;
    EXPECT_EQ(r.tokens, ref[static_cast<std::size_t>(i)]) << "job " << i;
  }
  std::printf("kill -9: jobs resumed on another replica: %d of %d; longest wait between two tokens of a resumed job: %.3f s "
              "(heartbeat 200 ms, timeout 800 ms)\n", resumed, n, recovery);
  return resumed;
}

TEST(multiprocess, a_killed_node_loses_no_job_and_no_token_is_delivered_twice) {
  cluster_fixture c;
  ASSERT_GT(c.port, 0);
  for (int i = 0; i < 3; ++i) c.nodes.push_back(c.node("n" + std::to_string(i), (c.dir / "secret").string()));
  auto s = session::connect("127.0.0.1", c.port, c.secret, {200, 800});
  ASSERT_TRUE(s) << describe(s.error());
  EXPECT_GT(kill_mid_generation(c, **s, {"n0", "n1", "n2"}, driver_opts(), 100, 1), 0) << "the killed node held jobs in flight";
  auto st = (*s)->status();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->find("\"n1\""), std::string::npos) << *st;
}

// Speculation through the cluster: a deployment whose replicas draft with a q8_0 copy of the model
// (a path the nodes load) gives every job the tokens of the driver alone without drafts, also for the
// jobs a SIGKILLed node held, resumed on the other replica from their delivered output.
TEST(multiprocess, a_speculating_deployment_resumes_a_killed_nodes_jobs_with_the_same_tokens) {
  const auto draft = fs::temp_directory_path() / ("troupe-mp-draft-" + std::to_string(::getpid()) + ".gguf");
  auto dq = model_dims();
  dq.matrix_type = dtype::q8_0;
  ASSERT_TRUE(families::write_fixture("llama", dq, draft, true));
  cluster_fixture c;
  ASSERT_GT(c.port, 0);
  for (int i = 0; i < 2; ++i) c.nodes.push_back(c.node("n" + std::to_string(i), (c.dir / "secret").string()));
  auto s = session::connect("127.0.0.1", c.port, c.secret, {200, 800});
  ASSERT_TRUE(s) << describe(s.error());
  auto o = driver_opts();
  o.speculation.kind = driver::draft_kind::model;
  o.speculation.tokens = 3;
  o.speculation.draft_path = draft.string();
  kill_mid_generation(c, **s, {"n0", "n1"}, o, 24, 1);
  // The policy reaches the node: a draft checkpoint it cannot load fails the deployment, named.
  deploy_request req;
  req.model = model_path();
  req.name = "bad-draft";
  req.replicas = 1;
  req.options = o;
  req.options.speculation.draft_path = (c.dir / "no-such-draft.gguf").string();
  auto bad = (*s)->deploy(req);
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("draft model"), std::string::npos) << describe(bad.error());
  fs::remove(draft);
}

TEST(multiprocess, a_paused_node_is_declared_lost_rejoins_and_duplicates_nothing) {
  cluster_fixture c;
  for (int i = 0; i < 2; ++i) c.nodes.push_back(c.node("p" + std::to_string(i), (c.dir / "secret").string()));
  auto s = session::connect("127.0.0.1", c.port, c.secret, {200, 800});
  ASSERT_TRUE(s) << describe(s.error());
  for (int i = 0; i < 100; ++i) {
    auto st = (*s)->status();
    if (st && st->find("\"p1\"") != std::string::npos && st->find("\"p0\"") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE((*s)->deploy(model_path(), 2, driver_opts()));
  const auto ref = reference(20);
  auto cl = (*s)->client_session();
  std::vector<job> jobs;
  for (int i = 0; i < 20; ++i) jobs.push_back(std::move(*cl->submit(job_for(i))));
  ASSERT_TRUE(jobs.front().next());
  ::kill(c.nodes[0].pid, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // past the 800 ms timeout
  ::kill(c.nodes[0].pid, SIGCONT);
  int resumed = 0;
  double recovery = 0;
  for (int i = 0; i < 20; ++i) {
    const auto r = jobs[static_cast<std::size_t>(i)].wait();
    resumed += r.resumes > 0;
    if (r.resumes > 0) recovery = std::max(recovery, r.longest_gap_s);
    EXPECT_EQ(r.finish_reason, "length") << "job " << i;
    EXPECT_EQ(r.tokens, ref[static_cast<std::size_t>(i)]) << "job " << i;
  }
  EXPECT_GT(resumed, 0) << "the paused node held jobs in flight";
  std::printf("pause: jobs resumed: %d of 20; longest wait between two tokens of a resumed job: %.3f s (heartbeat 200 ms, "
              "timeout 800 ms, paused 2.5 s)\n", resumed, recovery);
  // The paused node comes back and joins again.
  bool back = false;
  for (int i = 0; i < 100 && !back; ++i) {
    auto st = (*s)->status();
    back = st && std::count(st->begin(), st->end(), 'p') >= 2 && st->find("\"p0\"") != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(back);
}

TEST(multiprocess, a_node_with_the_wrong_secret_is_refused) {
  cluster_fixture c;
  std::ofstream(c.dir / "wrong") << "not-the-cluster-secret-at-all\n";
  auto evil = c.node("evil", (c.dir / "wrong").string());
  EXPECT_EQ(evil.wait_exit(), 3);
  auto s = session::connect("127.0.0.1", c.port, c.secret, {200, 800});
  ASSERT_TRUE(s);
  auto st = (*s)->status();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->find("evil"), std::string::npos);
  EXPECT_FALSE(session::connect("127.0.0.1", c.port, "not-the-cluster-secret-at-all", {200, 800}));
  std::ifstream log(c.dir / "coordinator.log");
  std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(text.find("event=join_refused role=node id=evil reason=bad_proof"), std::string::npos) << text;
}

TEST(multiprocess, scaling_one_to_three_to_one_under_load_fails_no_job) {
  cluster_fixture c;
  for (int i = 0; i < 3; ++i) c.nodes.push_back(c.node("s" + std::to_string(i), (c.dir / "secret").string()));
  auto s = session::connect("127.0.0.1", c.port, c.secret, {200, 800});
  ASSERT_TRUE(s) << describe(s.error());
  for (int i = 0; i < 100; ++i) {
    auto st = (*s)->status();
    if (st && st->find("\"s0\"") != std::string::npos && st->find("\"s1\"") != std::string::npos && st->find("\"s2\"") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto name = (*s)->deploy(model_path(), 1, driver_opts());
  ASSERT_TRUE(name) << describe(name.error());
  const auto ref = reference(60);
  auto cl = (*s)->client_session();
  std::vector<job> jobs;
  auto submit = [&](int from, int to) {
    for (int i = from; i < to; ++i) {
      auto jb = cl->submit(job_for(i));
      ASSERT_TRUE(jb) << jb.error().message;
      jobs.push_back(std::move(*jb));
    }
  };
  submit(0, 20);
  auto up = (*s)->scale(*name, 3);
  ASSERT_TRUE(up) << describe(up.error());
  submit(20, 40);
  auto st3 = (*s)->status();
  ASSERT_TRUE(st3);
  EXPECT_EQ(nlohmann::json::parse(*st3)["replicas"].size(), 3u) << *st3;
  auto down = (*s)->scale(*name, 1);
  ASSERT_TRUE(down) << describe(down.error());
  submit(40, 60);
  for (int i = 0; i < 60; ++i) {
    const auto r = jobs[static_cast<std::size_t>(i)].wait();
    EXPECT_FALSE(r.error) << "job " << i << ": " << (r.error ? r.error->message : "");
    EXPECT_EQ(r.tokens, ref[static_cast<std::size_t>(i)]) << "job " << i;
  }
  // The drained replicas stop once their last job ends.
  std::size_t replicas = 0;
  for (int i = 0; i < 100; ++i) {
    replicas = nlohmann::json::parse(*(*s)->status())["replicas"].size();
    if (replicas == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(replicas, 1u);
}

std::string fmt_schedule(const std::vector<std::string>& s) {
  std::string out;
  for (const auto& f : s) out += (out.empty() ? "" : ", ") + f;
  return out;
}

// VmRSS of a process, in bytes.
std::uint64_t rss_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

int raw_connect(int port) { return test::loopback_connect(port); }

// A BASP header as CAF 0.17 writes it (operation, padding, flags, payload length big-endian, 24 bytes
// of operation data and actor ids) followed by `payload`.
std::string basp(std::uint8_t op, std::uint32_t claimed, std::uint64_t dest_actor, const std::string& payload) {
  std::string h(32, '\0');
  h[0] = static_cast<char>(op);
  for (int i = 0; i < 4; ++i) h[4 + i] = static_cast<char>(claimed >> (24 - 8 * i));
  for (int i = 0; i < 8; ++i) h[24 + i] = static_cast<char>(dest_actor >> (56 - 8 * i));
  return h + payload;
}

TEST(multiprocess, tls_links_carry_jobs_and_refuse_plain_peers) {
  cluster_fixture plain;  // only for its directory and secret; its plain coordinator is not used
  const auto d = plain.dir;
  auto certs = [&](const std::string& args) { return std::system((std::string(TROUPE_BIN) + " certs " + args + " >/dev/null").c_str()); };
  ASSERT_EQ(certs("init --dir '" + (d / "ca").string() + "'"), 0);
  for (const char* n : {"coord", "node", "client"}) ASSERT_EQ(certs("issue --dir '" + (d / "ca").string() + "' --name " + n), 0);
  ASSERT_EQ(certs("init --dir '" + (d / "other").string() + "'"), 0);
  ASSERT_EQ(certs("issue --dir '" + (d / "other").string() + "' --name client"), 0);
  auto tls_args = [&](const std::string& who) {
    return std::vector<std::string>{"--tls-cert", (d / "ca" / (who + ".pem")).string(), "--tls-key", (d / "ca" / (who + ".key")).string(), "--tls-ca",
                                    (d / "ca" / "ca.pem").string()};
  };
  std::vector<std::string> cargs{TROUPE_BIN, "coordinator", "--listen", "127.0.0.1:0", "--secret-file", (d / "secret").string(), "--port-file",
                                 (d / "tls-port").string()};
  for (auto& a : tls_args("coord")) cargs.push_back(a);
  process coordinator = spawn(cargs, d / "tls-coordinator.log");
  int port = 0;
  for (int i = 0; i < 600 && port == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream(d / "tls-port") >> port;
  }
  ASSERT_GT(port, 0);
  std::vector<std::string> nargs{TROUPE_BIN, "node", "--join", "127.0.0.1:" + std::to_string(port), "--secret-file", (d / "secret").string(),
                                 "--node-id", "t0"};
  for (auto& a : tls_args("node")) nargs.push_back(a);
  process node = spawn(nargs, d / "tls-node.log");
  const tls_options tls{(d / "ca" / "client.pem").string(), (d / "ca" / "client.key").string(), (d / "ca" / "ca.pem").string()};
  auto s = session::connect("127.0.0.1", port, plain.secret, {200, 800}, tls);
  ASSERT_TRUE(s) << describe(s.error());
  for (int i = 0; i < 100; ++i) {
    auto st = (*s)->status();
    if (st && st->find("\"t0\"") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE((*s)->deploy(model_path(), 1, driver_opts()));
  auto cl = (*s)->client_session();
  const auto ref = reference(3);
  for (int i = 0; i < 3; ++i) {
    auto r = cl->submit(job_for(i))->wait();
    EXPECT_EQ(r.tokens, ref[static_cast<std::size_t>(i)]) << "job " << i;
  }
  // Short sessions come and go (each `troupe status`): the node's link and its replica stay (CAF's own
  // TLS module dropped the other links when one closed).
  for (int i = 0; i < 8; ++i) {
    auto brief = session::connect("127.0.0.1", port, plain.secret, {200, 800}, tls);
    ASSERT_TRUE(brief) << describe(brief.error());
    EXPECT_TRUE((*brief)->status());
  }
  // A peer without a certificate of the cluster's CA reaches nothing: not with plain CAF (a forged
  // client handshake and a job for the coordinator's actor number), not with another CA's certificate,
  // not with a header claiming 4 GiB, not with 500 silent connections; the coordinator's memory stays.
  const auto rss_before = rss_of(coordinator.pid);
  EXPECT_FALSE(session::connect("127.0.0.1", port, plain.secret, {200, 800}));
  const tls_options stranger{(d / "other" / "client.pem").string(), (d / "other" / "client.key").string(), (d / "other" / "ca.pem").string()};
  EXPECT_FALSE(session::connect("127.0.0.1", port, plain.secret, {200, 800}, stranger));
  for (std::uint64_t actor : {1u, 7u, 9u}) {
    const int fd = raw_connect(port);
    ASSERT_GE(fd, 0);
    const auto forged = basp(1, 0, 0, "") + basp(2, 4, actor, "job!") + basp(2, 0xfffffff0u, actor, "");
    ::send(fd, forged.data(), forged.size(), MSG_NOSIGNAL);
    ::close(fd);
  }
  std::vector<int> silent;
  for (int i = 0; i < 500; ++i) silent.push_back(raw_connect(port));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto again = cl->submit(job_for(0))->wait();
  EXPECT_EQ(again.tokens, ref[0]) << "the coordinator stopped serving its node under the flood";
  for (int fd : silent) ::close(fd);
  const auto rss_after = rss_of(coordinator.pid);
  EXPECT_LT(rss_after, rss_before + (50u << 20)) << rss_before << " -> " << rss_after;
  std::ifstream log(d / "tls-coordinator.log");
  const std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(text.find("event=link_refused"), std::string::npos) << "refusals are logged";
  auto st = (*s)->cluster_status();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->replicas.size(), 1u);
  EXPECT_EQ(st->nodes.size(), 1u);
}

TEST(multiprocess, sigterm_drains_a_node_before_it_leaves) {
  cluster_fixture c;
  for (int i = 0; i < 2; ++i) c.nodes.push_back(c.node("d" + std::to_string(i), (c.dir / "secret").string()));
  auto s = session::connect("127.0.0.1", c.port, c.secret, {200, 800});
  ASSERT_TRUE(s) << describe(s.error());
  for (int i = 0; i < 100; ++i) {
    auto st = (*s)->status();
    if (st && st->find("\"d0\"") != std::string::npos && st->find("\"d1\"") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE((*s)->deploy(model_path(), 2, driver_opts()));
  const auto ref = reference(20);
  auto cl = (*s)->client_session();
  std::vector<job> jobs;
  for (int i = 0; i < 10; ++i) jobs.push_back(std::move(*cl->submit(job_for(i))));
  ASSERT_TRUE(jobs.front().next());
  ::kill(c.nodes[0].pid, SIGTERM);
  for (int i = 10; i < 20; ++i) jobs.push_back(std::move(*cl->submit(job_for(i))));
  for (int i = 0; i < 20; ++i) {
    const auto r = jobs[static_cast<std::size_t>(i)].wait();
    EXPECT_EQ(r.tokens, ref[static_cast<std::size_t>(i)]) << "job " << i;
    EXPECT_EQ(r.resumes, 0) << "job " << i << " had to move: the node left before finishing it";
  }
  EXPECT_EQ(c.nodes[0].wait_exit(), 0);
  std::ifstream log(c.dir / "d0.log");
  std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(text.find("node=d0 event=drained"), std::string::npos) << text;
}

TEST(multiprocess, a_device_hosts_as_many_executors_as_its_node_allows) {
  cluster_fixture c;
  auto node = spawn({TROUPE_BIN, "node", "--join", "127.0.0.1:" + std::to_string(c.port), "--insecure", "--secret-file", (c.dir / "secret").string(), "--node-id",
                     "m0", "--max-replicas", "2", "--heartbeat-ms", "200", "--timeout-ms", "800"},
                    c.dir / "m0.log");
  auto s = session::connect("127.0.0.1", c.port, c.secret, {200, 800});
  ASSERT_TRUE(s) << describe(s.error());
  for (int i = 0; i < 100; ++i) {
    auto st = (*s)->status();
    if (st && st->find("\"m0\"") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the node's bound follows its join
  // Two small replicas share the one device; a third does not fit.
  auto two = (*s)->deploy(model_path(), 2, driver_opts());
  ASSERT_TRUE(two) << describe(two.error());
  EXPECT_EQ(nlohmann::json::parse(*(*s)->status())["replicas"].size(), 2u);
  auto three = (*s)->scale(*two, 3);
  ASSERT_FALSE(three);
  EXPECT_EQ(three.error().code, transport::error_code::no_room);
  EXPECT_NE(three.error().message.find("max-replicas"), std::string::npos) << describe(three.error());
  auto cl = (*s)->client_session();
  EXPECT_EQ(cl->submit(job_for(1))->wait().tokens, reference(2)[1]);
}

// Six jobs, greedy and sampled, submitted at once through `s`, each with one device's tokens.
void expect_one_devices_tokens(session& s) {
  const auto ref = reference(6);
  auto cl = s.client_session();
  std::vector<actors::job> jobs;
  for (int i = 0; i < 6; ++i) {
    auto jb = cl->submit(job_for(i));
    ASSERT_TRUE(jb) << jb.error().message;
    jobs.push_back(std::move(*jb));
  }
  for (int i = 0; i < 6; ++i) EXPECT_EQ(jobs[static_cast<std::size_t>(i)].wait().tokens, ref[static_cast<std::size_t>(i)]) << "job " << i;
}

// A split replica on a node process: deploy with tensor_parallel 2 makes each replica two executors
// over the model's two shards, tensor_parallel 2 x pipeline_parallel 2 four, over two stages of two
// shards (docs/tensor-parallel.md); its jobs, greedy and sampled, give one device's tokens. A split the
// model cannot make is refused by the node, by name.
void serve_split_replica(int tp, int pp, const std::string& refused_tp_pp, const std::string& why) {
  cluster_fixture c;
  const std::string id = "split" + std::to_string(tp) + "x" + std::to_string(pp);
  auto node = spawn({TROUPE_BIN, "node", "--join", "127.0.0.1:" + std::to_string(c.port), "--insecure", "--secret-file", (c.dir / "secret").string(), "--node-id",
                     id, "--heartbeat-ms", "200", "--timeout-ms", "800"},
                    c.dir / (id + ".log"));
  auto s = session::connect("127.0.0.1", c.port, c.secret, {200, 800});
  ASSERT_TRUE(s) << describe(s.error());
  for (int i = 0; i < 100; ++i) {
    auto st = (*s)->status();
    if (st && st->find("\"" + id + "\"") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const auto bad_tp = std::stoi(refused_tp_pp.substr(0, refused_tp_pp.find('x')));
  const auto bad_pp = std::stoi(refused_tp_pp.substr(refused_tp_pp.find('x') + 1));
  auto bad = (*s)->deploy(model_path(), 1, driver_opts(), bad_tp, bad_pp);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find(why), std::string::npos) << describe(bad.error());
  auto name = (*s)->deploy(model_path(), 1, driver_opts(), tp, pp);
  ASSERT_TRUE(name) << describe(name.error());
  expect_one_devices_tokens(**s);
}

TEST(multiprocess, a_tensor_parallel_replica_on_a_node_serves_like_one_device) { serve_split_replica(2, 1, "3x1", "split 3 ways"); }

TEST(multiprocess, a_tensor_and_pipeline_parallel_replica_on_a_node_serves_like_one_device) {
  serve_split_replica(2, 2, "1x5", "4 layers do not make 5 stages");
}

// Two node processes joined to `c`'s coordinator, and a session that has seen both.
result<std::unique_ptr<session>, join_error> two_nodes(cluster_fixture& c, const std::string& a, const std::string& b) {
  c.nodes.push_back(c.node(a, (c.dir / "secret").string()));
  c.nodes.push_back(c.node(b, (c.dir / "secret").string()));
  auto s = session::connect("127.0.0.1", c.port, c.secret, {200, 800});
  if (!s) return s;
  for (int i = 0; i < 100; ++i) {
    auto st = (*s)->status();
    if (st && st->find("\"" + a + "\"") != std::string::npos && st->find("\"" + b + "\"") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return s;
}

// A replica whose two pipeline stages are on two node processes (deploy across_nodes): stage 0 is a rank
// actor on one node, stage 1 and the driver on the other; the stages pass activations over Gloo (meeting
// through the coordinator's rendezvous) and the driver reaches stage 0 over CAF for every step. Six jobs,
// greedy and sampled, give one device's tokens. Three stages with two nodes, and a split the heads do not
// allow, are refused by name.
TEST(multiprocess, a_pipeline_across_two_nodes_serves_like_one_device) {
  cluster_fixture c;
  auto s = two_nodes(c, "pa", "pb");
  ASSERT_TRUE(s) << describe(s.error());
  auto three = (*s)->deploy(model_path(), 1, driver_opts(), 1, 3, true);
  ASSERT_FALSE(three);
  EXPECT_EQ(three.error().code, transport::error_code::no_room);
  EXPECT_NE(three.error().message.find("needs 3 nodes"), std::string::npos) << describe(three.error());
  auto bad = (*s)->deploy(model_path(), 1, driver_opts(), 3, 2, true);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("split 3 ways"), std::string::npos) << describe(bad.error());
  auto name = (*s)->deploy(model_path(), 1, driver_opts(), 1, 2, true);
  ASSERT_TRUE(name) << describe(name.error());
  expect_one_devices_tokens(**s);
}

// Two stages of two tensor-parallel ranks each across two node processes: each node's stage is two
// executors joined by an in-process group, rank t of one stage reaches rank t of the other over its own
// Gloo pipe, and the driver on the last stage drives all four. Six jobs give one device's tokens.
TEST(multiprocess, a_two_by_two_replica_across_two_nodes_serves_like_one_device) {
  cluster_fixture c;
  auto s = two_nodes(c, "qa", "qb");
  ASSERT_TRUE(s) << describe(s.error());
  auto name = (*s)->deploy(model_path(), 1, driver_opts(), 2, 2, true);
  ASSERT_TRUE(name) << describe(name.error());
  expect_one_devices_tokens(**s);
}

// Collective groups whose ranks meet through the coordinator's rendezvous store (no shared directory,
// as across machines): three `troupe collectives` processes join one Gloo group and check all_reduce,
// all_gather and a send/recv ring for exact values. The store keeps each key once, and refuses keys and
// values past its bounds, by name.
TEST(multiprocess, collective_groups_meet_through_the_coordinators_rendezvous) {
  cluster_fixture c;
  std::vector<process> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.push_back(spawn({TROUPE_BIN, "collectives", "--coordinator", "127.0.0.1:" + std::to_string(c.port), "--insecure", "--secret-file", (c.dir / "secret").string(),
                           "--group", "g3", "--rank", std::to_string(r), "--size", "3", "--floats", "4099", "--rounds", "2"},
                          c.dir / ("rank" + std::to_string(r) + ".log")));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(ranks[static_cast<std::size_t>(r)].wait_exit(), 0) << "rank " << r;
    std::ifstream f(c.dir / ("rank" + std::to_string(r) + ".log"));
    const std::string out((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_NE(out.find("all checks exact"), std::string::npos) << out;
    EXPECT_NE(out.find("send/recv ring exact"), std::string::npos) << out;
  }
  auto s = session::connect("127.0.0.1", c.port, c.secret, {200, 800});
  ASSERT_TRUE(s) << describe(s.error());
  auto store = (*s)->rendezvous_store();
  ASSERT_TRUE(store->set("k", "v"));
  auto again = store->set("k", "w");
  ASSERT_FALSE(again);
  EXPECT_NE(again.error().find("set already"), std::string::npos) << again.error();
  auto got = store->get("k");
  ASSERT_TRUE(got && *got);
  EXPECT_EQ(**got, "v");
  auto none = store->get("never");
  ASSERT_TRUE(none);
  EXPECT_FALSE(*none);
  auto big = store->set("big", std::string((1 << 20) + 1, 'x'));
  ASSERT_FALSE(big);
  EXPECT_NE(big.error().find("at most"), std::string::npos) << big.error();
  EXPECT_FALSE(store->set(std::string(513, 'k'), "v"));
  EXPECT_FALSE(store->set("", "v"));
}

TEST(multiprocess, a_simulated_device_of_declared_memory_takes_what_fits) {
  cluster_fixture c;
  // About 16 MB per replica of the test model (weights and KV pool): 24 MiB holds one, not two.
  auto node = spawn({TROUPE_BIN, "node", "--join", "127.0.0.1:" + std::to_string(c.port), "--insecure", "--secret-file", (c.dir / "secret").string(), "--node-id",
                     "mem0", "--device-memory", "24MiB", "--heartbeat-ms", "200", "--timeout-ms", "800"},
                    c.dir / "mem0.log");
  auto s = session::connect("127.0.0.1", c.port, c.secret, {200, 800});
  ASSERT_TRUE(s) << describe(s.error());
  for (int i = 0; i < 100; ++i) {
    auto st = (*s)->status();
    if (st && st->find("\"mem0\"") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto one = (*s)->deploy(model_path(), 1, driver_opts());
  ASSERT_TRUE(one) << describe(one.error());
  auto two = (*s)->scale(*one, 2);
  ASSERT_FALSE(two);
  EXPECT_EQ(two.error().code, transport::error_code::no_room);
  EXPECT_NE(two.error().message.find("device memory"), std::string::npos) << describe(two.error());
  EXPECT_EQ(nlohmann::json::parse(*(*s)->status())["replicas"].size(), 1u);
}

TEST(multiprocess, a_gateway_in_front_of_a_remote_cluster_serves) {
  cluster_fixture c;
  c.nodes.push_back(c.node("g0", (c.dir / "secret").string()));
  auto s = session::connect("127.0.0.1", c.port, c.secret, {200, 800});
  ASSERT_TRUE(s) << describe(s.error());
  for (int i = 0; i < 100; ++i) {
    auto st = (*s)->status();
    if (st && st->find("\"g0\"") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE((*s)->deploy(model_path(), 1, driver_opts()));
  // A second session, as `troupe gateway` on another machine would open.
  auto gs = session::connect("127.0.0.1", c.port, c.secret, {200, 800});
  ASSERT_TRUE(gs);
  gateway_options g;
  g.port = 0;
  auto gw = gateway::start(**gs, model_path(), g);
  ASSERT_TRUE(gw) << gw.error();
  httplib::Client http("127.0.0.1", (*gw)->port());
  const std::string name = model_path().stem().string();  // the served name: the checkpoint's stem
  auto r = http.Post("/v1/completions", "{\"model\":\"" + name + "\",\"prompt\":[5,6,7],\"max_tokens\":4,\"temperature\":0}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_NE(r->body.find("\"completion_tokens\":4"), std::string::npos) << r->body;
  auto m = http.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("troupe_kv_blocks_total{node=\"node-0\",replica=\"0\"}"), std::string::npos);
}

}  // namespace
}  // namespace troupe::actors

namespace troupe::actors {
namespace {

// What one replica of the test model commits on one device with `tokens` of KV (the coordinator's
// memory model: placement::whole_replica_bytes over the model's requirements).
std::uint64_t replica_bytes(std::int64_t tokens) {
  auto h = test::served_model(model_path());  // the planner sizes KV at the deployment's (default) type
  EXPECT_TRUE(h);
  auto req = requirements_of(*h);
  EXPECT_TRUE(req) << req.error();
  return placement::whole_replica_bytes(*req, tokens);
}

process node_with_memory(cluster_fixture& c, const std::string& id, std::uint64_t bytes) {
  return spawn({TROUPE_BIN, "node", "--join", "127.0.0.1:" + std::to_string(c.port), "--insecure", "--secret-file", (c.dir / "secret").string(), "--node-id", id,
                "--device-memory", std::to_string(bytes), "--heartbeat-ms", "200", "--timeout-ms", "800"},
               c.dir / (id + ".log"));
}

// A model no node's declared device memory holds, deployed with no split flag: the coordinator's
// planner splits it into two pipeline stages on the two nodes, and its jobs give one device's tokens.
TEST(multiprocess, a_model_larger_than_any_node_is_split_across_nodes_by_the_coordinator) {
  cluster_fixture c;
  const auto whole = replica_bytes(driver_opts().capacity);
  const auto each = whole * 3 / 4;  // a stage (half the layers) fits, the whole replica does not
  c.nodes.push_back(node_with_memory(c, "big-a", each));
  c.nodes.push_back(node_with_memory(c, "big-b", each));
  auto s = session::connect("127.0.0.1", c.port, c.secret, {200, 800});
  ASSERT_TRUE(s) << describe(s.error());
  for (int i = 0; i < 100; ++i) {
    auto st = (*s)->cluster_status();
    if (st && st->nodes.size() == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto name = (*s)->deploy(model_path(), 1, driver_opts());
  ASSERT_TRUE(name) << describe(name.error());
  auto st = (*s)->cluster_status();
  ASSERT_TRUE(st) << describe(st.error());
  ASSERT_EQ(st->replicas.size(), 1u);
  const auto& r = st->replicas.front();
  EXPECT_EQ(r.pipeline_parallel, 2);
  EXPECT_EQ(r.nodes.size(), 2u);
  EXPECT_NE(r.nodes[0], r.nodes[1]);
  EXPECT_EQ(r.state, transport::replica_state::serving);
  for (const auto& n : st->nodes) EXPECT_LE(n.committed_bytes, each) << n.id;
  expect_one_devices_tokens(**s);
  // A second replica has no room left: refused by name, the first keeps serving.
  auto two = (*s)->scale(*name, 2);
  ASSERT_FALSE(two);
  EXPECT_EQ(two.error().code, transport::error_code::no_room) << describe(two.error());
  EXPECT_EQ((*s)->cluster_status()->replicas.size(), 1u);
}

// A replica that cannot prepare (a capacity past the model's positions) fails its deploy naming the node
// and the reason; the node stays joined, and the replicas it already served keep serving.
TEST(multiprocess, a_replica_that_fails_to_prepare_takes_nothing_with_it) {
  cluster_fixture c;
  auto s = two_nodes(c, "fa", "fb");
  ASSERT_TRUE(s) << describe(s.error());
  auto name = (*s)->deploy(model_path(), 2, driver_opts());
  ASSERT_TRUE(name) << describe(name.error());
  deploy_request bad;
  bad.model = model_path();
  bad.name = "too-long";
  bad.replicas = 2;
  bad.options = driver_opts();
  bad.options.capacity = 1 << 20;
  auto refused = (*s)->deploy(bad);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, transport::error_code::prepare_failed) << describe(refused.error());
  EXPECT_NE(refused.error().message.find("node 'f"), std::string::npos) << describe(refused.error());
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // past a heartbeat timeout
  auto st = (*s)->cluster_status();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->nodes.size(), 2u);
  EXPECT_EQ(st->replicas.size(), 2u);
  for (const auto& r : st->replicas) EXPECT_EQ(r.model, *name);
  EXPECT_EQ(st->deployments.size(), 1u);
  expect_one_devices_tokens(**s);
  // The same deployment again is idempotent; a second node with a taken id is refused by name.
  ASSERT_TRUE((*s)->deploy(model_path(), 2, driver_opts()));
  EXPECT_EQ((*s)->cluster_status()->replicas.size(), 2u);
  auto twin = spawn({TROUPE_BIN, "node", "--join", "127.0.0.1:" + std::to_string(c.port), "--insecure", "--secret-file", (c.dir / "secret").string(), "--node-id",
                     "fa", "--heartbeat-ms", "200", "--timeout-ms", "800"},
                    c.dir / "twin.log");
  EXPECT_EQ(twin.wait_exit(), 3);
  std::ifstream log(c.dir / "twin.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("is taken"), std::string::npos) << text;
}

}  // namespace
}  // namespace troupe::actors

namespace troupe::actors {
namespace {

// kill -9 of the coordinator under running jobs: every job ends within 10 s with a retryable error
// (none hangs), a new submission is refused at once, and a gateway in front says 503 on /health and
// /ready at once and 503 with Retry-After on completions.
TEST(multiprocess, a_dead_coordinator_fails_its_clients_fast_and_retryably) {
  cluster_fixture c;
  auto s = two_nodes(c, "oa", "ob");
  ASSERT_TRUE(s) << describe(s.error());
  ASSERT_TRUE((*s)->deploy(model_path(), 2, driver_opts()));
  gateway_options g;
  g.port = 0;
  auto gw = gateway::start(**s, model_path(), g);
  ASSERT_TRUE(gw) << gw.error();
  httplib::Client http("127.0.0.1", (*gw)->port());
  http.set_read_timeout(15, 0);
  ASSERT_EQ(http.Get("/health")->status, 200);
  auto cl = (*s)->client_session();
  std::vector<job> jobs;
  for (int i = 0; i < 6; ++i) {
    auto j = job_for(i);
    j.max_tokens = 100;  // still running when the coordinator goes (killed right after the submissions)
    j.ignore_eos = true;
    auto jb = cl->submit(j);
    ASSERT_TRUE(jb) << jb.error().message;
    jobs.push_back(std::move(*jb));
  }
  ::kill(c.coordinator.pid, SIGKILL);
  ::waitpid(c.coordinator.pid, nullptr, 0);
  c.coordinator.pid = -1;
  const auto t0 = std::chrono::steady_clock::now();
  int failed = 0;
  for (auto& jb : jobs) {
    const auto r = jb.wait();
    if (!r.error) {
      EXPECT_EQ(r.finish_reason, "length");  // finished before the loss was noticed
      continue;
    }
    ++failed;
    EXPECT_EQ(r.error->code, transport::error_code::disconnected) << r.error->message;
    EXPECT_NE(r.error->retry, transport::retry::failed);
  }
  EXPECT_GT(failed, 0);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  auto again = cl->submit(job_for(1));
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, transport::error_code::disconnected);
  int health = 0;  // the session's watcher hears of the loss with the clients, give or take a scheduling
  for (int i = 0; i < 20 && (health = http.Get("/health")->status) != 503; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(health, 503);
  EXPECT_EQ(http.Get("/ready")->status, 503);
  auto r = http.Post("/v1/completions", "{\"prompt\":[5,6,7],\"max_tokens\":4}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->status == 503) << r->status << " " << r->body;
  EXPECT_TRUE(r->has_header("Retry-After"));
}

}  // namespace
}  // namespace troupe::actors

namespace troupe::actors {
namespace {

// A coordinator with --state-dir killed with SIGKILL and started again on its port: the nodes rejoin,
// the journal gives it back its deployments (name, desired count, load), and it places their replicas
// again; jobs then give one device's tokens under the same name.
std::string file_text(const fs::path& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// kill -9 of the coordinator under 12 jobs: each job completes with its fault-free tokens or fails at
// once with a retryable error (and succeeds when submitted again); the restarted coordinator reads its
// journal and takes back the replicas the nodes still run, without a reload.
TEST(multiprocess, a_restarted_coordinator_serves_the_deployments_it_had) {
  cluster_fixture c;
  // The fixture's coordinator keeps no state: replace it by one that does, on the same port.
  c.coordinator.stop();
  auto coordinator = [&] { return c.stateful_coordinator("coordinator2.log"); };
  c.coordinator = coordinator();
  // Up when it says it listens (a fixed wait was too short on a loaded machine).
  for (int i = 0; i < 200 && file_text(c.dir / "coordinator2.log").find("event=listening") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto s = two_nodes(c, "ra", "rb");
  ASSERT_TRUE(s) << describe(s.error());
  auto name = (*s)->deploy(model_path(), 2, driver_opts());
  ASSERT_TRUE(name) << describe(name.error());
  const auto ref = reference(12);
  // A session that stays open across the restart (as a gateway's does): it reconnects by itself.
  auto stays = session::connect("127.0.0.1", c.port, c.secret, {200, 800});
  ASSERT_TRUE(stays);
  auto stays_client = (*stays)->client_session();
  auto cl0 = (*s)->client_session();
  std::vector<job> running;
  for (int i = 0; i < 12; ++i) {
    auto j = job_for(i);
    j.model = *name;
    running.push_back(std::move(*cl0->submit(j)));
  }
  ::kill(c.coordinator.pid, SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  std::vector<int> again_needed;
  for (int i = 0; i < 12; ++i) {
    const auto r = running[static_cast<std::size_t>(i)].wait();
    if (r.error) {
      EXPECT_TRUE(r.error->retry == transport::retry::disconnected || r.error->retry == transport::retry::overloaded)
          << "job " << i << ": " << r.error->message;
      again_needed.push_back(i);
    } else {
      EXPECT_EQ(r.tokens, ref[static_cast<std::size_t>(i)]) << "job " << i;
    }
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count(), 10.0);
  running.clear();
  cl0.reset();
  s->reset();
  ::waitpid(c.coordinator.pid, nullptr, 0);
  c.coordinator.pid = -1;
  c.coordinator = coordinator();
  std::unique_ptr<session> again;
  for (int i = 0; i < 100 && !again; ++i) {
    auto t = session::connect("127.0.0.1", c.port, c.secret, {200, 800});
    if (t) again = std::move(*t);
    else std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(again);
  int serving = 0;
  for (int i = 0; i < 300 && serving < 2; ++i) {
    serving = 0;
    if (auto st = again->cluster_status())
      for (const auto& r : st->replicas) serving += r.model == *name && r.state == transport::replica_state::serving;
    if (serving < 2) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(serving, 2);
  auto cl = again->client_session();
  again_needed.push_back(3);
  for (int i : again_needed) {
    auto j = job_for(i);
    j.model = *name;
    auto jb = cl->submit(j);
    ASSERT_TRUE(jb) << jb.error().message;
    const auto r = jb->wait();
    EXPECT_FALSE(r.error) << "job " << i << ": " << (r.error ? r.error->message : "");
    EXPECT_EQ(r.tokens, ref[static_cast<std::size_t>(i)]) << "job " << i;
  }
  for (int i = 0; i < 100 && !(*stays)->healthy(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE((*stays)->healthy()) << "the session that stayed did not reconnect";
  {
    auto j = job_for(5);
    j.model = *name;
    auto jb = stays_client->submit(j);
    ASSERT_TRUE(jb) << jb.error().message;
    EXPECT_EQ(jb->wait().tokens, ref[5]) << "through the client opened before the restart";
  }
  // Taken back, not reloaded: each node spawned its replica once; the new coordinator adopted both.
  for (const char* n : {"ra", "rb"}) EXPECT_EQ(count_of(file_text(c.dir / (std::string(n) + ".log")), "event=replica_spawned"), 1u) << n;
  EXPECT_EQ(count_of(file_text(c.dir / "coordinator2.log"), "event=replica_adopting"), 2u) << file_text(c.dir / "coordinator2.log");
}

}  // namespace
}  // namespace troupe::actors

namespace troupe::actors {
namespace {

// A chaos run: a seeded schedule of faults (kill -9 of a node, a node paused past the heartbeat
// timeout, a node restarted, kill -9 of the coordinator and its restart from the journal) while rounds
// of jobs run. Every job ends with its fault-free tokens (each token once: a duplicate or a gap would
// differ), resubmitted when its error is retryable; afterwards no replica holds a sequence or a KV
// block. TROUPE_CHAOS_SEED picks another schedule.
TEST(multiprocess, a_seeded_fault_schedule_loses_no_job_and_leaves_nothing_behind) {
  cluster_fixture c;
  c.coordinator.stop();
  auto coordinator = [&] { return c.stateful_coordinator("coordinator-chaos.log"); };
  c.coordinator = coordinator();
  for (int i = 0; i < 200 && file_text(c.dir / "coordinator-chaos.log").find("event=listening") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::vector<std::string> ids{"c0", "c1", "c2"};
  for (const auto& id : ids) c.nodes.push_back(c.node(id, (c.dir / "secret").string()));
  std::unique_ptr<session> s;
  for (int i = 0; i < 100 && !s; ++i) {
    auto t = session::connect("127.0.0.1", c.port, c.secret, {200, 800});
    if (t) s = std::move(*t);
    else std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(s);
  for (int i = 0; i < 100; ++i) {
    auto st = s->cluster_status();
    if (st && st->nodes.size() == 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto name = s->deploy(model_path(), 2, driver_opts());
  ASSERT_TRUE(name) << describe(name.error());
  const char* seed_env = std::getenv("TROUPE_CHAOS_SEED");
  const unsigned seed = seed_env ? static_cast<unsigned>(std::strtoul(seed_env, nullptr, 10)) : 19u;
  std::mt19937 rng(seed);
  constexpr int rounds = 6, per_round = 8;
  const auto ref = reference(rounds * per_round);
  auto cl = s->client_session();
  // A submission refused with a retryable error (the coordinator away, no replica serving yet) is
  // asked again, for up to 20 s.
  auto submit = [&](int i) {
    auto j = job_for(i);
    j.model = *name;
    auto r = cl->submit(j);
    for (int attempt = 0; !r && r.error().retry != transport::retry::failed && attempt < 80; ++attempt) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      r = cl->submit(j);
    }
    return r;
  };
  std::vector<std::string> schedule;
  // Every kind of fault at least once, in a seeded order, the rest drawn.
  std::vector<int> kinds{0, 1, 2, 3};
  while (static_cast<int>(kinds.size()) < rounds) kinds.push_back(static_cast<int>(rng() % 4));
  std::shuffle(kinds.begin(), kinds.end(), rng);
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::pair<int, job>> running;
    for (int k = 0; k < per_round; ++k) {
      const int i = round * per_round + k;
      auto jb = submit(i);
      ASSERT_TRUE(jb) << jb.error().message;
      running.emplace_back(i, std::move(*jb));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 40));
    const int fault = kinds[static_cast<std::size_t>(round)];
    const std::size_t victim = rng() % ids.size();
    auto& node = c.nodes[victim];
    switch (fault) {
      case 0:  // kill -9 of a node, restarted after the round
        schedule.push_back("kill " + ids[victim]);
        ::kill(node.pid, SIGKILL);
        ::waitpid(node.pid, nullptr, 0);
        node.pid = -1;
        break;
      case 1:  // paused past the timeout, then resumed
        schedule.push_back("pause " + ids[victim]);
        ::kill(node.pid, SIGSTOP);
        std::this_thread::sleep_for(std::chrono::milliseconds(1200));
        ::kill(node.pid, SIGCONT);
        break;
      case 2:  // a graceful restart
        schedule.push_back("restart " + ids[victim]);
        node.stop();
        node = c.node(ids[victim], (c.dir / "secret").string());
        break;
      default:  // kill -9 of the coordinator, restarted on its port from the journal
        schedule.push_back("kill coordinator");
        ::kill(c.coordinator.pid, SIGKILL);
        ::waitpid(c.coordinator.pid, nullptr, 0);
        c.coordinator.pid = -1;
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        c.coordinator = coordinator();
        break;
    }
    for (auto& [i, jb] : running) {
      auto r = jb.wait();
      for (int attempt = 0; r.error && attempt < 60; ++attempt) {
        ASSERT_NE(r.error->retry, transport::retry::failed) << "job " << i << " failed for good: " << r.error->message << " (" << fmt_schedule(schedule) << ")";
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        auto again = submit(i);
        if (!again) continue;
        r = again->wait();
      }
      ASSERT_FALSE(r.error) << "job " << i << ": " << r.error->message << " (" << fmt_schedule(schedule) << ")";
      EXPECT_EQ(r.tokens, ref[static_cast<std::size_t>(i)]) << "job " << i << " (" << fmt_schedule(schedule) << ")";
    }
    if (fault == 0) node = c.node(ids[victim], (c.dir / "secret").string());
  }
  // Nothing left behind: every replica empties (its sequences released, its KV blocks free).
  std::int64_t left = -1;
  for (int i = 0; i < 100 && left != 0; ++i) {
    left = 0;
    const auto stats = s->replica_stats();
    if (stats.empty()) left = -1;
    for (const auto& st : stats) left += st.kv_blocks_used + st.running + st.queued;
    if (left != 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(left, 0) << "sequences or KV blocks left after " << fmt_schedule(schedule);
  std::printf("chaos seed %u: %s\n", seed, fmt_schedule(schedule).c_str());
}

}  // namespace
}  // namespace troupe::actors
