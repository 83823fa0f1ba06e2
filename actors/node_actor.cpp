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

namespace troupe::actors {
namespace {

struct node_state {
  int executor_threads = 1;
  std::int64_t max_per_replica = 256;
  std::uint64_t device_memory = 0;            // what its device declares; 0: no bound declared
  std::string collective_host = "127.0.0.1";  // where its cross-node collectives listen
  int cuda_device = -1;  // >= 0: its replicas run on this GPU (the CUDA executor); else on the CPU
  std::map<std::string, std::shared_ptr<const families::model_handle>> handles;  // by checkpoint path
  std::shared_ptr<std::vector<caf::actor>> spawned = std::make_shared<std::vector<caf::actor>>();
  static inline const char* name = "node";
};

using node_actor_t = caf::stateful_actor<node_state>;

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
  auto& h = st.handles[d.load.model];
  if (!h) {
    auto loaded = families::model_handle::load(d.load.model, families::registry::builtin());
    if (!loaded) {
      st.handles.erase(d.load.model);
      return unexpected(families::message(loaded.error()));
    }
    h = *loaded;
  }
  return h;
}

void keep(node_actor_t* self, const caf::actor& a) {
  self->monitor(a);
  self->state.spawned->push_back(a);
}

// A replica's actors on the node: the executor actor over the driver's executor and the driver (its
// own thread), both monitored; `hold` holds whatever the driver's other ranks point into.
caf::actor spawn_replica(node_actor_t* self, std::shared_ptr<const families::model_handle> part, std::shared_ptr<exec::executor> ex,
                         const driver::driver_options& o, const caf::actor& coordinator, const transport::deploy& d,
                         std::shared_ptr<void> hold) {
  auto& st = self->state;
  const std::string device = st.cuda_device >= 0 ? "cuda:" + std::to_string(st.cuda_device) : "cpu:0";
  auto dev = self->spawn(executor_actor, ex, device);
  auto drv = spawn_driver(self, {std::move(part), std::move(ex), o, st.max_per_replica, coordinator, d.model, d.load.replica_id, std::move(hold)});
  keep(self, dev);
  keep(self, drv);
  spdlog::info("event=replica_spawned replica={} model={} device={}", d.load.replica_id, d.model, device);
  return drv;
}

caf::message refused(std::string why) { return caf::make_message(caf::actor{}, std::move(why)); }

// A whole replica (split tensor x pipeline over simulated devices of this node when asked).
caf::message deploy_here(node_actor_t* self, const std::string& bytes, const caf::actor& coordinator) {
  auto& st = self->state;
  auto d = deployment_of(bytes);
  if (!d) return refused(d.error());
  auto handle = handle_for(st, *d);
  if (!handle) return refused(handle.error());
  const auto& h = *handle;
  const driver::driver_options o = replica_options(d->load, h->model().config().max_positions);
  const int tp = std::max(1, d->load.tensor_parallel), pp = std::max(1, d->load.pipeline_parallel);
  if (st.cuda_device >= 0) {
    if (tp > 1 || pp > 1) return refused("a GPU node serves whole replicas (tensor and pipeline parallel run on cpu nodes)");
    exec::cuda::cuda_options co;
    co.device = st.cuda_device;
    auto made = exec::cuda::make_executor(co);
    if (!made) return refused(made.error().message());
    return caf::make_message(spawn_replica(self, h, std::shared_ptr<exec::executor>(std::move(*made)), o, coordinator, *d, nullptr), std::string());
  }
  auto made = driver::cpu_replica::make(h, tp, pp, st.executor_threads);
  if (!made) return refused(made.error());
  std::shared_ptr<driver::cpu_replica> replica(std::move(*made));
  driver::driver_options ro = o;
  replica->attach(ro);
  return caf::make_message(
      spawn_replica(self, replica->head(), std::shared_ptr<exec::executor>(replica, &replica->head_executor()), ro, coordinator, *d, replica),
      std::string());
}

caf::behavior node_actor(node_actor_t* self, int executor_threads, std::int64_t max_per_replica, std::uint64_t device_memory,
                         std::string collective_host, int cuda_device) {
  auto& st = self->state;
  st.collective_host = std::move(collective_host);
  st.cuda_device = cuda_device;
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
    if (dm.reason) spdlog::info("event=replica_actor_down reason=\"{}\"", self->system().render(dm.reason));
  });
  return {
      // A stage before the last of a cross-node replica: a rank actor per rank over its part, for the
      // last stage's driver (rank_actor.cpp). Replies with the actors, or none and why not.
      [=](rank_atom, const std::string& bytes, const caf::actor& coordinator) -> caf::message {
        auto& st = self->state;
        const std::vector<caf::actor> none;
        auto d = deployment_of(bytes);
        if (!d) return caf::make_message(none, d.error());
        auto h = handle_for(st, *d);
        if (!h) return caf::make_message(none, h.error());
        auto r = spawn_stage(self, *h, d->load, coordinator, st.executor_threads, st.collective_host);
        if (!r) return caf::make_message(none, r.error());
        for (const auto& a : *r) keep(self, a);
        return caf::make_message(*r, std::string());
      },
      // The last stage of a cross-node replica: the driver, over the rank actors of the other stages.
      [=](deploy_atom, const std::string& bytes, const caf::actor& coordinator, const std::vector<caf::actor>& ranks) -> caf::message {
        auto& st = self->state;
        auto d = deployment_of(bytes);
        if (!d) return refused(d.error());
        auto h = handle_for(st, *d);
        if (!h) return refused(h.error());
        auto head = make_cross_node_head(self->system(), *h, d->load, coordinator, ranks, st.executor_threads, st.collective_host);
        if (!head) return refused(head.error());
        driver::driver_options o = replica_options(d->load, (*h)->model().config().max_positions);
        o.other_ranks = head->other_ranks;
        o.connect = head->connect;
        return caf::make_message(spawn_replica(self, head->part, head->executor, o, coordinator, *d, head->keep), std::string());
      },
      [=](deploy_atom, const std::string& bytes, const caf::actor& coordinator) { return deploy_here(self, bytes, coordinator); },
      [=](stats_atom) {
        transport::node_hello h;
        h.host = self->state.collective_host;
        if (self->state.cuda_device >= 0)
          h.devices.push_back({"cuda:" + std::to_string(self->state.cuda_device), "cuda", self->state.device_memory});
        else
          h.devices.push_back({"cpu:0", "cpu", self->state.device_memory});
        return transport::encode(h);
      },
      [](ping_atom) { return ping_atom::value; },
  };
}

}  // namespace

caf::actor spawn_node(caf::actor_system& sys, int executor_threads, std::int64_t max_per_replica, std::uint64_t device_memory,
                      std::string collective_host, int cuda_device) {
  return sys.spawn(node_actor, executor_threads, max_per_replica, device_memory, std::move(collective_host), cuda_device);
}

}  // namespace troupe::actors
