// The coordinator actor: one per cluster. Membership (nodes join through the gatekeeper, declare their
// devices, are monitored), admission and routing of jobs by model (prefix affinity among the replicas of
// the job's model, then load), the rendezvous store of collective groups, and the deployments
// (coordinator_deploy.cpp), which it reconciles on every event and on a timer.
#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "actors/coordinator_state.hpp"
#include "transport/codec.hpp"

namespace troupe::actors {
namespace coord {

node_rec* node_by_id(state& st, const std::string& id) {
  for (auto& n : st.nodes)
    if (n.id == id) return &n;
  return nullptr;
}

node_rec* node_by_actor(state& st, const caf::actor_addr& a) {
  for (auto& n : st.nodes)
    if (n.actor.address() == a) return &n;
  return nullptr;
}

std::string node_of(const state& st, const caf::actor& a) {
  for (const auto& n : st.nodes)
    if (n.actor.node() == a.node()) return n.id;
  return {};
}

namespace {

std::uint64_t affinity_key(const transport::prompt& p) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  if (const auto* ids = std::get_if<std::vector<std::int32_t>>(&p)) {
    for (std::size_t i = 0; i < std::min<std::size_t>(ids->size(), 32); ++i) mix(static_cast<std::uint32_t>((*ids)[i]));
  } else if (const auto* t = std::get_if<std::string>(&p)) {
    for (std::size_t i = 0; i < std::min<std::size_t>(t->size(), 128); ++i) mix(static_cast<unsigned char>((*t)[i]));
  } else {
    for (const auto& m : std::get<std::vector<transport::chat_message>>(p)) {
      for (char c : m.role) mix(static_cast<unsigned char>(c));
      for (std::size_t i = 0; i < std::min<std::size_t>(m.content.size(), 128); ++i) mix(static_cast<unsigned char>(m.content[i]));
      break;  // the system prompt is what requests share
    }
  }
  return h;
}

// The deployment a job names: its served name or its checkpoint's path; none named is the only one.
const deployment_rec* deployment_for(const state& st, const std::string& model, std::string& why) {
  if (model.empty()) {
    if (st.deployments.size() == 1) return &st.deployments.begin()->second;
    if (st.deployments.empty()) why = "no model is deployed";
    else {
      why = "name the model: this cluster serves";
      for (const auto& [name, d] : st.deployments) why += " '" + name + "'";
    }
    return nullptr;
  }
  if (auto it = st.deployments.find(model); it != st.deployments.end()) return &it->second;
  for (const auto& [name, d] : st.deployments)
    if (d.spec.load.model == model) return &d;
  why = "no deployment serves model '" + model + "'";
  return nullptr;
}

// A deployment's LoRA adapter by name (load_request::adapters holds "name=path").
bool serves_adapter(const deployment_rec& d, std::string_view name) {
  for (const auto& a : d.spec.load.adapters)
    if (std::string_view(a).substr(0, a.find('=')) == name) return true;
  return false;
}

// A job whose model names an adapter rather than a deployment ("served:adapter", or the adapter's own
// name, as vLLM lists its LoRA modules as models) is for the deployment that loaded it, with the adapter.
void resolve_adapter(const state& st, transport::job_submit& j) {
  if (!j.adapter.empty() || st.deployments.contains(j.model)) return;
  if (const auto colon = j.model.rfind(':'); colon != std::string::npos) {
    const auto it = st.deployments.find(j.model.substr(0, colon));
    if (it != st.deployments.end() && serves_adapter(it->second, std::string_view(j.model).substr(colon + 1))) {
      j.adapter = j.model.substr(colon + 1);
      j.model = it->first;
      return;
    }
  }
  for (const auto& [name, d] : st.deployments)
    if (serves_adapter(d, j.model)) {
      j.adapter = j.model;
      j.model = name;
      return;
    }
}

// Admission and routing: (job id, "", model) or (0, error bytes, "").
caf::result<std::uint64_t, std::string, std::string> route(actor_t* self, const std::string& bytes, const caf::actor& client) {
  auto& st = self->state;
  auto refuse = [&](transport::error_code code, std::string why, transport::retry r) -> caf::result<std::uint64_t, std::string, std::string> {
    ++st.refused;
    return {std::uint64_t{0}, error_bytes(0, code, std::move(why), r), std::string()};
  };
  auto m = transport::decode(bytes);
  if (!m) return refuse(transport::error_code::bad_message, m.error().message(), m.error().retry());
  auto* j = std::get_if<transport::job_submit>(&*m);
  if (!j) return refuse(transport::error_code::bad_message, "the coordinator takes job submissions here, not " + std::string(transport::kind(*m)), transport::retry::failed);
  if (static_cast<std::int64_t>(st.jobs.size()) >= st.max_outstanding)
    return refuse(transport::error_code::overloaded, "the cluster holds " + std::to_string(st.jobs.size()) + " jobs, its bound", transport::retry::overloaded);
  std::string why;
  resolve_adapter(st, *j);
  const auto* dep = deployment_for(st, j->model, why);
  if (!dep) return refuse(transport::error_code::unknown_model, why, transport::retry::failed);
  const auto& model = dep->spec.model;
  std::vector<replica_rec*> live;
  std::int32_t preparing = 0;
  for (auto& [id, r] : st.replicas) {
    if (r.model != model) continue;
    if (r.state == transport::replica_state::serving && r.driver) live.push_back(&r);
    if (r.state == transport::replica_state::preparing) ++preparing;
  }
  if (live.empty())
    return refuse(transport::error_code::no_replica, "no replica of '" + model + "' serves right now (" + std::to_string(preparing) + " preparing)", transport::retry::overloaded);
  // Prefix affinity: the replica a prompt's opening hashes to, unless it is clearly busier than the
  // least loaded one; otherwise the least loaded.
  replica_rec* best = live.front();
  for (auto* r : live)
    if (r->outstanding < best->outstanding) best = r;
  auto* preferred = live[affinity_key(j->prompt) % live.size()];
  if (preferred->outstanding <= best->outstanding + 2) best = preferred;
  if (best->outstanding >= st.max_per_replica)
    return refuse(transport::error_code::overloaded, "every replica of '" + model + "' holds its bound of jobs", transport::retry::overloaded);
  j->job_id = st.next_job++;
  j->model = model;
  spdlog::debug("event=job_routed job={} model={} replica={} outstanding={}", j->job_id, model, best->id, best->outstanding + 1);
  ++best->outstanding;
  st.jobs[j->job_id] = {best->id, caf::actor_cast<client_actor_t>(client)};
  self->send(best->driver, submit_atom::value, transport::encode(*j), client);
  return {j->job_id, std::string(), model};
}

void job_done(actor_t* self, std::uint64_t job) {
  auto& st = self->state;
  auto it = st.jobs.find(job);
  if (it == st.jobs.end()) return;
  auto r = st.replicas.find(it->second.replica);
  st.jobs.erase(it);
  if (r == st.replicas.end()) return;
  if (r->second.outstanding > 0) --r->second.outstanding;
  if (r->second.state == transport::replica_state::draining && r->second.outstanding == 0 && r->second.driver)
    self->send(r->second.driver, stop_atom::value);
}

// A monitored actor went away: a node (with every replica that had a stage on it) or a driver.
void on_down(actor_t* self, const caf::down_msg& dm) {
  auto& st = self->state;
  if (auto* n = node_by_actor(st, dm.source)) {
    const auto id = n->id;
    spdlog::warn("event=node_lost node={} reason=\"{}\"", id, self->system().render(dm.reason));
    std::vector<std::uint64_t> gone;
    for (auto& [rid, r] : st.replicas)
      if (std::find(r.nodes.begin(), r.nodes.end(), id) != r.nodes.end()) gone.push_back(rid);
    for (auto rid : gone) {
      if (auto it = st.replicas.find(rid); it != st.replicas.end()) stop_replica(self, it->second);
      lose_replica(self, rid, "node '" + id + "' was lost", true);
    }
    std::erase_if(st.nodes, [&](const node_rec& x) { return x.id == id; });
    for (auto& [name, d] : st.deployments) d.refused_by.erase(id);
  } else {
    for (auto& [rid, r] : st.replicas) {
      if (!r.driver || r.driver.address() != dm.source) continue;
      const bool drained = r.state == transport::replica_state::draining;
      const auto id = rid;
      // Named by its node, as a refusal is: the driver's exit may reach here before the node's answer.
      const std::string node = r.nodes.empty() ? std::string("?") : r.nodes.back();
      lose_replica(self, id, drained ? "drained" : "node '" + node + "': its driver stopped: " + self->system().render(dm.reason), !drained);
      break;
    }
  }
  reconcile(self);
}

}  // namespace

coordinator_actor::behavior_type coordinator(actor_t* self, registry_actor registry, caf::actor node, std::int64_t max_outstanding,
                                             std::int64_t max_per_replica, std::string journal, std::chrono::milliseconds progress_timeout) {
  auto& st = self->state;
  st.progress_timeout = progress_timeout;
  // Job ids go on from where a coordinator before this one left off (the wall clock in microseconds,
  // below 2^53): clients and drivers that outlive a restart never see an id twice.
  st.next_job = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  st.registry = std::move(registry);
  st.journal = std::move(journal);
  st.max_outstanding = max_outstanding;
  st.max_per_replica = max_per_replica;
  if (node) {  // local_cluster's node: in this process, no declared bound
    node_rec n;
    n.id = "node-0";
    n.actor = node;
    n.devices.push_back({"cpu:0", transport::device_kind::cpu, 0});
    n.ready = true;
    st.nodes.push_back(std::move(n));
    self->monitor(node);
  }
  self->set_down_handler([self](caf::down_msg& dm) { on_down(self, dm); });
  restore(self);
  self->send(self, reconcile_atom::value);
  return {
      [=](deploy_atom, const std::string& bytes) { return handle_deploy(self, bytes); },
      [=](scale_atom, const std::string& bytes) { return handle_scale(self, bytes); },
      [=](reconcile_atom) {
        probe_progress(self);
        reconcile(self);
        self->delayed_send(self, reconcile_interval, reconcile_atom::value);
      },
      [=](progress_atom, std::uint64_t replica, std::int64_t done, std::int64_t total) {
        if (auto it = self->state.replicas.find(replica); it != self->state.replicas.end())
          it->second.prepare_done = done, it->second.prepare_total = total;
      },
      [=](register_atom, std::uint64_t replica, const caf::actor& driver, const std::string& why) {
        handle_register(self, replica, driver, why);
        reconcile(self);
      },
      [=](submit_atom, const std::string& bytes, const caf::actor& client) { return route(self, bytes, client); },
      [=](cancel_atom, const std::string& bytes) {
        auto& st = self->state;
        auto m = transport::decode(bytes);
        if (!m || !std::holds_alternative<transport::cancel_job>(*m)) return;
        const auto id = std::get<transport::cancel_job>(*m).job_id;
        if (auto it = st.jobs.find(id); it != st.jobs.end())
          if (auto r = st.replicas.find(it->second.replica); r != st.replicas.end() && r->second.driver)
            self->send(r->second.driver, cancel_atom::value, id);
      },
      [=](done_atom, std::uint64_t job) { job_done(self, job); },
      // A node leaving (SIGTERM): nothing new is placed on it, its replicas take no new job and stop
      // after their last one, and reconciliation replaces them elsewhere. Answers how many of its
      // replicas still run; the node asks again until none does.
      [=](drain_atom, const caf::actor& node) {
        auto& st = self->state;
        const auto id = node_of(st, node);
        auto* n = node_by_id(st, id);
        if (n && !n->draining) {
          n->draining = true;
          spdlog::info("event=node_draining node={}", id);
        }
        std::int32_t left = 0;
        for (auto& [rid, r] : st.replicas) {
          if (!r.driver || r.driver.node() != node.node()) continue;
          if (r.state == transport::replica_state::serving) {
            r.state = transport::replica_state::draining;
            if (r.outstanding == 0) self->send(r.driver, stop_atom::value);
          }
          ++left;
        }
        reconcile(self);
        return left;
      },
      // A node that proved it holds the cluster's secret (the gatekeeper checked it), with its devices
      // (kind, memory) and its bound on hosted replicas. Answers why not ("" when it joined): node ids
      // are unique.
      [=](node_atom, const std::string& id, const caf::actor& node, std::int32_t max_replicas, const std::string& inventory) -> std::string {
        auto& st = self->state;
        if (id.empty() || id.size() > 128) return "a node id holds 1 to 128 bytes";
        auto m = transport::decode(inventory);
        if (!m || !std::holds_alternative<transport::inventory>(*m) || std::get<transport::inventory>(*m).nodes.size() != 1)
          return "a node declares its devices as one node's Inventory";
        const auto& devices = std::get<transport::inventory>(*m).nodes.front().devices;
        if (devices.empty() || devices.size() > 1024) return "a node declares 1 to 1024 devices";
        if (node_by_id(st, id)) {
          spdlog::warn("event=join_refused node={} reason=id_taken", id);
          return "node id '" + id + "' is taken by a node that is still joined";
        }
        self->monitor(node);
        node_rec n;
        n.id = id;
        n.actor = node;
        n.devices = devices;
        n.max_replicas = std::max(0, max_replicas);
        n.ready = true;
        n.adopting = true;  // until its running replicas are known: reconciliation takes them back first
        std::string devs;
        for (const auto& d : n.devices) devs += (devs.empty() ? "" : ",") + std::string(transport::name(d.kind)) + ":" + d.name + "=" + std::to_string(d.memory_bytes);
        st.nodes.push_back(std::move(n));
        spdlog::info("event=node_joined node={} devices={} max_replicas={} nodes={}", id, devs, max_replicas, st.nodes.size());
        // The registry answers in order: past this ping, the deployments restored from the journal are
        // resolved, so the replicas the node still runs can be matched to them.
        auto ready = [self, id] {
          if (auto* n = node_by_id(self->state, id)) n->adopting = false;
          reconcile(self);
        };
        self->request(st.registry, request_timeout, ping_atom::value)
            .then(
                [=](ping_atom) {
                  self->request(caf::actor_cast<node_actor_t>(node), std::chrono::seconds(5), held_atom::value)
                      .then(
                          [=](const std::vector<caf::actor>& drivers, const std::vector<std::string>& deploys) {
                            adopt_replicas(self, id, drivers, deploys);
                            ready();
                          },
                          [=](caf::error&) { ready(); });
                },
                [=](caf::error&) { ready(); });
        return {};
      },
      // The rendezvous of collective groups (Gloo's addresses, NCCL's unique id): set once, read by
      // everyone. Replies with why not, or an empty string.
      [=](kv_set_atom, const std::string& key, const std::string& value) -> std::string {
        auto& st = self->state;
        if (key.empty() || key.size() > rendezvous_max_key) return "a rendezvous key holds 1 to " + std::to_string(rendezvous_max_key) + " bytes";
        if (value.size() > rendezvous_max_value)
          return "a rendezvous value holds at most " + std::to_string(rendezvous_max_value) + " bytes, got " + std::to_string(value.size());
        if (st.rendezvous.contains(key)) return "rendezvous key '" + key + "' is set already (use a fresh prefix per group)";
        if (st.rendezvous_bytes + key.size() + value.size() > rendezvous_max_bytes)
          return "the rendezvous store is full (" + std::to_string(rendezvous_max_bytes) + " bytes)";
        st.rendezvous_bytes += key.size() + value.size();
        st.rendezvous.emplace(key, value);
        return {};
      },
      [=](kv_get_atom, const std::string& key) -> caf::result<bool, std::string> {
        const auto& st = self->state;
        const auto it = st.rendezvous.find(key);
        if (it == st.rendezvous.end()) return {false, std::string()};
        return {true, it->second};
      },
      [=](status_atom) { return transport::encode(status_of(self->state)); },
      [=](replicas_atom) {
        std::vector<caf::actor> v;
        for (const auto& [id, r] : self->state.replicas)
          if (r.driver && r.state != transport::replica_state::preparing) v.push_back(caf::actor_cast<caf::actor>(r.driver));
        return v;
      },
      // A LoRA adapter loaded into (path given) or unloaded from every serving replica of a deployment;
      // the deployment's list follows, so routing, /v1/models and later replicas see it.
      [=](adapter_atom, const std::string& model, const std::string& name, const std::string& path) -> caf::result<std::string> {
        auto& st = self->state;
        std::string why;
        const auto* found = deployment_for(st, model, why);
        if (!found) return why;
        const std::string dep_name = found->spec.model;
        if (name.empty() || name.find_first_of(":=,") != std::string::npos) return "an adapter name is non-empty, without ':', '=' or ','";
        const bool has = serves_adapter(*found, name);
        if (path.empty() && !has) return "deployment '" + dep_name + "' has no adapter '" + name + "'";
        if (!path.empty() && has) return "deployment '" + dep_name + "' has an adapter '" + name + "' already";
        std::vector<driver_actor_t> drivers;
        for (const auto& [id, r] : st.replicas)
          if (r.model == dep_name && r.state == transport::replica_state::serving && r.driver) drivers.push_back(r.driver);
        if (drivers.empty()) return "no replica of '" + dep_name + "' serves right now";
        auto rp = self->make_response_promise<std::string>();
        auto pending = std::make_shared<std::size_t>(drivers.size());
        auto first = std::make_shared<std::string>();
        auto answered = [=](const std::string& e) mutable {
          if (!e.empty() && first->empty()) *first = e;
          if (--*pending > 0) return;
          if (first->empty()) {
            auto it = self->state.deployments.find(dep_name);
            if (it != self->state.deployments.end()) {
              auto& list = it->second.spec.load.adapters;
              if (path.empty()) std::erase_if(list, [&](const std::string& a) { return std::string_view(a).substr(0, a.find('=')) == name; });
              else list.push_back(name + "=" + path);
            }
          }
          rp.deliver(*first);
        };
        for (auto& d : drivers)
          self->request(d, request_timeout, adapter_atom::value, name, path)
              .then([=](const std::string& e) mutable { answered(e); },
                    [=](caf::error& e) mutable { answered("a replica did not answer: " + self->system().render(e)); });
        return rp;
      },
      [=](stats_atom) {
        transport::stats s;
        s.running = static_cast<std::int64_t>(self->state.jobs.size());
        s.jobs_refused = self->state.refused;
        return transport::encode(s);
      },
      [](ping_atom) { return ping_atom::value; },
  };
}

}  // namespace coord

coordinator_actor spawn_coordinator(caf::actor_system& sys, const registry_actor& registry, const caf::actor& node, std::int64_t max_outstanding,
                                    std::int64_t max_per_replica, std::string journal, std::chrono::milliseconds progress_timeout) {
  return sys.spawn(coord::coordinator, registry, node, max_outstanding, max_per_replica, std::move(journal), progress_timeout);
}

}  // namespace troupe::actors
