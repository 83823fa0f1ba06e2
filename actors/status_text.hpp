#pragma once
// The cluster's status (transport::cluster_status, the coordinator's typed answer) as people and
// scripts read it: `troupe status` prints the table, `troupe status --json` the JSON.
#include <string>

#include "transport/messages.hpp"

namespace troupe::actors {

// {"nodes": [{id, state, devices: [{name, kind, memory_bytes}], replicas, committed_bytes}],
//  "devices": [{node, name, kind, memory_bytes}]  (every node's devices, flat: what the planner takes),
//  "replicas": [{id, model, node, nodes, devices, state, outstanding, draining, tensor_parallel,
//                pipeline_parallel, prepare_done, prepare_total}],
//  "preparing": [the replicas still preparing, with done and total],
//  "deployments": [{name, path, family, desired, serving}], "jobs", "refused"}
std::string status_json(const transport::cluster_status& s);
std::string status_table(const transport::cluster_status& s);

}  // namespace troupe::actors
