#include "apps/cluster_cmd.hpp"
#include "apps/plan.hpp"

#include "engine/exec/cuda/cuda_executor.hpp"
#include "transport/collectives.hpp"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <thread>
#include <fstream>
#include <optional>

#include "actors/gateway.hpp"
// toml++ reports parse errors as values (no exceptions); only this file includes it.
#define TOML_EXCEPTIONS 0
#include <toml++/toml.h>
#include "actors/model_needs.hpp"
#include "families/model.hpp"
#include "cluster/certs.hpp"
#include "cluster/link_guard.hpp"
#include "cluster/remote.hpp"
#include "actors/status_text.hpp"
#include "apps/default_model.hpp"

#include <csignal>

namespace troupe::app {
namespace {

struct endpoint {
  std::string host;
  int port = 0;
};

std::optional<endpoint> parse_address(const std::string& a) {
  const auto colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0) return std::nullopt;
  char* end = nullptr;
  const long p = std::strtol(a.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || p < 0 || p > 65535) return std::nullopt;
  return endpoint{a.substr(0, colon), static_cast<int>(p)};
}

struct prepared {
  endpoint at;
  std::string secret;
};

struct deployment_entry {
  std::string model;
  int replicas = 1;
  std::int64_t max_rows = 16, capacity = 0;
  std::string name;  // the served name; empty: the checkpoint's stem
  std::string kv_type = "f16";  // the KV cache's element type (docs/kv-cache.md)
};

// Reads a cluster file into the options the flags left unset; the deployments it lists.
result<std::vector<deployment_entry>, std::string> apply_cluster_file(cluster_cmd_options& o, bool is_node) {
  std::vector<deployment_entry> deployments;
  if (o.cluster_file.empty()) return deployments;
  toml::parse_result parsed = toml::parse_file(o.cluster_file);
  if (!parsed) {
    const auto& e = parsed.error();
    return unexpected(o.cluster_file + ":" + std::to_string(e.source().begin.line) + ": " + std::string(e.description()));
  }
  const toml::table& t = parsed.table();
  static const std::set<std::string> top{"cluster", "node", "deployment"};
  for (const auto& [k, v] : t)
    if (!top.contains(std::string(k.str()))) return unexpected(o.cluster_file + ": unknown section '" + std::string(k.str()) + "'");
  if (const auto* c = t["cluster"].as_table()) {
    static const std::set<std::string> keys{"coordinator", "secret_file", "heartbeat_ms", "timeout_ms", "tls_cert", "tls_key", "tls_ca", "insecure"};
    for (const auto& [k, v] : *c)
      if (!keys.contains(std::string(k.str()))) return unexpected(o.cluster_file + ": unknown key cluster." + std::string(k.str()));
    if (o.address.empty()) o.address = c->get("coordinator") ? (*c)["coordinator"].value_or(std::string()) : std::string();
    if (o.secret_file.empty()) o.secret_file = (*c)["secret_file"].value_or(std::string());
    o.heartbeat_ms = (*c)["heartbeat_ms"].value_or(o.heartbeat_ms);
    o.timeout_ms = (*c)["timeout_ms"].value_or(o.timeout_ms);
    if (o.tls_cert.empty()) o.tls_cert = (*c)["tls_cert"].value_or(std::string());
    if (o.tls_key.empty()) o.tls_key = (*c)["tls_key"].value_or(std::string());
    if (o.tls_ca.empty()) o.tls_ca = (*c)["tls_ca"].value_or(std::string());
    if (!o.insecure) o.insecure = (*c)["insecure"].value_or(false);
  }
  if (const auto* nodes = t["node"].as_array())
    for (const auto& n : *nodes) {
      const auto* nt = n.as_table();
      if (!nt) return unexpected(o.cluster_file + ": [[node]] entries are tables");
      for (const auto& [k, v] : *nt)
        if (k.str() != "id" && k.str() != "threads" && k.str() != "max_replicas")
          return unexpected(o.cluster_file + ": unknown key node." + std::string(k.str()));
      if (is_node && (*nt)["id"].value_or(std::string()) == o.node_id) {
        o.threads = (*nt)["threads"].value_or(o.threads);
        o.max_replicas = (*nt)["max_replicas"].value_or(o.max_replicas);
      }
    }
  if (const auto* deps = t["deployment"].as_array())
    for (const auto& d : *deps) {
      const auto* dt = d.as_table();
      if (!dt) return unexpected(o.cluster_file + ": [[deployment]] entries are tables");
      static const std::set<std::string> keys{"model", "replicas", "max_rows", "capacity", "name", "kv_type"};
      for (const auto& [k, v] : *dt)
        if (!keys.contains(std::string(k.str()))) return unexpected(o.cluster_file + ": unknown key deployment." + std::string(k.str()));
      deployment_entry e;
      e.model = (*dt)["model"].value_or(std::string());
      if (e.model.empty()) return unexpected(o.cluster_file + ": a [[deployment]] needs a model");
      e.replicas = (*dt)["replicas"].value_or(1);
      e.max_rows = (*dt)["max_rows"].value_or(std::int64_t{16});
      e.capacity = (*dt)["capacity"].value_or(std::int64_t{0});
      e.name = (*dt)["name"].value_or(std::string());
      e.kv_type = (*dt)["kv_type"].value_or(std::string("f16"));
      if (!families::kv_type_from_name(e.kv_type))
        return unexpected(o.cluster_file + ": deployment.kv_type is f32, f16, bf16 or q8_0, not '" + e.kv_type + "'");
      deployments.push_back(e);
    }
  return deployments;
}

std::optional<prepared> prepare(cluster_cmd_options& o, const char* cmd, const char* flag, std::vector<deployment_entry>* deployments = nullptr) {
  auto file = apply_cluster_file(o, std::string(cmd) == "node");
  if (!file) {
    std::fprintf(stderr, "troupe %s: %s\n", cmd, file.error().c_str());
    return std::nullopt;
  }
  if (deployments) *deployments = std::move(*file);
  if (o.address.empty() || o.secret_file.empty()) {
    std::fprintf(stderr, "troupe %s: %s and --secret-file are needed (or a --cluster-file naming them)\n", cmd, flag);
    return std::nullopt;
  }
  auto at = parse_address(o.address);
  if (!at) {
    std::fprintf(stderr, "troupe %s: %s takes HOST:PORT, got '%s'\n", cmd, flag, o.address.c_str());
    return std::nullopt;
  }
  auto secret = actors::read_secret(o.secret_file);
  if (!secret) {
    std::fprintf(stderr, "troupe %s: %s\n", cmd, secret.error().c_str());
    return std::nullopt;
  }
  const bool any_tls = !o.tls_cert.empty() || !o.tls_key.empty() || !o.tls_ca.empty();
  if (any_tls && (o.tls_cert.empty() || o.tls_key.empty() || o.tls_ca.empty())) {
    std::fprintf(stderr, "troupe %s: TLS needs --tls-cert, --tls-key and --tls-ca together\n", cmd);
    return std::nullopt;
  }
  for (const auto* f : {&o.tls_cert, &o.tls_key, &o.tls_ca})
    if (!f->empty() && !std::ifstream(*f)) {
      std::fprintf(stderr, "troupe %s: cannot read %s\n", cmd, f->c_str());
      return std::nullopt;
    }
  // Every link is mutual TLS unless the operator asks for plain links on loopback.
  if (!any_tls) {
    if (!o.insecure) {
      std::fprintf(stderr,
                   "troupe %s: the cluster's links need mutual TLS: give --tls-cert, --tls-key and --tls-ca (make them with "
                   "`troupe certs init` and `troupe certs issue --name N`), or --insecure for plain links on a loopback address\n",
                   cmd);
      return std::nullopt;
    }
    if (!cluster::is_loopback(at->host)) {
      std::fprintf(stderr, "troupe %s: --insecure is for loopback addresses only; %s needs mutual TLS (--tls-cert, --tls-key, --tls-ca)\n", cmd,
                   at->host.c_str());
      return std::nullopt;
    }
  }
  return prepared{*at, *secret};
}

actors::heartbeat_options heartbeat(const cluster_cmd_options& o) { return {o.heartbeat_ms, o.timeout_ms}; }
actors::tls_options tls(const cluster_cmd_options& o) { return {o.tls_cert, o.tls_key, o.tls_ca}; }

}  // namespace

