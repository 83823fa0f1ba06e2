#pragma once
// The coordinator's state (coordinator_actor.cpp, coordinator_deploy.cpp): membership, the devices each
// node declared and what is committed on them, every deployment's desired state, the replicas as they
// are, the deploy and scale operations in flight, and the jobs routed. CAF inside: only the
// coordinator's sources include it.
#include <caf/all.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "actors/actor_internals.hpp"
#include "transport/messages.hpp"

namespace troupe::actors::coord {

struct node_rec {
  std::string id;
  caf::actor actor;
  std::vector<transport::device> devices;        // as declared (memory 0: none declared)
  std::int32_t max_replicas = 0;                 // 0: no bound
  bool ready = false;                            // its devices are declared: placement may use it
  bool draining = false;                         // leaving: nothing new is placed on it
  bool adopting = false;                         // joined; what it still runs is not known yet (held_atom)
  std::map<std::string, std::uint64_t> committed;  // device name -> bytes placed there
};

struct commit {
  std::string node, device;
  std::uint64_t bytes = 0;
};

struct replica_rec {
  std::uint64_t id = 0;
  std::string model;                    // the deployment's served name
  std::vector<std::string> nodes;       // its stages' nodes in pipeline order (the driver on the last)
  std::vector<std::string> devices;
  std::vector<commit> commits;          // device memory it holds, released when it goes
  driver_actor_t driver;                // known once its node answered
  std::vector<caf::actor> ranks;        // the remote stages' rank actors (stopped with the replica)
  transport::replica_state state = transport::replica_state::preparing;
  std::int64_t outstanding = 0, prepare_done = 0, prepare_total = 0;
  std::int32_t tensor_parallel = 1, pipeline_parallel = 1;
  std::uint64_t op = 0;                 // the deploy or scale waiting for it; 0: a replacement
  bool probing = false;                 // a progress probe is out
};

struct deployment_rec {
  transport::deploy spec;               // served name, desired count, load template, goal
  transport::resolved_model resolved;   // family and needs (the registry's answer)
  std::map<std::string, caf::actor_clock::time_point> refused_by;  // node -> when it refused (the actor's clock)
  std::string blocked;                  // why reconciliation last could not place (logged once)
};

struct operation {
  std::uint64_t id = 0;
  std::string model;
  std::string kind;                     // "deploy" or "scale"
  caf::typed_response_promise<std::string> rp;
  std::int32_t previous = -1;           // the desired count before; -1: the deployment is new
  std::set<std::uint64_t> waiting;      // replicas not yet serving
  std::vector<std::uint64_t> started;   // every replica it started
};

struct job_route {
  std::uint64_t replica = 0;
  client_actor_t client;
};

struct state {
  // Not an aggregate: CAF builds a state from the actor's pointer when it can (C++20 would let the
  // pointer initialise the first member).
  state() = default;
  registry_actor registry;
  std::vector<node_rec> nodes;                        // in join order
  std::map<std::uint64_t, replica_rec> replicas;      // by id (creation order)
  std::map<std::string, deployment_rec> deployments;  // by served name
  std::map<std::uint64_t, operation> ops;
  std::unordered_map<std::uint64_t, job_route> jobs;
  std::uint64_t next_job = 1, next_replica = 1, next_op = 1, next_group = 0;
  std::int64_t max_outstanding = 1024, max_per_replica = 256;
  std::int64_t refused = 0;
  std::string journal;  // the deployments' desired state on disk ("": not kept)
  // A coordinator restarted from its journal gives its nodes this long to come back (and be taken
  // back from) before it places anything new.
  caf::actor_clock::time_point grace_until{};
  std::chrono::milliseconds progress_timeout{60000};  // a driver silent this long to a probe is hung
  std::int64_t hung = 0;                               // replicas declared hung so far
  std::map<std::string, std::string> rendezvous;  // the groups' rendezvous keys (kv_set_atom, kv_get_atom)
  std::size_t rendezvous_bytes = 0;
  static inline const char* name = "coordinator";
};

using actor_t = caf::stateful_actor<state, coordinator_actor::base>;

node_rec* node_by_id(state& st, const std::string& id);
node_rec* node_by_actor(state& st, const caf::actor_addr& a);
std::string node_of(const state& st, const caf::actor& a);  // the id of the node an actor runs on ("" if none)

// Deployments (coordinator_deploy.cpp).
caf::typed_response_promise<std::string> handle_deploy(actor_t* self, const std::string& bytes);
caf::typed_response_promise<std::string> handle_scale(actor_t* self, const std::string& bytes);
void handle_register(actor_t* self, std::uint64_t replica, const caf::actor& driver, const std::string& why);
void reconcile(actor_t* self);
// Forward progress (every reconcile tick): each serving replica's driver is asked for its stats; one
// that does not answer within progress_timeout is stuck in a step and is lost like a dead one.
void probe_progress(actor_t* self);
// A (re)joined node's running replicas: each one a deployment still wants is taken over as it is (its
// driver serves this coordinator under a new id, nothing reloads); the others are stopped.
void adopt_replicas(actor_t* self, const std::string& node_id, const std::vector<caf::actor>& drivers, const std::vector<std::string>& deploys);
// The deployments of the journal, resolved again and reconciled toward (a restarted coordinator).
void restore(actor_t* self);
// A replica is gone (its driver or a node of it lost, or it failed to prepare): its jobs are told to
// resume elsewhere, its memory released, the operation waiting for it failed.
void lose_replica(actor_t* self, std::uint64_t replica, const std::string& why, bool failed);
void stop_replica(actor_t* self, replica_rec& r);
transport::cluster_status status_of(const state& st);
// The journal (coordinator_journal.cpp): every deployment's spec, written whole on each change.
void save_journal(const state& st);
std::vector<transport::deploy> load_journal(const std::string& path);

}  // namespace troupe::actors::coord
