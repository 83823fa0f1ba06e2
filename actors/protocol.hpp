#pragma once
// The actor protocol of troupe: the atoms that name each message and what every role takes and
// answers. Payloads that may cross a process are transport envelopes (Cap'n Proto bytes in a
// std::string, transport/codec.hpp); actor handles travel beside them. Only <caf/atom.hpp> here, so
// the protocol can be read (and included) without CAF's whole API.
//
// coordinator (coordinator_actor.cpp)
//   deploy(bytes Deploy)                       -> bytes: Deploy (as placed, with its served name) | Error
//   scale(bytes Scale)                         -> bytes: Scale | Error
//   submit(bytes JobSubmit, client)            -> (job id, bytes Error if refused, served model name)
//   cancel(bytes CancelJob)
//   done(job id)                               from drivers: a job ended
//   progress(replica id, done, total)          from drivers: how far prepare() has come
//   register(replica id, driver, why)          from drivers: prepared (why empty) or not
//   node(id, node, max replicas, bytes Inventory)  from the gatekeeper: a node proved the secret, with its
//                                              devices -> why not ("" ok; ids are unique)
//   drain(node)                                -> replicas of the node still running
//   status()                                   -> bytes ClusterStatus
//   replicas()                                 -> the serving drivers
//   stats()                                    -> bytes Stats
//   kvset(key, value) -> why not; kvget(key) -> (found, value)   the collectives' rendezvous
//   reconcile()                                its own tick: toward every deployment's desired state
// registry (registry_actor.cpp)
//   resolve(path)                              -> bytes ResolvedModel
// node (node_actor.cpp)
//   deploy(bytes Deploy, coordinator)          -> (driver, why): a replica (or the last stage of one)
//   deploy(bytes Deploy, coordinator, ranks)   -> (driver, why): the last stage over remote stages' ranks
//   rank(bytes Deploy, coordinator)            -> (rank actors, why): a stage before the last
//   stats()                                    -> bytes NodeHello (its devices)
// driver (driver_actor.cpp)
//   submit(bytes JobSubmit, client); cancel(job id); stats() -> bytes Stats; stop()
// executor (executor_actor.cpp)
//   stats()                                    -> (device, bytes held)
// client (client_actor.cpp)
//   submit(bytes JobSubmit)                    -> (job id, bytes Error if refused)
//   chunk(bytes TokenChunk | Error); cancel(job id)
// rank (rank_actor.cpp): rjoin, rload, radd, rstep (a stage of a cross-node pipeline)
// Every role answers ping() -> ping.
#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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
using progress_atom = caf::atom_constant<caf::atom("progress")>;
using kv_set_atom = caf::atom_constant<caf::atom("kvset")>;
using kv_get_atom = caf::atom_constant<caf::atom("kvget")>;
using reconcile_atom = caf::atom_constant<caf::atom("reconcile")>;
using held_atom = caf::atom_constant<caf::atom("held")>;    // node: the replicas it still runs (a rejoin)
using adopt_atom = caf::atom_constant<caf::atom("adopt")>;  // driver: serve a (restarted) coordinator under a new id
using adapter_atom = caf::atom_constant<caf::atom("adapter")>;  // load (a path) or unload (no path) a LoRA adapter

// A replica whose pipeline stages are on different nodes (rank_actor.cpp).
using rank_atom = caf::atom_constant<caf::atom("rank")>;          // node: spawn a stage's rank actor
using rank_connect_atom = caf::atom_constant<caf::atom("rjoin")>;  // rank: join the replica's pipe
using rank_load_atom = caf::atom_constant<caf::atom("rload")>;     // rank: load its part's weights
using rank_add_atom = caf::atom_constant<caf::atom("radd")>;       // rank: compile an entry (an encoded EntryKey)
using rank_step_atom = caf::atom_constant<caf::atom("rstep")>;     // rank: run a step (an encoded step_batch)

// ---- every role's interface: what it takes and what it answers ------------------------------------------
// Handles of another process travel as caf::actor (what CAF's middleman carries); inside a process the
// typed handles below are what the roles are spawned as, so a message a role does not take, or an answer
// of the wrong type, does not compile.

using envelope = std::string;  // an encoded transport envelope (transport/codec.hpp)

using registry_actor = caf::typed_actor<caf::replies_to<resolve_atom, std::string>::with<envelope>,  // a ResolvedModel
                                        caf::replies_to<ping_atom>::with<ping_atom>>;

using executor_actor_t = caf::typed_actor<caf::replies_to<stats_atom>::with<std::string, std::int64_t>,  // (device, bytes held)
                                          caf::replies_to<ping_atom>::with<ping_atom>>;