int run_coordinator_cmd(const cluster_cmd_options& given) {
  auto o = given;
  auto p = prepare(o, "coordinator", "--listen");
  if (!p) return 2;
  actors::coordinator_process_options c;
  c.host = p->at.host;
  c.port = p->at.port;
  c.secret = p->secret;
  c.port_file = o.port_file;
  c.state_dir = o.state_dir;
  c.progress_timeout_ms = o.progress_timeout_ms;
  c.heartbeat = heartbeat(o);
  c.tls = tls(o);
  return actors::run_coordinator(c);
}

int run_node_cmd(const cluster_cmd_options& given) {
  auto o = given;
  auto p = prepare(o, "node", "--join");
  if (!p) return 2;
  actors::node_process_options n;
  if (o.devices.rfind("cuda:", 0) == 0) {
    // A GPU node: cuda:N or cuda:N,cuda:M,... (a tensor-parallel group over NCCL spans them); every
    // device must exist here (and this build must have the CUDA target).
    auto devs = exec::cuda::devices();
    std::set<int> seen;
    for (std::size_t at = 0; at <= o.devices.size();) {
      const auto comma = std::min(o.devices.find(',', at), o.devices.size());
      const std::string one = o.devices.substr(at, comma - at);
      at = comma + 1;
      char* end = nullptr;
      const long dev = one.rfind("cuda:", 0) == 0 ? std::strtol(one.c_str() + 5, &end, 10) : -1;
      if (dev < 0 || end == one.c_str() + 5 || *end != '\0' || !seen.insert(static_cast<int>(dev)).second) {
        std::fprintf(stderr, "troupe node: --devices takes cpu:0 or cuda:N[,cuda:M...] (got %s)\n", o.devices.c_str());
        return 2;
      }
      if (!devs || dev >= static_cast<long>(devs->size())) {
        std::fprintf(stderr, "troupe node: --devices %s: %s\n", one.c_str(),
                     !devs ? devs.error().c_str() : ("this machine has " + std::to_string(devs->size()) + " CUDA devices").c_str());
        return 2;
      }
      n.cuda_devices.push_back(static_cast<int>(dev));
      if (comma == o.devices.size()) break;
    }
  } else if (o.devices.rfind("cpu", 0) != 0) {
    std::fprintf(stderr, "troupe node: --devices takes cpu:0 or cuda:N[,cuda:M...] (got %s)\n", o.devices.c_str());
    return 2;
  }
  n.host = p->at.host;
  n.port = p->at.port;
  n.secret = p->secret;
  n.node_id = o.node_id;
  n.executor_threads = o.threads;
  n.max_replicas = o.max_replicas;
  if (!o.device_memory.empty()) {
    auto b = parse_bytes(o.device_memory);
    if (!b) {
      std::fprintf(stderr, "troupe node: --device-memory takes bytes or a size like 16GiB, got '%s'\n", o.device_memory.c_str());
      return 2;
    }
    n.device_memory = *b;
  }
  n.heartbeat = heartbeat(o);
  n.tls = tls(o);
  n.collective_host = o.collective_host;
  return actors::run_node(n);
}

