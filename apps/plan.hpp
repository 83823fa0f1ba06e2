#pragma once
// troupe plan: where a model fits. The model's memory needs are read from the checkpoint (its weights
// by layer, embedding and head, KV bytes per token, attention heads); the inventory is given on the
// command line; the placement planner (placement/planner.hpp) picks replicas, pipeline stages and
// tensor-parallel groups, or says by how much the model does not fit.
#include <cstdint>

#include "engine/core/result.hpp"
#include "transport/messages.hpp"
#include <string>
#include <vector>

namespace troupe::app {

struct plan_options {
  std::string model;                // empty: the embedded model
  std::vector<std::string> nodes;   // "ID=KIND:MEMORY[*COUNT][,KIND:MEMORY[*COUNT]...]", e.g. "a=cuda:80GiB*8"
  std::string goal = "latency";     // latency | capacity | throughput
  int max_tensor_parallel = 0;      // 0: no bound
  int replicas = 0;                 // 0: the goal's default
  std::int64_t min_kv_tokens = 1;
  bool expert_parallel = false;     // a routed model's tensor-parallel ranks hold whole experts
  std::string kv_type = "f16";      // the KV cache's element type the deployment would use (docs/kv-cache.md)
  bool json = false;
};

int run_plan(const plan_options& o);

// The split `troupe deploy --plan GOAL` deploys: the planner's plan for `model` on the devices a running
// cluster's status reports (each node's --device-memory), or why there is none.
struct planned_split {
  int replicas = 1;
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  bool across_nodes = false;
  std::string description;  // placement::describe
};
// `kv_type` is the deployment's KV cache type (f16 when empty), which sizes the KV per token.
result<planned_split, std::string> plan_on_cluster(const std::string& model, const transport::cluster_status& status, const std::string& goal,
                                                   const std::string& kv_type = "");

}  // namespace troupe::app