using coordinator_actor = caf::typed_actor<
    caf::replies_to<deploy_atom, envelope>::with<envelope>,                                  // Deploy -> Deploy | Error
    caf::replies_to<scale_atom, envelope>::with<envelope>,                                   // Scale -> Scale | Error
    caf::replies_to<submit_atom, envelope, caf::actor>::with<std::uint64_t, envelope, std::string>,  // (job id, Error, model)
    caf::reacts_to<cancel_atom, envelope>,                                                // CancelJob
    caf::reacts_to<done_atom, std::uint64_t>,                                          // a driver: a job ended
    caf::reacts_to<progress_atom, std::uint64_t, std::int64_t, std::int64_t>,          // a driver: prepare's progress
    caf::reacts_to<register_atom, std::uint64_t, caf::actor, std::string>,             // a driver: prepared, or why not
    caf::replies_to<node_atom, std::string, caf::actor, std::int32_t, envelope>::with<std::string>,  // a node's join -> why not
    caf::replies_to<drain_atom, caf::actor>::with<std::int32_t>,                       // replicas of the node still running
    caf::replies_to<kv_set_atom, std::string, std::string>::with<std::string>,         // why not ("" when set)
    caf::replies_to<kv_get_atom, std::string>::with<bool, std::string>,
    caf::replies_to<status_atom>::with<envelope>,                                         // a ClusterStatus
    caf::replies_to<replicas_atom>::with<std::vector<caf::actor>>,                     // the serving drivers
    caf::replies_to<adapter_atom, std::string, std::string, std::string>::with<std::string>,  // (model, name, path) -> why not
    caf::replies_to<stats_atom>::with<envelope>,                                          // Stats
    caf::reacts_to<reconcile_atom>,                                                    // its own tick
    caf::replies_to<ping_atom>::with<ping_atom>>;

using node_actor_t = caf::typed_actor<
    caf::replies_to<deploy_atom, envelope, caf::actor>::with<caf::actor, std::string>,                           // (driver, why not)
    caf::replies_to<deploy_atom, envelope, caf::actor, std::vector<caf::actor>>::with<caf::actor, std::string>,  // the last stage
    caf::replies_to<rank_atom, envelope, caf::actor>::with<std::vector<caf::actor>, std::string>,                // a stage's ranks
    caf::replies_to<stats_atom>::with<envelope>,                                                                 // NodeHello
    caf::replies_to<held_atom>::with<std::vector<caf::actor>, std::vector<envelope>>,  // drivers, their Deploys
    caf::replies_to<ping_atom>::with<ping_atom>>;

using driver_actor_t = caf::typed_actor<caf::reacts_to<submit_atom, envelope, caf::actor>,  // JobSubmit, its client
                                        caf::reacts_to<cancel_atom, std::uint64_t>,
                                        caf::reacts_to<tick_atom>,                        // its own scheduling round
                                        caf::replies_to<stats_atom>::with<envelope>,         // Stats
                                        caf::reacts_to<stop_atom>,                        // drained: quit
                                        caf::reacts_to<adopt_atom, caf::actor, std::uint64_t>,  // a coordinator, the new replica id
                                        caf::replies_to<adapter_atom, std::string, std::string>::with<std::string>,  // (name, path) -> why not
                                        caf::replies_to<ping_atom>::with<ping_atom>>;

using client_actor_t = caf::typed_actor<caf::replies_to<submit_atom, envelope>::with<std::uint64_t, envelope>,  // (job id, Error)
                                        caf::reacts_to<chunk_atom, envelope>,                                // TokenChunk | Error
                                        caf::reacts_to<cancel_atom, std::uint64_t>,
                                        caf::reacts_to<tick_atom, std::uint64_t, envelope, int>,             // a resumption retrying
                                        caf::reacts_to<adopt_atom, caf::actor>,                               // the coordinator is back
                                        caf::replies_to<ping_atom>::with<ping_atom>>;

using rank_actor_t = caf::typed_actor<caf::replies_to<rank_connect_atom>::with<std::string>,  // why not ("" joined)
                                      caf::replies_to<rank_load_atom>::with<std::string>,
                                      caf::replies_to<rank_add_atom, envelope>::with<std::string>,   // EntryKey
                                      caf::replies_to<rank_step_atom, envelope>::with<std::string>,  // StepBatch
                                      caf::replies_to<ping_atom>::with<ping_atom>>;

// The coordinator's rendezvous store (transport::rendezvous_store through a session): bounds on what
// one cluster may keep there, so a client cannot grow the coordinator without limit.
inline constexpr std::size_t rendezvous_max_key = 512;
inline constexpr std::size_t rendezvous_max_value = 1 << 20;
inline constexpr std::size_t rendezvous_max_bytes = 64u << 20;

inline constexpr auto request_timeout = std::chrono::seconds(600);
// How often the coordinator reconciles without an event to prompt it.
inline constexpr auto reconcile_interval = std::chrono::milliseconds(1000);
// A node that refused to prepare a deployment's replica is not asked again for this long.
inline constexpr auto refusal_backoff = std::chrono::seconds(30);

}  // namespace troupe::actors