namespace {

// Draws a deployment's preparation on stderr while it runs, from the coordinator's status (each
// replica reports its prepare steps: the weights, then every compiled entry). On a terminal the bar is
// redrawn in place; otherwise a line is written at each quarter.
class progress_bar {
 public:
  progress_bar(actors::session& s, std::string model, int replicas)
      : s_(s), model_(std::move(model)), replicas_(replicas), tty_(::isatty(2) != 0), t0_(std::chrono::steady_clock::now()),
        thread_([this] { run(); }) {}
  ~progress_bar() { finish(false); }

  void finish(bool ok) {
    if (!thread_.joinable()) return;
    stop_ = true;
    thread_.join();
    if (ok) draw(1.0, "ready");
    if (tty_) std::fputc('\n', stderr);
  }

 private:
  void run() {
    while (!stop_) {
      if (auto st = s_.cluster_status()) sample(*st);
      for (int i = 0; i < 10 && !stop_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  void sample(const transport::cluster_status& st) {
    std::int64_t done = 0, total = 0;
    int ready = 0;
    for (const auto& r : st.replicas) {
      if (r.model != model_) continue;
      if (r.state == transport::replica_state::serving) ++ready;
      if (r.state == transport::replica_state::preparing) {
        done += r.prepare_done;
        total = std::max(total, r.prepare_total);
      }
    }
    ready = std::min(ready - before_, replicas_);
    if (first_) {  // replicas of this model already serving before the deployment began
      before_ = ready, first_ = false;
      ready = 0;
    }
    if (total == 0 && ready == 0) return draw(0.0, "resolving");
    const double per = total > 0 ? static_cast<double>(total) : 1.0;
    const double f = (static_cast<double>(done) + ready * per) / (replicas_ * per);
    char what[96];
    std::snprintf(what, sizeof what, "%d/%d replicas ready", std::max(ready, 0), replicas_);
    draw(std::min(f, 1.0), what);
  }

  void draw(double f, const char* what) {
    const int width = 30, filled = static_cast<int>(f * width + 0.5);
    if (!tty_) {
      const int quarter = static_cast<int>(f * 4);
      if (quarter == last_quarter_) return;
      last_quarter_ = quarter;
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    std::fprintf(stderr, "%sloading %s [%s%s] %3.0f%% %s (%.1f s)%s", tty_ ? "\r" : "", model_.c_str(), std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), f * 100, what, secs, tty_ ? "\x1b[K" : "\n");
    std::fflush(stderr);
  }

  actors::session& s_;
  std::string model_;
  int replicas_;
  bool tty_;
  std::chrono::steady_clock::time_point t0_;
  std::atomic<bool> stop_{false};
  bool first_ = true;
  int before_ = 0, last_quarter_ = -1;
  std::thread thread_;
};

}  // namespace

int run_deploy_cmd(const cluster_cmd_options& given) {
  auto o = given;
  std::vector<deployment_entry> file_deployments;
  auto p = prepare(o, "deploy", "--coordinator", &file_deployments);
  if (!p) return 2;
  auto s = actors::session::connect(p->at.host, p->at.port, p->secret, heartbeat(o), tls(o));
  if (!s) {
    std::fprintf(stderr, "troupe deploy: %s\n", describe(s.error()).c_str());
    return 1;
  }
  std::vector<deployment_entry> todo;
  if (!o.model.empty()) todo.push_back({o.model, o.replicas, o.max_rows, o.capacity, o.name, o.kv_type});
  else todo = file_deployments;
  if (todo.empty()) {
    // Neither --model nor [[deployment]] entries: the embedded model, at the path it has on this
    // machine (nodes of the same install find it at the same path).
    auto found = model_or_default("", "deploy");
    if (!found) {
      std::fprintf(stderr, "%s\n", found.error().c_str());
      return 2;
    }
    todo.push_back({*found, o.replicas, o.max_rows, o.capacity, "", o.kv_type});
  }
  for (const auto& e : todo) {
    driver::driver_options d;
    d.max_rows = e.max_rows;
    d.capacity = e.capacity;
    d.prefill_chunk = 0;  // the node derives the chunk and the budget from the capacity
    d.token_budget = 0;
    if (o.speculation.any()) {
      auto sp = speculation_of(o.speculation, false);  // the nodes load the draft checkpoint
      if (!sp) {
        std::fprintf(stderr, "troupe deploy: %s\n", sp.error().c_str());
        return 2;
      }
      d.speculation = *sp;
    }
    if (o.expert_parallel > 1 && o.tensor_parallel > 1 && o.expert_parallel != o.tensor_parallel) {
      std::fprintf(stderr, "troupe deploy: --expert-parallel spans the tensor-parallel group: give it %d, or leave --tensor-parallel out\n",
                   o.tensor_parallel);
      return 2;
    }
    int replicas = e.replicas, tp = std::max(o.tensor_parallel, o.expert_parallel), pp = o.pipeline_parallel;
    bool across = o.across_nodes;
    // --plan GOAL: the planner picks the replica count and split here from the devices the status lists
    // (and says so), and GOAL goes with the deployment as the coordinator's policy for replacements.
    // Without it and without split flags the coordinator plans every replica itself.
    const bool cli_plan = !o.plan.empty();
    if (cli_plan) {
      // The planner on the devices the nodes declared: it picks the replicas and the split.
      auto st = (*s)->cluster_status();
      if (!st) {
        std::fprintf(stderr, "troupe deploy: %s\n", describe(st.error()).c_str());
        return 1;
      }
      auto split = plan_on_cluster(e.model, *st, o.plan, e.kv_type);
      if (!split) {
        std::fprintf(stderr, "troupe deploy: --plan %s: %s\n", o.plan.c_str(), split.error().c_str());
        return 1;
      }
      std::printf("plan (%s): %s\n", o.plan.c_str(), split->description.c_str());
      replicas = split->replicas, tp = split->tensor_parallel, pp = split->pipeline_parallel, across = split->across_nodes;
    }
    std::optional<progress_bar> bar;
    const std::string served = e.name.empty() ? actors::served_name(e.model) : e.name;
    if (o.progress) bar.emplace(**s, served, replicas);
    actors::deploy_request req;
    req.model = e.model;
    req.name = e.name;
    req.replicas = replicas;
    req.options = d;
    req.tensor_parallel = tp > 1 ? tp : 0;
    req.pipeline_parallel = pp > 1 ? pp : 0;
    req.across_nodes = across;
    req.expert_parallel = o.expert_parallel > 1;
    req.kv_type = e.kv_type;
    if (!o.mmproj.empty()) req.mmproj = std::filesystem::absolute(o.mmproj).lexically_normal();
    req.goal = o.plan;
    auto r = (*s)->deploy(req);
    if (bar) bar->finish(r.has_value());
    if (!r) {
      std::fprintf(stderr, "troupe deploy: %s: %s\n", e.model.c_str(), describe(r.error()).c_str());
      return 1;
    }
    std::printf("deployed '%s' on %d replica(s)\n", r->c_str(), replicas);
  }
  return 0;
}

int run_submit_cmd(const cluster_cmd_options& given) {
  auto o = given;
  auto p = prepare(o, "submit", "--coordinator");
  if (!p) return 2;
  auto s = actors::session::connect(p->at.host, p->at.port, p->secret, heartbeat(o), tls(o));
  if (!s) {
    std::fprintf(stderr, "troupe submit: %s\n", describe(s.error()).c_str());
    return 1;
  }
  transport::job_submit j;
  if (o.has_prompt_ids) j.prompt = o.prompt_ids;
  else j.prompt = o.prompt;
  j.max_tokens = o.max_tokens;
  j.ignore_eos = o.ignore_eos;
  j.sampling.temperature = static_cast<float>(o.temperature);
  j.sampling.seed = o.seed;
  j.model = o.model;  // empty: the cluster's only model
  auto cl = (*s)->client_session();
  auto jb = cl->submit(j);
  if (!jb) {
    std::fprintf(stderr, "troupe submit: %s (%s)\n", jb.error().message.c_str(), std::string(transport::name(jb.error().code)).c_str());
    return jb.error().retry == transport::retry::overloaded ? 75 : 1;
  }
  if (!o.json)
    while (auto c = jb->next()) {
      std::fwrite(c->text.data(), 1, c->text.size(), stdout);
      std::fflush(stdout);
    }
  auto r = jb->wait();
  if (r.error) {
    std::fprintf(stderr, "\ntroupe submit: %s (%s)\n", r.error->message.c_str(), std::string(transport::name(r.error->code)).c_str());
    return 1;
  }
  if (o.json) {
    nlohmann::json out = {{"tokens", r.tokens}, {"text", r.text}, {"finish_reason", r.finish_reason}, {"resumes", r.resumes}};
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
  }
  return 0;
}

int run_scale_cmd(const cluster_cmd_options& given) {
  auto o = given;
  auto p = prepare(o, "scale", "--coordinator");
  if (!p) return 2;
  auto s = actors::session::connect(p->at.host, p->at.port, p->secret, heartbeat(o), tls(o));
  if (!s) {
    std::fprintf(stderr, "troupe scale: %s\n", describe(s.error()).c_str());
    return 1;
  }
  auto r = (*s)->scale(o.model, o.replicas);
  if (!r) {
    std::fprintf(stderr, "troupe scale: %s\n", describe(r.error()).c_str());
    return 1;
  }
  std::printf("'%s' scaled to %d replica(s)\n", r->c_str(), o.replicas);
  return 0;
}

int run_status_cmd(const cluster_cmd_options& given) {
  auto o = given;
  auto p = prepare(o, "status", "--coordinator");
  if (!p) return 2;
  auto s = actors::session::connect(p->at.host, p->at.port, p->secret, heartbeat(o), tls(o));
  if (!s) {
    std::fprintf(stderr, "troupe status: %s\n", describe(s.error()).c_str());
    return 1;
  }
  auto st = (*s)->cluster_status();
  if (!st) {
    std::fprintf(stderr, "troupe status: %s\n", describe(st.error()).c_str());
    return 1;
  }
  if (o.json) std::printf("%s\n", actors::status_json(*st).c_str());
  else std::printf("%s", actors::status_table(*st).c_str());
  return 0;
}

int run_gateway_cmd(const cluster_cmd_options& given) {
  auto o = given;
  auto p = prepare(o, "gateway", "--coordinator");
  if (!p) return 2;
  auto at = parse_address(o.listen);
  if (!at) {
    std::fprintf(stderr, "troupe gateway: --listen takes HOST:PORT, got '%s'\n", o.listen.c_str());
    return 2;
  }
  actors::gateway_options g;
  g.host = at->host;
  g.port = at->port;
  if (auto free = actors::port_available(at->host, at->port); !free) {
    std::fprintf(stderr, "troupe gateway: %s\n", free.error().c_str());
    return 1;
  }
  if (!o.api_key_file.empty()) {
    auto keys = actors::read_api_keys(o.api_key_file);
    if (!keys) {
      std::fprintf(stderr, "troupe gateway: %s\n", keys.error().c_str());
      return 2;
    }
    g.api_keys = std::move(*keys);
  } else {
    std::fprintf(stderr, "troupe gateway: warning: no --api-key-file, so the HTTP API takes requests from anyone who can reach it\n");
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  auto s = actors::session::connect(p->at.host, p->at.port, p->secret, heartbeat(o), tls(o));
  if (!s) {
    std::fprintf(stderr, "troupe gateway: %s\n", describe(s.error()).c_str());
    return 1;
  }
  auto gw = actors::gateway::start(**s, o.model, g);
  if (!gw) {
    std::fprintf(stderr, "troupe gateway: %s\n", gw.error().c_str());
    return 1;
  }
  std::printf("troupe gateway: http://%s:%d/v1 serving '%s' from %s\n", g.host.c_str(), (*gw)->port(), (*s)->model_name().c_str(),
              o.address.c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  (*gw)->stop();
  return 0;
}

}  // namespace troupe::app

namespace troupe::app {

// `troupe top`: every replica's load, sampled from the coordinator (status: the replicas and their
// nodes) and the replicas themselves (stats), redrawn in place on a terminal.
int run_top_cmd(const cluster_cmd_options& given) {
  auto o = given;
  auto p = prepare(o, "top", "--coordinator");
  if (!p) return 2;
  auto s = actors::session::connect(p->at.host, p->at.port, p->secret, heartbeat(o), tls(o));
  if (!s) {
    std::fprintf(stderr, "troupe top: %s\n", describe(s.error()).c_str());
    return 1;
  }
  const bool tty = ::isatty(1) != 0;
  const auto t0 = std::chrono::steady_clock::now();
  int drawn = 0;
  bool seen_jobs = false;
  for (;;) {
    auto st = (*s)->cluster_status();
    if (!st) {
      std::fprintf(stderr, "troupe top: %s\n", describe(st.error()).c_str());
      return 1;
    }
    const auto stats = (*s)->replica_stats();
    std::vector<transport::replica_status> replicas;  // those with a driver, in the order replica_stats answers
    for (const auto& r : st->replicas)
      if (r.state != transport::replica_state::preparing) replicas.push_back(r);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string out;
    char line[256];
    double sum = 0;
    const std::int64_t jobs = st->jobs;
    std::snprintf(line, sizeof line, "%6.1f s  %-10s %-22s %7s %7s %10s %9s\n", secs, "node", "model", "running", "queued", "tok/s",
                  "jobs done");
    out += line;
    for (std::size_t i = 0; i < replicas.size() && i < stats.size(); ++i) {
      const auto& r = replicas[i];
      const auto& x = stats[i];
      sum += x.tokens_per_second;
      std::snprintf(line, sizeof line, "  #%-4zu  %-10s %-22s %7lld %7lld %10.1f %9lld\n", i, r.nodes.empty() ? "" : r.nodes.back().c_str(),
                    r.model.c_str(), static_cast<long long>(x.running), static_cast<long long>(x.queued),
                    x.tokens_per_second, static_cast<long long>(x.jobs_done));
      out += line;
    }
    std::snprintf(line, sizeof line, "  total  %-33s %7lld %7s %10.1f\n", "", static_cast<long long>(jobs), "", sum);
    out += line;
    if (tty && drawn > 0) std::printf("\x1b[%dA", drawn);  // back over the last sample
    if (!tty && drawn > 0) std::printf("\n");
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
    drawn = static_cast<int>(std::count(out.begin(), out.end(), '\n'));
    seen_jobs = seen_jobs || jobs > 0;
    if (o.until_idle && seen_jobs && jobs == 0) return 0;
    if (o.duration_s > 0 && secs >= o.duration_s) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(o.interval_ms));
  }
}

// One rank of a Gloo group whose ranks find each other through the coordinator's rendezvous store (no
// shared directory: the ranks may be on different machines). Checks all_reduce, all_gather and a ring
// of send/recv for exact values, then times all_reduce as nccl-tests do (algorithm and bus bandwidth).
int run_collectives_cmd(const cluster_cmd_options& given) {
  auto o = given;
  auto p = prepare(o, "collectives", "--coordinator");
  if (!p) return 2;
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    std::fprintf(stderr, "troupe collectives: rank %d is outside a group of %d\n", o.rank, o.size);
    return 2;
  }
  auto s = actors::session::connect(p->at.host, p->at.port, p->secret, heartbeat(o), tls(o));
  if (!s) {
    std::fprintf(stderr, "troupe collectives: %s\n", describe(s.error()).c_str());
    return 1;
  }
  transport::gloo_options g;
  g.rank = o.rank;
  g.size = o.size;
  g.store = (*s)->rendezvous_store();
  g.prefix = "collectives/" + o.group;
  g.timeout = std::chrono::milliseconds(std::max(o.timeout_ms, 1000) * 20);
  auto comm = transport::connect_gloo(g);
  if (!comm) {
    std::fprintf(stderr, "troupe collectives: joining group '%s': %s\n", o.group.c_str(), comm.error().message().c_str());
    return 1;
  }
  auto& c = **comm;
  const int n = o.size, r = o.rank;
  const auto len = static_cast<std::size_t>(std::max<std::int64_t>(o.floats, 1));
  bool exact = true;
  auto check = [&](const char* what, bool ok) {
    std::printf("rank %d: %s %s\n", r, what, ok ? "exact" : "WRONG");
    exact = exact && ok;
  };
  // Small integers: every sum is exact in f32 whatever the order.
  std::vector<float> x(len);
  for (std::size_t i = 0; i < len; ++i) x[i] = static_cast<float>(r + 1 + static_cast<int>(i % 7));
  if (auto e = c.all_reduce_sum(x); !e) {
    std::fprintf(stderr, "troupe collectives: all_reduce: %s\n", e.error().message().c_str());
    return 1;
  }
  bool ok = true;
  for (std::size_t i = 0; i < len && ok; ++i) ok = x[i] == static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 7));
  check("all_reduce", ok);
  const std::vector<float> mine(16, static_cast<float>(r));
  std::vector<float> all(16 * static_cast<std::size_t>(n));
  if (auto e = c.all_gather(mine, all); !e) {
    std::fprintf(stderr, "troupe collectives: all_gather: %s\n", e.error().message().c_str());
    return 1;
  }
  ok = true;
  for (std::size_t i = 0; i < all.size(); ++i) ok = ok && all[i] == static_cast<float>(i / 16);
  check("all_gather", ok);
  if (n > 1) {
    // A ring: even ranks send first, odd ranks receive first.
    const std::vector<float> out(64, static_cast<float>(100 + r));
    std::vector<float> in(64, -1.0f);
    const int to = (r + 1) % n, from = (r + n - 1) % n;
    auto send = [&] { return c.send(out, to); };
    auto recv = [&] { return c.recv(in, from); };
    auto first = r % 2 == 0 ? send() : recv();
    auto second = first ? (r % 2 == 0 ? recv() : send()) : first;
    if (!second) {
      std::fprintf(stderr, "troupe collectives: send/recv: %s\n", second.error().message().c_str());
      return 1;
    }
    check("send/recv ring", std::all_of(in.begin(), in.end(), [&](float v) { return v == static_cast<float>(100 + from); }));
  }
  std::vector<double> secs;
  for (int k = 0; k < std::max(o.rounds, 1); ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    if (auto e = c.all_reduce_sum(x); !e) {
      std::fprintf(stderr, "troupe collectives: all_reduce: %s\n", e.error().message().c_str());
      return 1;
    }
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(secs.begin(), secs.end());
  const double t = secs[secs.size() / 2], bytes = static_cast<double>(len) * sizeof(float);
  const double algbw = bytes / t / 1e9, busbw = algbw * 2.0 * (n - 1) / n;
  std::printf("rank %d: all_reduce of %zu floats over %d ranks: %.3f ms median, algbw %.2f GB/s, busbw %.2f GB/s\n", r, len, n, t * 1e3,
              algbw, busbw);
  std::printf("rank %d: %s\n", r, exact ? "all checks exact" : "a check FAILED");
  return exact ? 0 : 1;
}

}  // namespace troupe::app

namespace troupe::app {

int run_certs_cmd(const std::string& action, const std::string& dir, const std::string& name, int days) {
  auto r = action == "init" ? cluster::init_ca(dir, "troupe-ca", days > 0 ? days : 3650) : cluster::issue(dir, name, days > 0 ? days : 825);
  if (!r) {
    std::fprintf(stderr, "troupe certs %s: %s\n", action.c_str(), r.error().c_str());
    return 1;
  }
  std::printf("troupe certs %s: %s and %s\n", action.c_str(), r->certificate.c_str(), r->key.c_str());
  if (action == "issue")
    std::printf("give it to the process as --tls-cert %s --tls-key %s --tls-ca %s\n", r->certificate.c_str(), r->key.c_str(), (std::filesystem::path(dir) / "ca.pem").c_str());
  return 0;
}

}  // namespace troupe::app
