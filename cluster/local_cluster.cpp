// The cluster in one process (cluster/local_cluster.hpp): an actor system with the
// coordinator, the registry and one node, the model deployed through the coordinator as a remote
// cluster would be; and the replica figures every cluster handle reads.
#include <caf/all.hpp>

#include "cluster/local_cluster.hpp"
#include "actors/actor_internals.hpp"
#include "actors/model_needs.hpp"
#include "transport/codec.hpp"

namespace troupe::actors {

struct cluster_state {
  cluster_options options;
  std::unique_ptr<caf::actor_system_config> cfg;
  std::unique_ptr<caf::actor_system> sys;
  registry_actor registry;
  node_actor_t node;
  coordinator_actor coordinator;
  std::string model;
  client_set clients;

  ~cluster_state() {
    if (!sys) return;
    clients.close_all();
    if (coordinator) caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
    if (node) caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
    if (registry) caf::anon_send_exit(registry, caf::exit_reason::user_shutdown);
    coordinator = coordinator_actor{};
    node = node_actor_t{};
    registry = registry_actor{};
    sys.reset();  // waits for every actor to quit
  }
};

local_cluster::local_cluster(std::unique_ptr<cluster_state> s) : s_(std::move(s)) {}
local_cluster::~local_cluster() = default;
const std::string& local_cluster::name() const { return s_->model; }

result<std::unique_ptr<local_cluster>, std::string> local_cluster::start(const std::filesystem::path& model, const cluster_options& options) {
  auto s = std::make_unique<cluster_state>();
  s->options = options;
  s->cfg = std::make_unique<caf::actor_system_config>();
  s->cfg->set("scheduler.max-threads", static_cast<std::size_t>(std::max(1, options.scheduler_threads)));
  // Work sharing parks idle workers on a condition variable; work stealing polls, which takes cycles
  // from the executors' compute threads on a small machine.
  s->cfg->set("scheduler.policy", caf::atom("sharing"));
  s->sys = std::make_unique<caf::actor_system>(*s->cfg);
  s->registry = spawn_registry(*s->sys);
  s->node = spawn_node(*s->sys, options.executor_threads, options.max_per_replica, std::uint64_t{0});
  s->coordinator = spawn_coordinator(*s->sys, s->registry, caf::actor_cast<caf::actor>(s->node), options.max_outstanding, options.max_per_replica);
  s->model = options.name.empty() ? served_name(model) : options.name;
  transport::deploy d;
  d.model = s->model;
  d.replicas = options.replicas;
  d.load.model = model.string();
  d.load.device = "cpu";
  d.load.max_rows = options.driver.max_rows;
  d.load.capacity = options.driver.capacity;
  d.load.block_size = options.driver.block_size;
  d.load.pool_blocks = options.driver.pool_blocks;
  d.load.prefill_chunk = options.driver.prefill_chunk;
  d.load.token_budget = options.driver.token_budget;
  d.load.no_prefix_cache = !options.driver.prefix_cache;
  d.load.no_preempt = !options.driver.preempt;
  d.load.tensor_parallel = options.tensor_parallel;
  d.load.pipeline_parallel = options.pipeline_parallel;
  d.load.expert_parallel = options.expert_parallel;
  d.load.kv_type = options.kv_type;
  if (!options.mmproj.empty()) d.load.mmproj = std::filesystem::absolute(options.mmproj).lexically_normal().string();
  for (const auto& a : options.adapters) {
    // Paths as the node will open them: absolute, so the node's working directory does not matter.
    const auto eq = a.find('=');
    d.load.adapters.push_back(eq == std::string::npos ? a : a.substr(0, eq + 1) + std::filesystem::absolute(a.substr(eq + 1)).lexically_normal().string());
  }
  d.load.adapter_slots = options.adapter_slots;
  d.load.max_adapter_rank = options.max_adapter_rank;
  put_speculation(d.load, options.driver.speculation);
  caf::scoped_actor self{*s->sys};
  std::string err;
  self->request(s->coordinator, request_timeout, deploy_atom::value, transport::encode(d))
      .receive(
          [&](const std::string& reply) {
            auto m = transport::decode(reply);
            if (!m) err = m.error().message();
            else if (auto* e = std::get_if<transport::error>(&*m)) err = transport::describe(*e);
          },
          [&](caf::error& e) { err = s->sys->render(e); });
  if (!err.empty()) return unexpected(err);
  return std::unique_ptr<local_cluster>(new local_cluster(std::move(s)));
}

std::unique_ptr<client> local_cluster::connect() { return s_->clients.open(*s_->sys, s_->coordinator); }

std::vector<transport::stats> local_cluster::replica_stats() { return collect_replica_stats(*s_->sys, s_->coordinator); }

std::vector<std::string> local_cluster::models() { return served_models(*s_->sys, s_->coordinator); }

std::string local_cluster::adapter(const std::string& model, const std::string& name, const std::string& path) {
  caf::scoped_actor self{*s_->sys};
  std::string why;
  // The nodes of this process read the path: absolute, so the working directory does not matter.
  const std::string where = path.empty() ? std::string() : std::filesystem::absolute(path).lexically_normal().string();
  self->request(s_->coordinator, request_timeout, adapter_atom::value, model, name, where)
      .receive([&](const std::string& reply) { why = reply; }, [&](caf::error& e) { why = s_->sys->render(e); });
  return why;
}

transport::stats local_cluster::stats() {
  transport::stats total;
  for (const auto& s : replica_stats()) {
    total.queued += s.queued;
    total.running += s.running;
    total.kv_blocks_used += s.kv_blocks_used;
    total.kv_blocks_total += s.kv_blocks_total;
    total.tokens_per_second += s.tokens_per_second;
    total.jobs_done += s.jobs_done;
    total.jobs_refused += s.jobs_refused;
    total.prompt_tokens += s.prompt_tokens;
    total.prefix_hit_tokens += s.prefix_hit_tokens;
    total.draft_tokens += s.draft_tokens;
    total.accepted_tokens += s.accepted_tokens;
  }
  caf::scoped_actor self{*s_->sys};
  self->request(s_->coordinator, request_timeout, stats_atom::value)
      .receive(
          [&](const std::string& b) {
            auto m = transport::decode(b);
            if (m && std::holds_alternative<transport::stats>(*m)) total.jobs_refused += std::get<transport::stats>(*m).jobs_refused;
          },
          [](caf::error&) {});
  return total;
}

result<transport::cluster_status, std::string> local_cluster::cluster_status() { return cluster_status_of(*s_->sys, s_->coordinator); }

result<std::string, std::string> local_cluster::resolve(const std::filesystem::path& model) {
  caf::scoped_actor self{*s_->sys};
  std::string summary, err = "no answer";
  self->request(s_->registry, request_timeout, resolve_atom::value, model.string())
      .receive(
          [&](const std::string& b) {
            auto m = transport::decode(b);
            if (!m || !std::holds_alternative<transport::resolved_model>(*m)) return;
            const auto& r = std::get<transport::resolved_model>(*m);
            if (r.error.empty()) summary = r.family + " " + std::to_string(r.bytes) + " bytes";
            else err = r.error;
          },
          [&](caf::error& e) { err = s_->sys->render(e); });
  if (summary.empty()) return unexpected(err);
  return summary;
}

bool local_cluster::poke(const std::string& actor, const std::string& bytes) {
  caf::scoped_actor self{*s_->sys};
  caf::actor target;
  if (actor == "coordinator") {
    target = caf::actor_cast<caf::actor>(s_->coordinator);  // untyped: bytes as a peer would send them
    self->send(target, submit_atom::value, bytes, caf::actor{});
    self->send(target, cancel_atom::value, bytes);
    self->send(target, deploy_atom::value, bytes);
  } else if (actor == "registry") {
    target = caf::actor_cast<caf::actor>(s_->registry);
    self->send(target, resolve_atom::value, bytes);
  } else if (actor == "node") {
    target = caf::actor_cast<caf::actor>(s_->node);
    self->send(target, deploy_atom::value, bytes, caf::actor{});
  } else if (actor == "driver") {
    self->request(s_->coordinator, request_timeout, replicas_atom::value).receive([&](const std::vector<caf::actor>& v) {
      if (!v.empty()) target = v.front();
    }, [](caf::error&) {});
    if (target) self->send(target, submit_atom::value, bytes, caf::actor{});
  } else if (actor == "client") {
    target = s_->clients.newest();
    if (target) self->send(target, chunk_atom::value, bytes);
  }
  if (!target) return false;
  bool alive = false;
  self->request(target, std::chrono::seconds(60), ping_atom::value).receive([&](ping_atom) { alive = true; }, [](caf::error&) {});
  return alive;
}

}  // namespace troupe::actors
