#pragma once
// Shared by actors.cpp, remote.cpp and ranks.cpp only (CAF inside; no other folder includes it): the
// atoms of the actor protocol, the actors a process starts, and the set of client actors a cluster
// handle opened.
#include <caf/all.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "actors/cluster.hpp"
#include "engine/driver/driver.hpp"
#include "transport/messages.hpp"

namespace troupe::exec::cpu {
class cpu_executor;
}
namespace troupe::transport {
class rendezvous_store;
}

namespace troupe::actors {

using submit_atom = caf::atom_constant<caf::atom("submit")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using chunk_atom = caf::atom_constant<caf::atom("chunk")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using register_atom = caf::atom_constant<caf::atom("register")>;
using deploy_atom = caf::atom_constant<caf::atom("deploy")>;
using resolve_atom = caf::atom_constant<caf::atom("resolve")>;
using ping_atom = caf::atom_constant<caf::atom("ping")>;
using replicas_atom = caf::atom_constant<caf::atom("replicas")>;
using node_atom = caf::atom_constant<caf::atom("node")>;
using status_atom = caf::atom_constant<caf::atom("status")>;
using join_atom = caf::atom_constant<caf::atom("join")>;
using scale_atom = caf::atom_constant<caf::atom("scale")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using drain_atom = caf::atom_constant<caf::atom("drain")>;
using capacity_atom = caf::atom_constant<caf::atom("capacity")>;
using progress_atom = caf::atom_constant<caf::atom("progress")>;
using kv_set_atom = caf::atom_constant<caf::atom("kvset")>;
using kv_get_atom = caf::atom_constant<caf::atom("kvget")>;

// The coordinator's rendezvous store (transport::rendezvous_store through a session): bounds on what
// one cluster may keep there, so a client cannot grow the coordinator without limit.
inline constexpr std::size_t rendezvous_max_key = 512;
inline constexpr std::size_t rendezvous_max_value = 1 << 20;
inline constexpr std::size_t rendezvous_max_bytes = 64u << 20;

// A replica whose pipeline stages are on different nodes (ranks.cpp).
using rank_atom = caf::atom_constant<caf::atom("rank")>;          // node: spawn a stage's rank actor
using rank_connect_atom = caf::atom_constant<caf::atom("rjoin")>;  // rank: join the replica's pipe
using rank_load_atom = caf::atom_constant<caf::atom("rload")>;     // rank: load its part's weights
using rank_add_atom = caf::atom_constant<caf::atom("radd")>;       // rank: compile an entry (entry_wire text)
using rank_step_atom = caf::atom_constant<caf::atom("rstep")>;     // rank: run a step (an encoded step_batch)

inline constexpr auto request_timeout = std::chrono::seconds(600);

// The coordinator's key-value store seen from a process holding its handle (the rendezvous of
// collective groups).
std::shared_ptr<transport::rendezvous_store> coordinator_rendezvous(caf::actor_system& sys, const caf::actor& coordinator);

// A stage before the last of a cross-node replica (stage load.world_rank of load.pipeline_parallel):
// its load.tensor_parallel ranks spawned by `node` as detached rank actors over their parts of `model`
// (joined by an in-process group), in rank order, or why not.
result<std::vector<caf::actor>, std::string> spawn_stage(caf::event_based_actor* node, const std::shared_ptr<const families::model_handle>& model,
                                                         const transport::load_request& load, const caf::actor& coordinator, int threads,
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
                                                         const transport::load_request& load, const caf::actor& coordinator,
                                                         const std::vector<caf::actor>& ranks, int threads, const std::string& host);

caf::actor spawn_registry(caf::actor_system& sys);
caf::actor spawn_coordinator(caf::actor_system& sys, const caf::actor& registry, const caf::actor& node, std::int64_t max_outstanding,
                             std::int64_t max_per_replica);
// `collective_host`: the address the node's cross-node collectives listen on; `cuda_device` >= 0: its
// replicas run on that GPU.
caf::actor spawn_node(caf::actor_system& sys, int executor_threads, std::int64_t max_per_replica, std::uint64_t device_memory,
                      std::string collective_host = "127.0.0.1", int cuda_device = -1);

// The local address a socket toward host:port would leave from ("127.0.0.1" when it cannot tell).
std::string local_address_toward(const std::string& host, int port);

// Every live replica's figures: the coordinator names the drivers, each driver answers for itself.
std::vector<transport::stats> collect_replica_stats(caf::actor_system& sys, const caf::actor& coordinator);

// The client actors a cluster handle (local_cluster, session) opened: each facade's actor, and their
// shutdown with the handle.
class client_set {
 public:
  std::unique_ptr<client> open(caf::actor_system& sys, const caf::actor& coordinator);
  void close_all();
  caf::actor newest() const;  // the last one opened, if it still runs

 private:
  std::vector<std::weak_ptr<client_state>> clients_;
};

}  // namespace troupe::actors
