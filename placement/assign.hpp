#pragma once
// Where the coordinator puts one more replica of a deployment, given the nodes as they are now: a
// pure function over values (no actor, no I/O), so the coordinator's reconciliation is tested without a
// cluster. Policy, in order:
//   1. anti-affinity: nodes hosting fewer replicas of this deployment first, then fewer replicas of any
//      deployment, then the order the nodes joined; a node at its --max-replicas bound is skipped;
//   2. a whole replica on one node when one holds it (the planner's memory model on that node's free
//      device memory, tensor-parallel over its devices when the goal asks for it);
//   3. otherwise the planner over every node with room: pipeline stages across nodes;
//   4. otherwise a refusal naming what is short.
// The KV pool a replica gets is what it asked for, or less when the devices hold less (at least one
// sequence's capacity), as vLLM sizes its KV cache from what the weights leave.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/result.hpp"
#include "placement/planner.hpp"

namespace troupe::placement {

struct node_view {
  std::string id;
  std::vector<device> devices;     // memory_bytes: what is free now (declared minus committed); see unbounded
  bool unbounded = false;          // the node declared no device memory: no memory check
  std::int32_t hosted = 0;         // replicas it hosts (every deployment)
  std::int32_t hosted_same = 0;    // replicas of the deployment being placed
  std::int32_t max_replicas = 0;   // 0: no bound
  bool excluded = false;           // not eligible now (draining, refused this deployment recently)
};

struct replica_request {
  std::optional<requirements> needs;       // unknown: placed without a memory check
  std::int64_t want_kv_tokens = 0;         // the pool the deployment asks for (max_rows x capacity)
  std::int64_t min_kv_tokens = 0;          // at least this (one sequence's capacity)
  objective goal = objective::latency;
  // An explicit split (deploy --tensor-parallel / --pipeline-parallel / --across-nodes): honoured as
  // given instead of planned.
  std::int32_t tensor_parallel = 0;        // 0: planned
  std::int32_t pipeline_parallel = 0;      // 0: planned
  bool across_nodes = false;
  bool expert_parallel = false;            // the tensor-parallel ranks hold whole experts (planner's policy)
};

// One stage's node and what it commits there (bytes per device name).
struct stage_assignment {
  std::size_t node = 0;                                     // index into the views
  std::vector<std::pair<std::string, std::uint64_t>> bytes;  // device name -> bytes committed
};

struct assignment {
  std::vector<stage_assignment> stages;  // one: the whole replica on one node (split locally by tp x pp)
  std::int32_t tensor_parallel = 1;
  std::int32_t pipeline_parallel = 1;
  bool across_nodes = false;             // each stage on a node of its own
  std::int64_t kv_tokens = 0;            // the pool it gets (<= want_kv_tokens)
  std::string description;
};

struct assign_error {
  std::string reason;
};

result<assignment, assign_error> assign_replica(const std::vector<node_view>& nodes, const replica_request& request);

// Bytes one device of a single-stage, single-rank replica commits: scratch + weights + KV for `tokens`.
std::uint64_t whole_replica_bytes(const requirements& r, std::int64_t tokens);

}  // namespace troupe::placement
