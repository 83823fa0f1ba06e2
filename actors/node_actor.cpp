// The node actor: one per process, for its devices. It spawns the executor and driver actors of the
// replicas the coordinator places here (and the rank actors of pipeline stages of replicas driven from
// another node), monitors them and never links to them: a replica that fails to prepare, or dies, is
// reported to the coordinator by its own messages and by the coordinator's monitor, and takes nothing
// else on the node with it. Admission (does the replica fit the device?) is the coordinator's, by the
// placement planner's memory model; the node loads what it is given.
#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <map>

#include "actors/actor_internals.hpp"
#include "actors/model_needs.hpp"
#include "engine/driver/cpu_replica.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "engine/exec/cuda/cuda_executor.hpp"
#include "families/model_handle.hpp"
#include "transport/codec.hpp"
#include "transport/collectives.hpp"

#include <future>

namespace troupe::actors {
namespace {

struct node_state {
  node_state() = default;  // not an aggregate (CAF would build it from the actor's pointer)
  int executor_threads = 1;
  std::int64_t max_per_replica = 256;
  std::uint64_t device_memory = 0;            // what its device declares; 0: no bound declared
  std::string collective_host = "127.0.0.1";  // where its cross-node collectives listen
  std::vector<int> cuda_devices;  // its replicas run on these GPUs (CUDA executors); empty: on the CPU
  std::map<std::string, std::shared_ptr<const families::model_handle>> handles;  // by checkpoint path
  std::shared_ptr<std::vector<caf::actor>> spawned = std::make_shared<std::vector<caf::actor>>();
  struct held_replica {
    caf::actor driver;
    std::string deploy;  // the Deploy it was started with
  };
  std::vector<held_replica> held;  // the replicas it runs, for a coordinator that takes them back
  static inline const char* name = "node";
};

using node_self = caf::stateful_actor<node_state, node_actor_t::base>;

// The deployment in `bytes`, or why not.
result<transport::deploy, std::string> deployment_of(const std::string& bytes) {
  auto m = transport::decode(bytes);
  if (!m) return unexpected(m.error().message());
  auto* d = std::get_if<transport::deploy>(&*m);
  if (!d) return unexpected(std::string("a node takes deployments, not ") + std::string(transport::kind(*m)));
  return *d;
}

// The node's handle of a checkpoint, loaded once and shared by its replicas.
result<std::shared_ptr<const families::model_handle>, std::string> handle_for(node_state& st, const transport::deploy& d) {
  const auto key = d.load.mmproj.empty() ? d.load.model : d.load.model + "\n" + d.load.mmproj;
  auto& h = st.handles[key];
  if (!h) {
    auto loaded = families::model_handle::load(d.load.model, families::registry::builtin(), d.load.mmproj);
    if (!loaded) {
      st.handles.erase(key);
      return unexpected(families::message(loaded.error()));
    }
    h = *loaded;
  }
  std::shared_ptr<const families::model_handle> out = h;
  if (d.load.expert_parallel) {  // shards of this handle hold whole experts; the loaded one stays shared
    auto ep = h->expert_parallel();
    if (!ep) return unexpected(families::message(ep.error()));
    out = *ep;
  }
  auto typed = families::with_kv_type(out, d.load.kv_type);  // the deployment's KV cache type (a new handle; the loaded one stays f32)
  if (!typed) return unexpected(families::message(typed.error()));
  return *typed;
}

// The replica's options with the draft model of its load request (speculative "model") loaded here.
result<driver::driver_options, std::string> options_for(node_state& st, const transport::load_request& l, std::int64_t max_positions) {
  auto o = replica_options(l, max_positions);
  if (o.speculation.kind != driver::draft_kind::model) return o;
  if (l.draft_model.empty()) return unexpected(std::string("speculative decoding with a draft model needs its checkpoint"));
  auto& h = st.handles[l.draft_model];
  if (!h) {
    auto loaded = families::model_handle::load(l.draft_model, families::registry::builtin());
    if (!loaded) {
      st.handles.erase(l.draft_model);
      return unexpected("draft model: " + families::message(loaded.error()));
    }
    h = *loaded;
  }
  auto typed = families::with_kv_type(h, l.kv_type);  // the draft's KV as the target's
  if (!typed) return unexpected("draft model: " + families::message(typed.error()));
  o.speculation.draft_model = *typed;
  return o;
}

void keep(node_self* self, const caf::actor& a) {
  self->monitor(a);
  self->state.spawned->push_back(a);
}

// A replica's actors on the node: the executor actor over the driver's executor and the driver (its
// own thread), both monitored; `hold` holds whatever the driver's other ranks point into.
caf::actor spawn_replica(node_self* self, std::shared_ptr<const families::model_handle> part, std::shared_ptr<exec::executor> ex,
                         const driver::driver_options& o, const caf::actor& coordinator, const transport::deploy& d,
                         std::shared_ptr<void> hold) {
  auto& st = self->state;
  const std::string device = d.load.device.empty() ? (st.cuda_devices.empty() ? "cpu:0" : "cuda:" + std::to_string(st.cuda_devices.front())) : d.load.device;
  auto dev = caf::actor_cast<caf::actor>(self->spawn(executor_actor, ex, device));
  auto drv = spawn_driver(self, {std::move(part), std::move(ex), o, st.max_per_replica, coordinator, d.model, d.load.replica_id, std::move(hold)});
  keep(self, dev);
  keep(self, drv);
  if (!d.load.across_nodes) st.held.push_back({drv, transport::encode(d)});  // a replica of this node alone can be taken back
  spdlog::info("event=replica_spawned replica={} model={} device={}", d.load.replica_id, d.model, device);
  return drv;
}

using node_answer = caf::result<caf::actor, std::string>;
node_answer refused(std::string why) { return {caf::actor{}, std::move(why)}; }

// The GPUs a replica runs on: the load's device names ("cuda:0,cuda:1", the coordinator's plan) or the
// node's first `tp`; each must be one of the node's.
result<std::vector<int>, std::string> cuda_devices_of(const node_state& st, const std::string& named, int tp) {
  std::vector<int> out;
  for (std::size_t at = 0; at < named.size();) {
    const auto comma = std::min(named.find(',', at), named.size());
    const std::string one = named.substr(at, comma - at);
    at = comma + 1;
    if (one.rfind("cuda:", 0) != 0) return unexpected("device '" + one + "' is not one of this node's GPUs");
    const int d = std::atoi(one.c_str() + 5);
    if (std::find(st.cuda_devices.begin(), st.cuda_devices.end(), d) == st.cuda_devices.end())
      return unexpected("device '" + one + "' is not one of this node's GPUs");
    out.push_back(d);
  }
  if (out.empty()) out.assign(st.cuda_devices.begin(), st.cuda_devices.begin() + std::min<std::ptrdiff_t>(tp, std::ssize(st.cuda_devices)));
  if (static_cast<int>(out.size()) != tp)
    return unexpected("a tensor-parallel split of " + std::to_string(tp) + " needs " + std::to_string(tp) + " GPUs, this node has " +
                      std::to_string(out.size()));
  return out;
}

// A replica split tensor-parallel over GPUs of this node: a part and a CUDA executor per GPU, the ranks
// joined by an NCCL group that meets through the coordinator's rendezvous store under `prefix`.
struct cuda_split {
  std::vector<std::shared_ptr<const families::model_handle>> parts;
  std::vector<std::unique_ptr<troupe::collective>> groups;
  std::vector<std::unique_ptr<exec::executor>> executors;
};

result<std::shared_ptr<cuda_split>, std::string> make_cuda_split(caf::actor_system& sys, const coordinator_actor& coordinator,
                                                                 const std::shared_ptr<const families::model_handle>& model,
                                                                 const std::vector<int>& devices, const std::string& prefix) {
  const int tp = static_cast<int>(devices.size());
  auto split = std::make_shared<cuda_split>();
  for (int t = 0; t < tp; ++t) {
    auto p = model->part(t, tp, 0, 1);
    if (!p) return unexpected("tensor parallel " + std::to_string(tp) + ": " + families::message(p.error()));
    split->parts.push_back(*p);
  }
  // Every rank joins at once (each blocks until all have).
  auto store = coordinator_rendezvous(sys, coordinator);
  std::vector<std::future<result<std::unique_ptr<transport::communicator>, transport::collective_error>>> joins;
  for (int t = 0; t < tp; ++t) {
    transport::nccl_options no;
    no.rank = t;
    no.size = tp;
    no.device = devices[static_cast<std::size_t>(t)];
    no.store = store;
    no.prefix = prefix + "/tp";
    joins.push_back(std::async(std::launch::async, [no] { return transport::connect_nccl(no); }));
  }
  std::string why;
  for (auto& j : joins) {
    auto c = j.get();
    if (!c) {
      if (why.empty()) why = "NCCL group: " + c.error().message();
      split->groups.emplace_back();
      continue;
    }
    split->groups.push_back(transport::as_collective(std::move(*c)));
  }
  if (!why.empty()) return unexpected(why);
  for (int t = 0; t < tp; ++t) {
    exec::cuda::cuda_options co;
    co.device = devices[static_cast<std::size_t>(t)];
    co.group = split->groups[static_cast<std::size_t>(t)].get();
    auto ex = exec::cuda::make_executor(co);
    if (!ex) return unexpected("cuda:" + std::to_string(co.device) + ": " + ex.error().message());
    split->executors.push_back(std::move(*ex));
  }
  return split;
}

// A whole replica (split tensor x pipeline over simulated devices of this node when asked).
node_answer deploy_here(node_self* self, const std::string& bytes, const caf::actor& coordinator) {
  auto& st = self->state;
  auto d = deployment_of(bytes);
  if (!d) return refused(d.error());
  auto handle = handle_for(st, *d);
  if (!handle) return refused(handle.error());
  const auto& h = *handle;
  const auto opts = options_for(st, d->load, h->model().config().max_positions);
  if (!opts) return refused(opts.error());
  const driver::driver_options& o = *opts;
  const int tp = std::max(1, d->load.tensor_parallel), pp = std::max(1, d->load.pipeline_parallel);
  if (!st.cuda_devices.empty()) {
    if (pp > 1) return refused("a GPU node splits a replica tensor-parallel over its GPUs (pipeline stages on GPUs are not built)");
    auto devices = cuda_devices_of(st, d->load.device, tp);
    if (!devices) return refused(devices.error());
    if (tp == 1) {
      exec::cuda::cuda_options co;
      co.device = devices->front();
      auto made = exec::cuda::make_executor(co);
      if (!made) return refused(made.error().message());
      return {spawn_replica(self, h, std::shared_ptr<exec::executor>(std::move(*made)), o, coordinator, *d, nullptr), std::string()};
    }
    auto split = make_cuda_split(self->system(), caf::actor_cast<coordinator_actor>(coordinator), h, *devices, d->load.group.empty() ? "replica-" + std::to_string(d->load.replica_id) : d->load.group);
    if (!split) return refused(split.error());
    driver::driver_options ro = o;
    for (std::size_t t = 1; t < (*split)->executors.size(); ++t) ro.other_ranks.push_back({(*split)->parts[t], (*split)->executors[t].get()});
    auto head = std::shared_ptr<exec::executor>(*split, (*split)->executors.front().get());
    return {spawn_replica(self, (*split)->parts.front(), head, ro, coordinator, *d, *split), std::string()};
  }
  auto made = driver::cpu_replica::make(h, tp, pp, st.executor_threads);
  if (!made) return refused(made.error());
  std::shared_ptr<driver::cpu_replica> replica(std::move(*made));
  driver::driver_options ro = o;
  replica->attach(ro);
  return {spawn_replica(self, replica->head(), std::shared_ptr<exec::executor>(replica, &replica->head_executor()), ro, coordinator, *d, replica),
          std::string()};
}

node_actor_t::behavior_type node_actor(node_self* self, int executor_threads, std::int64_t max_per_replica, std::uint64_t device_memory,
                         std::string collective_host, std::vector<int> cuda_devices) {
  auto& st = self->state;
  st.collective_host = std::move(collective_host);
  st.cuda_devices = std::move(cuda_devices);
  st.executor_threads = executor_threads;
  st.device_memory = device_memory;
  st.max_per_replica = max_per_replica;
  // What the node spawned goes with it (a node leaves or loses its coordinator).
  self->attach_functor([spawned = st.spawned](const caf::error&) {
    for (const auto& a : *spawned) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  });
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& v = *self->state.spawned;
    std::erase_if(v, [&](const caf::actor& a) { return a.address() == dm.source; });
    std::erase_if(self->state.held, [&](const auto& h) { return h.driver.address() == dm.source; });
    if (dm.reason) spdlog::info("event=replica_actor_down reason=\"{}\"", self->system().render(dm.reason));
  });
  return {
      // A stage before the last of a cross-node replica: a rank actor per rank over its part, for the
      // last stage's driver (rank_actor.cpp). Replies with the actors, or none and why not.
      [=](rank_atom, const std::string& bytes, const caf::actor& coordinator) -> caf::result<std::vector<caf::actor>, std::string> {
        auto& st = self->state;
        const std::vector<caf::actor> none;
        auto d = deployment_of(bytes);
        if (!d) return {none, d.error()};
        auto h = handle_for(st, *d);
        if (!h) return {none, h.error()};
        auto r = spawn_stage(self, *h, d->load, caf::actor_cast<coordinator_actor>(coordinator), st.executor_threads, st.collective_host);
        if (!r) return {none, r.error()};
        for (const auto& a : *r) keep(self, a);
        return {*r, std::string()};
      },
      // The last stage of a cross-node replica: the driver, over the rank actors of the other stages.
      [=](deploy_atom, const std::string& bytes, const caf::actor& coordinator, const std::vector<caf::actor>& ranks) -> node_answer {
        auto& st = self->state;
        auto d = deployment_of(bytes);
        if (!d) return refused(d.error());
        auto h = handle_for(st, *d);
        if (!h) return refused(h.error());
        auto head = make_cross_node_head(self->system(), *h, d->load, caf::actor_cast<coordinator_actor>(coordinator), ranks, st.executor_threads,
                                         st.collective_host);
        if (!head) return refused(head.error());
        auto opts = options_for(self->state, d->load, (*h)->model().config().max_positions);
        if (!opts) return refused(opts.error());
        driver::driver_options o = std::move(*opts);
        o.other_ranks = head->other_ranks;
        o.connect = head->connect;
        return {spawn_replica(self, head->part, head->executor, o, coordinator, *d, head->keep), std::string()};
      },
      [=](deploy_atom, const std::string& bytes, const caf::actor& coordinator) { return deploy_here(self, bytes, coordinator); },
      [=](stats_atom) {
        transport::node_hello h;
        h.host = self->state.collective_host;
        for (int d : self->state.cuda_devices) h.devices.push_back({"cuda:" + std::to_string(d), transport::device_kind::cuda, self->state.device_memory});
        if (self->state.cuda_devices.empty())
          h.devices.push_back({"cpu:0", transport::device_kind::cpu, self->state.device_memory});
        return transport::encode(h);
      },
      [=](held_atom) {
        std::vector<caf::actor> drivers;
        std::vector<std::string> deploys;
        for (const auto& h : self->state.held) drivers.push_back(h.driver), deploys.push_back(h.deploy);
        return caf::result<std::vector<caf::actor>, std::vector<std::string>>(std::move(drivers), std::move(deploys));
      },
      [](ping_atom) { return ping_atom::value; },
  };
}

}  // namespace

node_actor_t spawn_node(caf::actor_system& sys, int executor_threads, std::int64_t max_per_replica, std::uint64_t device_memory,
                      std::string collective_host, std::vector<int> cuda_devices) {
  return sys.spawn(node_actor, executor_threads, max_per_replica, device_memory, std::move(collective_host), std::move(cuda_devices));
}

}  // namespace troupe::actors
