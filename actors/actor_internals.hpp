#pragma once
// Shared by the actors' sources only (CAF inside; no other folder includes it): the
// atoms of the actor protocol, the actors a process starts, and the set of client actors a cluster
// handle opened.
#include <caf/all.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "actors/cluster.hpp"
#include "actors/protocol.hpp"
#include "engine/driver/driver.hpp"
#include "transport/messages.hpp"

namespace troupe::exec::cpu {
class cpu_executor;
}
namespace troupe::transport {
class rendezvous_store;
}

namespace troupe::actors {

// An encoded transport::error: what every role answers a refused message or job with.
std::string error_bytes(std::uint64_t job, transport::error_code code, std::string message, transport::retry r = transport::retry::failed);

// The coordinator's key-value store seen from a process holding its handle (the rendezvous of
// collective groups).
std::shared_ptr<transport::rendezvous_store> coordinator_rendezvous(caf::actor_system& sys, const coordinator_actor& coordinator);

// A stage before the last of a cross-node replica (stage load.world_rank of load.pipeline_parallel):
// its load.tensor_parallel ranks spawned by `node` as detached rank actors over their parts of `model`
// (joined by an in-process group), in rank order, or why not.
result<std::vector<caf::actor>, std::string> spawn_stage(caf::local_actor* node, const std::shared_ptr<const families::model_handle>& model,
                                                         const transport::load_request& load, const coordinator_actor& coordinator, int threads,
                                                         const std::string& host);

// The last stage of a cross-node replica, which drives the others (`ranks`: the remote stages' rank
// actors, stage by stage): its rank 0's part,
// its executor, the remote ranks for driver_options::other_ranks and the connect step for
// driver_options::connect; `keep` holds what they point into.
struct cross_node_head {
  std::shared_ptr<const families::model_handle> part;
  std::shared_ptr<exec::cpu::cpu_executor> executor;
  std::vector<driver::tp_rank> other_ranks;
  std::function<result<void, std::string>()> connect;
  std::shared_ptr<void> keep;
};
result<cross_node_head, std::string> make_cross_node_head(caf::actor_system& sys, const std::shared_ptr<const families::model_handle>& model,
                                                         const transport::load_request& load, const coordinator_actor& coordinator,
                                                         const std::vector<caf::actor>& ranks, int threads, const std::string& host);

registry_actor spawn_registry(caf::actor_system& sys);
executor_actor_t::behavior_type executor_actor(executor_actor_t::pointer self, std::shared_ptr<exec::executor> ex, std::string device);

// A replica's driver actor (detached: it computes on its own thread), spawned by `parent` (a node)
// which monitors it: a driver that fails to prepare or dies takes nothing else with it.
struct driver_spawn {
  std::shared_ptr<const families::model_handle> handle;
  std::shared_ptr<exec::executor> executor;
  driver::driver_options options;
  std::int64_t max_jobs = 256;
  caf::actor coordinator;
  std::string model;
  std::uint64_t replica_id = 0;
  std::shared_ptr<void> keep;  // what the driver's other ranks point into
};
caf::actor spawn_driver(caf::local_actor* parent, driver_spawn args);
// `node`: a node in this process that joins at once (local_cluster), or none (nodes join through the
// gatekeeper).
// `journal`: where the deployments' desired state is kept across restarts (written on every change,
// fsynced; read at start); empty: not kept.
// `progress_timeout`: a serving replica whose driver does not answer the coordinator's progress probe
// within this (a step that never returns: a deadlocked collective, a stuck device) is declared hung,
// taken out of routing, its jobs resumed elsewhere and a replacement placed.
coordinator_actor spawn_coordinator(caf::actor_system& sys, const registry_actor& registry, const caf::actor& node, std::int64_t max_outstanding,
                                    std::int64_t max_per_replica, std::string journal = {},
                                    std::chrono::milliseconds progress_timeout = std::chrono::seconds(60));
// `collective_host`: the address the node's cross-node collectives listen on; `cuda_devices`: its
// replicas run on these GPUs (a tensor-parallel replica over several of them, joined by NCCL).
node_actor_t spawn_node(caf::actor_system& sys, int executor_threads, std::int64_t max_per_replica, std::uint64_t device_memory,
                      std::string collective_host = "127.0.0.1", std::vector<int> cuda_devices = {});

// The local address a socket toward host:port would leave from ("127.0.0.1" when it cannot tell).
std::string local_address_toward(const std::string& host, int port);

// The coordinator's status (decoded), and the served names with a serving replica.
result<transport::cluster_status, std::string> cluster_status_of(caf::actor_system& sys, const coordinator_actor& coordinator);
std::vector<std::string> served_models(caf::actor_system& sys, const coordinator_actor& coordinator);

// Every live replica's figures: the coordinator names the drivers, each driver answers for itself.
std::vector<transport::stats> collect_replica_stats(caf::actor_system& sys, const coordinator_actor& coordinator);

// The client actors a cluster handle (local_cluster, session) opened: each facade's actor, and their
// shutdown with the handle.
class client_set {
 public:
  std::unique_ptr<client> open(caf::actor_system& sys, const coordinator_actor& coordinator);
  void close_all();
  void rehome(const coordinator_actor& coordinator);  // every open client submits to `coordinator` from now on
  caf::actor newest() const;  // the last one opened, if it still runs

 private:
  std::vector<std::weak_ptr<client_state>> clients_;
};

}  // namespace troupe::actors
