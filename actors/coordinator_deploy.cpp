// The coordinator's deployments: each deployment's desired state (served name, replica count, load
// template, planner goal) and the reconciliation toward it. Every replica is placed by
// placement::assign_replica on the devices the nodes declared (anti-affinity first, a whole replica on
// one node when one holds it, pipeline stages across nodes otherwise); a lost replica is replaced as
// soon as a node has room; a deploy or scale is one operation that succeeds when its replicas serve, or
// fails naming the node and the reason and leaves the cluster as it was.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "actors/coordinator_state.hpp"
#include "actors/model_needs.hpp"
#include "placement/assign.hpp"
#include "transport/codec.hpp"

namespace troupe::actors::coord {
namespace {

// The least capacity a replica whose deployment left it to the model is given when its devices hold
// less than the model's positions.
constexpr std::int64_t default_min_capacity = 256;

// The actor's clock (CAF's test coordinator drives it in the unit tests), a steady clock otherwise.
using clock = caf::actor_clock::clock_type;


bool active(const replica_rec& r) { return r.state == transport::replica_state::preparing || r.state == transport::replica_state::serving; }

std::int32_t active_count(const state& st, const std::string& model) {
  std::int32_t n = 0;
  for (const auto& [id, r] : st.replicas)
    if (r.model == model && active(r)) ++n;
  return n;
}

bool op_pending(const state& st, const std::string& model) {
  for (const auto& [id, op] : st.ops)
    if (op.model == model) return true;
  return false;
}

std::optional<placement::objective> goal_of(const std::string& g) {
  if (g.empty() || g == "latency") return placement::objective::latency;
  if (g == "capacity") return placement::objective::capacity;
  if (g == "throughput") return placement::objective::throughput;
  return std::nullopt;
}

// The nodes as placement sees them for one more replica of `dep`.
std::vector<placement::node_view> views(const state& st, const deployment_rec& dep, clock::time_point now) {
  std::vector<placement::node_view> out;
  for (const auto& n : st.nodes) {
    placement::node_view v;
    v.id = n.id;
    v.max_replicas = n.max_replicas;
    bool declared = false;
    for (const auto& d : n.devices) {
      placement::device pd;
      pd.name = d.name;
      pd.kind = d.kind == transport::device_kind::cuda ? placement::device_kind::cuda : placement::device_kind::cpu;
      const auto it = n.committed.find(d.name);
      const std::uint64_t used = it == n.committed.end() ? 0 : it->second;
      pd.memory_bytes = d.memory_bytes > used ? d.memory_bytes - used : 0;
      declared = declared || d.memory_bytes > 0;
      v.devices.push_back(std::move(pd));
    }
    v.unbounded = !declared;
    for (const auto& [id, r] : st.replicas) {
      if (!active(r) && r.state != transport::replica_state::draining) continue;
      if (std::find(r.nodes.begin(), r.nodes.end(), n.id) == r.nodes.end()) continue;
      ++v.hosted;
      if (r.model == dep.spec.model) ++v.hosted_same;
    }
    const auto refused = dep.refused_by.find(n.id);
    v.excluded = !n.ready || n.draining || (refused != dep.refused_by.end() && now - refused->second < refusal_backoff);
    out.push_back(std::move(v));
  }
  return out;
}

placement::replica_request request_of(const deployment_rec& dep) {
  placement::replica_request rq;
  if (dep.resolved.plannable) {
    rq.needs = requirements_of(dep.resolved);
    // The checkpoint was resolved at its own (f32) KV type: the deployment's type scales the bytes a
    // token takes (f16 and bf16 half, q8_0 34 bytes per 32 values).
    rq.needs->kv_bytes_per_token_per_layer = kv_bytes_at(rq.needs->kv_bytes_per_token_per_layer, kv_type_of(dep.spec.load).value_or(families::default_kv_type));
  }
  const auto o = replica_options(dep.spec.load, dep.resolved.max_positions);
  rq.want_kv_tokens = o.pool_blocks > 0 ? o.pool_blocks * o.block_size : o.max_rows * o.capacity;
  // A capacity the deployment asked for must fit one sequence; one left to the model's positions may
  // shrink to what the devices hold (at least a prefill chunk's worth), as the KV pool does.
  rq.min_kv_tokens = dep.spec.load.capacity > 0 ? o.capacity : std::min<std::int64_t>(o.capacity, default_min_capacity);
  rq.goal = goal_of(dep.spec.goal).value_or(placement::objective::latency);
  rq.tensor_parallel = dep.spec.load.tensor_parallel;
  rq.pipeline_parallel = dep.spec.load.pipeline_parallel;
  rq.across_nodes = dep.spec.load.across_nodes;
  rq.expert_parallel = dep.spec.load.expert_parallel;
  return rq;
}

void release(state& st, replica_rec& r) {
  for (const auto& c : r.commits)
    if (auto* n = node_by_id(st, c.node)) {
      auto& used = n->committed[c.device];
      used = used > c.bytes ? used - c.bytes : 0;
    }
  r.commits.clear();
}

// The reply of a finished operation and the end of its hold on its replicas.
void finish_op(actor_t* self, std::uint64_t op_id) {
  auto& st = self->state;
  auto it = st.ops.find(op_id);
  if (it == st.ops.end()) return;
  auto& op = it->second;
  for (auto id : op.started)
    if (auto r = st.replicas.find(id); r != st.replicas.end()) r->second.op = 0;
  auto& dep = st.deployments.at(op.model);
  spdlog::info("event={}_done model={} replicas={}", op.kind, op.model, active_count(st, op.model));
  if (op.kind == "scale") op.rp.deliver(transport::encode(transport::scale{op.model, dep.spec.replicas}));
  else op.rp.deliver(transport::encode(dep.spec));
  st.ops.erase(it);
  save_journal(st);
}

// A failed operation: the replicas it started are stopped, the desired count goes back (a new
// deployment is forgotten), and the caller hears which node refused and why.
void fail_op(actor_t* self, std::uint64_t op_id, transport::error_code code, const std::string& why) {
  auto& st = self->state;
  auto it = st.ops.find(op_id);
  if (it == st.ops.end()) return;
  auto op = std::move(it->second);
  st.ops.erase(it);
  spdlog::warn("event={}_failed model={} code={} reason=\"{}\"", op.kind, op.model, transport::name(code), why);
  for (auto id : op.started) {
    auto r = st.replicas.find(id);
    if (r == st.replicas.end()) continue;
    r->second.op = 0;
    stop_replica(self, r->second);
    lose_replica(self, id, "its " + op.kind + " failed", false);
  }
  if (op.previous < 0) st.deployments.erase(op.model);
  else if (auto d = st.deployments.find(op.model); d != st.deployments.end()) d->second.spec.replicas = op.previous;
  save_journal(st);
  op.rp.deliver(error_bytes(0, code, op.kind + " of '" + op.model + "': " + why));
}

// Asks the assigned nodes for the replica's actors: every stage before the last spawns rank actors,
// then the last stage's node spawns the driver over them.
void start_replica(actor_t* self, deployment_rec& dep, const placement::assignment& a, std::uint64_t op_id) {
  auto& st = self->state;
  const auto id = st.next_replica++;
  replica_rec r;
  r.id = id;
  r.model = dep.spec.model;
  r.op = op_id;
  r.tensor_parallel = a.tensor_parallel;
  r.pipeline_parallel = a.pipeline_parallel;
  for (const auto& s : a.stages) {
    const auto& n = st.nodes[s.node];
    r.nodes.push_back(n.id);
    for (const auto& [dev, bytes] : s.bytes) {
      r.devices.push_back(n.id + "/" + dev);
      r.commits.push_back({n.id, dev, bytes});
    }
    if (s.bytes.empty()) r.devices.push_back(n.id + "/" + (n.devices.empty() ? std::string("cpu:0") : n.devices.front().name));
  }
  for (const auto& c : r.commits) node_by_id(st, c.node)->committed[c.device] += c.bytes;
  transport::deploy d = dep.spec;
  d.replicas = 1;
  d.load.replica_id = id;
  d.load.tensor_parallel = a.tensor_parallel;
  d.load.pipeline_parallel = a.pipeline_parallel;
  d.load.across_nodes = a.across_nodes;
  d.load.group = "replica-" + std::to_string(id);
  if (!a.across_nodes) {  // the devices the plan chose on the node, in rank order ("cuda:0,cuda:1")
    std::string devices;
    for (const auto& [dev, bytes] : a.stages.front().bytes) devices += (devices.empty() ? "" : ",") + dev;
    d.load.device = devices;
  }
  const auto o = replica_options(dep.spec.load, dep.resolved.max_positions);
  if (a.kv_tokens > 0 && a.kv_tokens < o.max_rows * o.capacity && d.load.pool_blocks == 0) {
    // The pool the devices hold; a capacity left to the model shrinks to it when it holds less than
    // one sequence of the model's positions.
    const auto blocks = std::max<std::int64_t>(a.kv_tokens / o.block_size, 1);
    if (dep.spec.load.capacity == 0 && blocks * o.block_size < o.capacity) d.load.capacity = blocks * o.block_size;
    d.load.pool_blocks = std::max(blocks, std::max<std::int64_t>(d.load.capacity, o.block_size) / o.block_size);
  }
  std::vector<caf::actor> stage_nodes;
  for (const auto& s : a.stages) stage_nodes.push_back(st.nodes[s.node].actor);
  spdlog::info("event=replica_placing replica={} model={} nodes={} plan=\"{}\" op={}", id, r.model, fmt::join(r.nodes, ","), a.description, op_id);
  st.replicas.emplace(id, std::move(r));
  if (op_id) {
    st.ops.at(op_id).waiting.insert(id);
    st.ops.at(op_id).started.push_back(id);
  }
  auto failed = [self, id](const std::string& node, const std::string& why) {
    auto& st = self->state;
    if (!st.replicas.contains(id)) return;
    lose_replica(self, id, "node '" + node + "' refused: " + why, true);
  };
  auto on_driver = [self, id, failed](const std::string& node, const caf::actor& driver, const std::string& why) {
    auto it = self->state.replicas.find(id);
    if (!driver) return failed(node, why);
    if (it == self->state.replicas.end()) {  // gone meanwhile (its operation failed): stop it too
      self->send_exit(driver, caf::exit_reason::user_shutdown);
      return;
    }
    it->second.driver = caf::actor_cast<driver_actor_t>(driver);
    self->monitor(driver);
  };
  const auto last_node = st.replicas.at(id).nodes.back();
  if (!a.across_nodes) {
    self->request(stage_nodes.front(), request_timeout, deploy_atom::value, transport::encode(d), caf::actor_cast<caf::actor>(self))
        .then([=](const caf::actor& driver, const std::string& why) { on_driver(last_node, driver, why); },
              [=](caf::error& e) { failed(last_node, self->system().render(e)); });
    return;
  }
  // Stages on nodes of their own: their pipe meets through the rendezvous store under the replica's
  // own prefix.
  const int pp = a.pipeline_parallel, tp = std::max(1, a.tensor_parallel);
  struct gathering {
    std::vector<caf::actor> ranks;
    int arrived = 0;
  };
  auto g = std::make_shared<gathering>();
  g->ranks.resize(static_cast<std::size_t>((pp - 1) * tp));
  auto head = [=] {
    transport::deploy hd = d;
    hd.load.world_rank = pp - 1;
    if (auto it = self->state.replicas.find(id); it != self->state.replicas.end()) it->second.ranks = g->ranks;
    self->request(stage_nodes.back(), request_timeout, deploy_atom::value, transport::encode(hd), caf::actor_cast<caf::actor>(self), g->ranks)
        .then([=](const caf::actor& driver, const std::string& why) { on_driver(last_node, driver, why); },
              [=](caf::error& e) { failed(last_node, self->system().render(e)); });
  };
  for (int s = 0; s + 1 < pp; ++s) {
    transport::deploy sd = d;
    sd.load.world_rank = s;
    const auto node = st.replicas.at(id).nodes[static_cast<std::size_t>(s)];
    self->request(stage_nodes[static_cast<std::size_t>(s)], request_timeout, rank_atom::value, transport::encode(sd), caf::actor_cast<caf::actor>(self))
        .then(
            [=](const std::vector<caf::actor>& ranks, const std::string& why) {
              if (!self->state.replicas.contains(id)) {
                for (const auto& r : ranks) self->send_exit(r, caf::exit_reason::user_shutdown);
                return;
              }
              if (static_cast<int>(ranks.size()) != tp)
                return failed(node, "stage " + std::to_string(s) + ": " + (why.empty() ? std::string("a rank count other than the split's") : why));
              for (int t = 0; t < tp; ++t) g->ranks[static_cast<std::size_t>(s * tp + t)] = ranks[static_cast<std::size_t>(t)];
              if (++g->arrived == pp - 1) head();
            },
            [=](caf::error& e) { failed(node, "stage " + std::to_string(s) + ": " + self->system().render(e)); });
  }
}

// Places replicas of `model` until its active count reaches the desired one. With an operation, a
// placement that finds no room fails it; without one (reconciliation), it waits for room.
void fill(actor_t* self, const std::string& model, std::uint64_t op_id) {
  auto& st = self->state;
  auto it = st.deployments.find(model);
  if (it == st.deployments.end()) return;
  auto& dep = it->second;
  while (active_count(st, model) < dep.spec.replicas) {
    const auto have = active_count(st, model);
    auto a = placement::assign_replica(views(st, dep, self->clock().now()), request_of(dep));
    if (!a) {
      const auto why = "no node has room for replica " + std::to_string(have + 1) + " of " + std::to_string(dep.spec.replicas) + " of '" + model +
                       "' (each node's --max-replicas and device memory): " + a.error().reason;
      if (op_id) return fail_op(self, op_id, transport::error_code::no_room, why);
      if (dep.blocked != why) spdlog::warn("event=reconcile_blocked model={} reason=\"{}\"", model, why);
      dep.blocked = why;
      return;
    }
    dep.blocked.clear();
    if (!op_id) spdlog::info("event=replica_replacing model={} have={} desired={}", model, have, dep.spec.replicas);
    start_replica(self, dep, *a, op_id);
  }
  if (op_id && st.ops.contains(op_id) && st.ops.at(op_id).waiting.empty()) finish_op(self, op_id);
}

// Replicas past the desired count drain, newest first (no new jobs; each stops after its last).
void trim(actor_t* self, const std::string& model) {
  auto& st = self->state;
  auto dep = st.deployments.find(model);
  if (dep == st.deployments.end()) return;
  std::int32_t extra = active_count(st, model) - dep->second.spec.replicas;
  for (auto it = st.replicas.rbegin(); it != st.replicas.rend() && extra > 0; ++it) {
    auto& r = it->second;
    if (r.model != model || !active(r)) continue;
    --extra;
    if (r.state == transport::replica_state::preparing) {
      stop_replica(self, r);
      lose_replica(self, r.id, "scaled down while preparing", false);
      return trim(self, model);  // the map changed under the iterator
    }
    r.state = transport::replica_state::draining;
    spdlog::info("event=replica_draining replica={} model={} node={}", r.id, model, r.nodes.back());
    if (r.outstanding == 0 && r.driver) self->send(r.driver, stop_atom::value);
  }
}

std::optional<transport::deploy> decode_deploy(const std::string& bytes, std::string& why) {
  auto m = transport::decode(bytes);
  if (!m) {
    why = m.error().message();
    return std::nullopt;
  }
  if (!std::holds_alternative<transport::deploy>(*m)) {
    why = "the coordinator takes a Deploy here, not " + std::string(transport::kind(*m));
    return std::nullopt;
  }
  return std::get<transport::deploy>(*m);
}

}  // namespace

void stop_replica(actor_t* self, replica_rec& r) {
  if (r.driver) self->send_exit(r.driver, caf::exit_reason::user_shutdown);
  for (const auto& a : r.ranks)
    if (a) self->send_exit(a, caf::exit_reason::user_shutdown);
}

void lose_replica(actor_t* self, std::uint64_t id, const std::string& why, bool failed) {
  auto& st = self->state;
  auto it = st.replicas.find(id);
  if (it == st.replicas.end()) return;
  auto& r = it->second;
  const bool was_serving = r.state == transport::replica_state::serving;
  spdlog::log(failed || was_serving ? spdlog::level::warn : spdlog::level::info, "event=replica_lost replica={} model={} nodes={} reason=\"{}\"", id,
              r.model, fmt::join(r.nodes, ","), why);
  for (auto j = st.jobs.begin(); j != st.jobs.end();) {
    if (j->second.replica == id) {
      if (j->second.client)
        self->send(j->second.client, chunk_atom::value,
                   transport::encode(transport::error{j->first, transport::error_code::disconnected, "the replica serving this job went away", transport::retry::disconnected}));
      j = st.jobs.erase(j);
    } else {
      ++j;
    }
  }
  release(st, r);
  if (failed && !r.nodes.empty())
    if (auto d = st.deployments.find(r.model); d != st.deployments.end()) d->second.refused_by[r.nodes.back()] = self->clock().now();
  const auto op = r.op;
  if (failed && r.driver) self->send_exit(r.driver, caf::exit_reason::user_shutdown);
  st.replicas.erase(it);
  if (op && failed) fail_op(self, op, transport::error_code::prepare_failed, why);
  else if (op) {
    if (auto o = st.ops.find(op); o != st.ops.end()) o->second.waiting.erase(id);
  }
}

void handle_register(actor_t* self, std::uint64_t id, const caf::actor& driver, const std::string& why) {
  auto& st = self->state;
  auto it = st.replicas.find(id);
  if (it == st.replicas.end()) {
    if (driver && why.empty()) self->send_exit(driver, caf::exit_reason::user_shutdown);  // its operation failed meanwhile
    return;
  }
  auto& r = it->second;
  if (!why.empty()) return lose_replica(self, id, "node '" + r.nodes.back() + "' could not prepare the replica: " + why, true);
  if (!r.driver) {
    r.driver = caf::actor_cast<driver_actor_t>(driver);
    self->monitor(driver);
  }
  r.state = transport::replica_state::serving;
  spdlog::info("event=replica_serving replica={} model={} nodes={}", id, r.model, fmt::join(r.nodes, ","));
  if (auto d = st.deployments.find(r.model); d != st.deployments.end()) d->second.refused_by.erase(r.nodes.back());
  if (r.op)
    if (auto op = st.ops.find(r.op); op != st.ops.end()) {
      op->second.waiting.erase(id);
      if (op->second.waiting.empty()) finish_op(self, r.op);
    }
}

caf::typed_response_promise<std::string> handle_deploy(actor_t* self, const std::string& bytes) {
  auto rp = self->make_response_promise<std::string>();
  auto& st = self->state;
  std::string why;
  auto d = decode_deploy(bytes, why);
  if (!d) {
    rp.deliver(error_bytes(0, transport::error_code::bad_message, why));
    return rp;
  }
  if (d->load.model.empty()) {
    rp.deliver(error_bytes(0, transport::error_code::invalid_request, "a deployment names a checkpoint"));
    return rp;
  }
  if (d->model.empty()) d->model = served_name(d->load.model);
  if (d->replicas < 1) {
    rp.deliver(error_bytes(0, transport::error_code::invalid_request, "a deployment has at least one replica (scale to 0 is not served)"));
    return rp;
  }
  if (auto kv = kv_type_of(d->load); !kv) {
    rp.deliver(error_bytes(0, transport::error_code::invalid_request, kv.error()));
    return rp;
  }
  if (!goal_of(d->goal)) {
    rp.deliver(error_bytes(0, transport::error_code::invalid_request, "the planner's goal is latency, capacity or throughput, not '" + d->goal + "'"));
    return rp;
  }
  if (op_pending(st, d->model)) {
    rp.deliver(error_bytes(0, transport::error_code::busy, "a deploy or scale of '" + d->model + "' is in progress", transport::retry::overloaded));
    return rp;
  }
  spdlog::info("event=deploy model={} path={} replicas={}", d->model, d->load.model, d->replicas);
  if (auto existing = st.deployments.find(d->model); existing != st.deployments.end()) {
    // The same deployment again is its desired count again (idempotent); another checkpoint under a
    // taken name is refused.
    if (existing->second.spec.load.model != d->load.model) {
      rp.deliver(error_bytes(0, transport::error_code::name_taken, "'" + d->model + "' already serves " + existing->second.spec.load.model + " (deploy --name NAME)"));
      return rp;
    }
    const auto previous = existing->second.spec.replicas;
    existing->second.spec.replicas = d->replicas;
    if (active_count(st, d->model) >= d->replicas) {
      trim(self, d->model);
      save_journal(st);
      rp.deliver(transport::encode(existing->second.spec));
      return rp;
    }
    const auto op_id = st.next_op++;
    st.ops[op_id] = operation{op_id, d->model, "deploy", rp, previous, {}, {}};
    fill(self, d->model, op_id);
    return rp;
  }
  if (st.nodes.empty()) {
    rp.deliver(error_bytes(0, transport::error_code::no_nodes, "no node has joined", transport::retry::overloaded));
    return rp;
  }
  const auto op_id = st.next_op++;
  st.ops[op_id] = operation{op_id, d->model, "deploy", rp, -1, {}, {}};
  // Resolved before any node loads a byte: an unknown checkpoint fails here.
  self->request(st.registry, request_timeout, resolve_atom::value, d->load.model)
      .then(
          [=](const std::string& answer) {
            auto& st = self->state;
            if (!st.ops.contains(op_id)) return;
            auto m = transport::decode(answer);
            if (!m || !std::holds_alternative<transport::resolved_model>(*m))
              return fail_op(self, op_id, transport::error_code::internal, "the registry's answer did not decode");
            const auto& resolved = std::get<transport::resolved_model>(*m);
            if (!resolved.error.empty()) return fail_op(self, op_id, transport::error_code::unknown_model, resolved.error);
            st.deployments[d->model] = deployment_rec{*d, resolved, {}, {}};
            fill(self, d->model, op_id);
          },
          [=](caf::error& e) { fail_op(self, op_id, transport::error_code::internal, "registry: " + self->system().render(e)); });
  return rp;
}

caf::typed_response_promise<std::string> handle_scale(actor_t* self, const std::string& bytes) {
  auto rp = self->make_response_promise<std::string>();
  auto& st = self->state;
  auto m = transport::decode(bytes);
  if (!m || !std::holds_alternative<transport::scale>(*m)) {
    rp.deliver(error_bytes(0, transport::error_code::bad_message, m ? "the coordinator takes a Scale here" : m.error().message()));
    return rp;
  }
  const auto sc = std::get<transport::scale>(*m);
  auto dep = st.deployments.find(sc.model);
  if (dep == st.deployments.end()) {
    rp.deliver(error_bytes(0, transport::error_code::unknown_model, "nothing named '" + sc.model + "' is deployed"));
    return rp;
  }
  if (sc.replicas < 1) {
    rp.deliver(error_bytes(0, transport::error_code::invalid_request, "a deployment keeps at least one replica"));
    return rp;
  }
  if (op_pending(st, sc.model)) {
    rp.deliver(error_bytes(0, transport::error_code::busy, "a deploy or scale of '" + sc.model + "' is in progress", transport::retry::overloaded));
    return rp;
  }
  spdlog::info("event=scale model={} from={} to={}", sc.model, dep->second.spec.replicas, sc.replicas);
  const auto previous = dep->second.spec.replicas;
  dep->second.spec.replicas = sc.replicas;
  if (active_count(st, sc.model) >= sc.replicas) {
    trim(self, sc.model);
    save_journal(st);
    rp.deliver(transport::encode(sc));
    return rp;
  }
  const auto op_id = st.next_op++;
  st.ops[op_id] = operation{op_id, sc.model, "scale", rp, previous, {}, {}};
  fill(self, sc.model, op_id);
  return rp;
}

// How long a coordinator restarted from its journal waits for its nodes before placing replicas anew:
// a node notices the loss within its heartbeat timeout and rejoins every 500 ms.
constexpr auto restart_grace = std::chrono::seconds(5);

void adopt_replicas(actor_t* self, const std::string& node_id, const std::vector<caf::actor>& drivers, const std::vector<std::string>& deploys) {
  auto& st = self->state;
  auto* node = node_by_id(st, node_id);
  for (std::size_t i = 0; i < drivers.size() && i < deploys.size(); ++i) {
    const auto& driver = drivers[i];
    auto m = transport::decode(deploys[i]);
    const auto* d = m ? std::get_if<transport::deploy>(&*m) : nullptr;
    auto dep = d ? st.deployments.find(d->model) : st.deployments.end();
    std::string why;
    if (!d) why = "its deployment did not decode";
    else if (dep == st.deployments.end()) why = "no deployment '" + d->model + "'";
    else if (dep->second.spec.load.model != d->load.model) why = "deployment '" + d->model + "' serves another checkpoint now";
    else if (op_pending(st, d->model)) why = "deployment '" + d->model + "' is being changed";
    else if (active_count(st, d->model) >= dep->second.spec.replicas) why = "deployment '" + d->model + "' has its replicas";
    else if (!node) why = "the node left";
    if (!why.empty()) {
      spdlog::info("event=replica_not_adopted node={} reason=\"{}\" action=stopped", node_id, why);
      self->send_exit(driver, caf::exit_reason::user_shutdown);
      continue;
    }
    // What it holds on the node's devices, by the planner's model of the node as it is now.
    replica_rec r;
    r.id = st.next_replica++;
    r.model = d->model;
    r.nodes = {node_id};
    r.tensor_parallel = std::max(1, d->load.tensor_parallel);
    r.pipeline_parallel = std::max(1, d->load.pipeline_parallel);
    std::vector<placement::node_view> only;
    for (auto& v : views(st, dep->second, self->clock().now()))
      if (v.id == node_id) v.excluded = false, v.hosted_same = 0, only.push_back(std::move(v));
    auto rq = request_of(dep->second);
    rq.tensor_parallel = r.tensor_parallel;
    rq.pipeline_parallel = r.pipeline_parallel;
    if (auto a = placement::assign_replica(only, rq); a && !a->stages.empty())
      for (const auto& [dev, bytes] : a->stages.front().bytes) {
        r.devices.push_back(node_id + "/" + dev);
        r.commits.push_back({node_id, dev, bytes});
      }
    if (r.devices.empty()) r.devices.push_back(node_id + "/" + (node->devices.empty() ? std::string("cpu:0") : node->devices.front().name));
    for (const auto& c : r.commits) node->committed[c.device] += c.bytes;
    r.driver = caf::actor_cast<driver_actor_t>(driver);
    self->monitor(driver);
    spdlog::info("event=replica_adopting replica={} model={} node={} was={}", r.id, r.model, node_id, d->load.replica_id);
    const auto id = r.id;
    st.replicas.emplace(id, std::move(r));
    self->send(caf::actor_cast<driver_actor_t>(driver), adopt_atom::value, caf::actor_cast<caf::actor>(self), id);
  }
}

void probe_progress(actor_t* self) {
  auto& st = self->state;
  for (auto& [id, r] : st.replicas) {
    if (r.state != transport::replica_state::serving || !r.driver || r.probing) continue;
    r.probing = true;
    const auto rid = id;
    auto done = [self, rid] {
      if (auto it = self->state.replicas.find(rid); it != self->state.replicas.end()) it->second.probing = false;
    };
    self->request(r.driver, st.progress_timeout, stats_atom::value)
        .then([done](const std::string&) { done(); },
              [self, rid, done](caf::error& e) {
                done();
                // Only silence is a hang: a refusal or an unknown message came from a driver that runs.
                if (e != caf::sec::request_timeout) return;
                auto it = self->state.replicas.find(rid);
                if (it == self->state.replicas.end() || it->second.state != transport::replica_state::serving) return;
                ++self->state.hung;
                const auto secs = std::chrono::duration<double>(self->state.progress_timeout).count();
                spdlog::warn("event=replica_hung replica={} model={} nodes={} silent_s={}", rid, it->second.model, fmt::join(it->second.nodes, ","), secs);
                stop_replica(self, it->second);
                lose_replica(self, rid, "no forward progress: its driver did not answer for " + fmt::format("{:.1f}", secs) + " s", true);
                reconcile(self);
              });
  }
}

void restore(actor_t* self) {
  auto deployments = load_journal(self->state.journal);
  if (!deployments.empty()) self->state.grace_until = self->clock().now() + restart_grace;
  for (auto d : deployments) {
    spdlog::info("event=deployment_restored model={} path={} replicas={}", d.model, d.load.model, d.replicas);
    self->request(self->state.registry, request_timeout, resolve_atom::value, d.load.model)
        .then(
            [=](const std::string& answer) {
              auto m = transport::decode(answer);
              if (!m || !std::holds_alternative<transport::resolved_model>(*m)) return;
              const auto& resolved = std::get<transport::resolved_model>(*m);
              if (!resolved.error.empty()) {
                spdlog::error("event=deployment_not_restored model={} reason=\"{}\"", d.model, resolved.error);
                return;
              }
              self->state.deployments[d.model] = deployment_rec{d, resolved, {}, {}};
              reconcile(self);
            },
            [=](caf::error& e) { spdlog::error("event=deployment_not_restored model={} reason=\"{}\"", d.model, self->system().render(e)); });
  }
}

void reconcile(actor_t* self) {
  auto& st = self->state;
  // A node that just joined may still run replicas this coordinator will take back (adopt_replicas):
  // nothing is placed until every joined node said what it runs (or 5 s passed).
  for (const auto& n : st.nodes)
    if (n.adopting) return;
  if (self->clock().now() < st.grace_until) return;
  std::vector<std::string> names;
  for (const auto& [name, dep] : st.deployments) names.push_back(name);
  for (const auto& name : names) {
    if (op_pending(st, name)) continue;
    if (!st.deployments.contains(name)) continue;
    const auto have = active_count(st, name), want = st.deployments.at(name).spec.replicas;
    if (have < want) fill(self, name, 0);
    else if (have > want) trim(self, name);
  }
}

transport::cluster_status status_of(const state& st) {
  transport::cluster_status s;
  for (const auto& n : st.nodes) {
    transport::node_status ns;
    ns.id = n.id;
    ns.devices = n.devices;
    ns.state = n.draining ? "draining" : n.ready ? "ready" : "joining";
    for (const auto& [id, r] : st.replicas)
      if (std::find(r.nodes.begin(), r.nodes.end(), n.id) != r.nodes.end()) ++ns.replicas;
    for (const auto& [dev, bytes] : n.committed) ns.committed_bytes += bytes;
    s.nodes.push_back(std::move(ns));
  }
  for (const auto& [id, r] : st.replicas)
    s.replicas.push_back({r.id, r.model, r.nodes, r.devices, r.state, r.outstanding, r.prepare_done, r.prepare_total, r.tensor_parallel,
                          r.pipeline_parallel});
  for (const auto& [name, d] : st.deployments) {
    std::int32_t serving = 0;
    for (const auto& [id, r] : st.replicas)
      if (r.model == name && r.state == transport::replica_state::serving) ++serving;
    transport::deployment_status ds{name, d.spec.load.model, d.spec.replicas, serving, d.resolved.family};
    const auto kv = kv_type_of(d.spec.load).value_or(families::default_kv_type);
    ds.kv_type = std::string(troupe::name(kv));
    ds.kv_bytes_per_token = static_cast<std::int64_t>(kv_bytes_at(d.resolved.kv_bytes_per_token_per_layer, kv)) * static_cast<std::int64_t>(d.resolved.layers);
    const auto o = replica_options(d.spec.load, d.resolved.max_positions);
    ds.capacity = o.capacity;
    ds.kv_tokens = o.pool_blocks > 0 ? o.pool_blocks * o.block_size : o.max_rows * o.capacity;
    for (const auto& a : d.spec.load.adapters) ds.adapters.push_back(a.substr(0, a.find('=')));
    s.deployments.push_back(std::move(ds));
  }
  s.jobs = static_cast<std::int64_t>(st.jobs.size());
  s.refused = st.refused;
  return s;
}

}  // namespace troupe::actors::coord
