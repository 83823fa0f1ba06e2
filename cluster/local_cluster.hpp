#pragma once
// The cluster in one process: an actor system with the coordinator, the registry and one node, the
// model deployed through the coordinator exactly as on a multi-process cluster (troupe serve, the
// gateway and actor tests run on it). Plain C++: CAF stays in the sources.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "actors/cluster.hpp"
#include "engine/core/result.hpp"
#include "engine/driver/driver.hpp"

namespace troupe::actors {

struct cluster_options {
  std::int32_t replicas = 2;               // driver replicas of the model (each with its own executor)
  std::string name;                        // the served name; empty: the checkpoint's stem
  driver::driver_options driver;           // each replica's driver
  int executor_threads = 1;                // compute threads per CPU executor
  std::int32_t tensor_parallel = 1;        // ranks (executors) per stage of a replica, docs/tensor-parallel.md
  std::int32_t pipeline_parallel = 1;      // stages per replica, each over a range of the layers
  bool expert_parallel = false;            // the tensor_parallel ranks hold whole experts (model::expert_parallel)
  std::string kv_type;                     // the KV cache's element type (f32, f16, bf16, q8_0); "": f16
  std::string mmproj;                      // a vision tower beside a GGUF model (llama.cpp's mmproj); "": none
  // LoRA adapters every replica loads, "name=path" (docs/adapters.md); requests name them as model
  // "name" or "served:name". Slots resident at once (0: all) and the largest rank (0: 16).
  std::vector<std::string> adapters;
  std::int32_t adapter_slots = 0;
  std::int32_t max_adapter_rank = 0;
  std::int64_t max_outstanding = 1024;     // jobs admitted cluster-wide and not finished; more: overloaded
  std::int64_t max_per_replica = 256;      // jobs one replica may hold (queued or running)
  int scheduler_threads = 2;               // CAF's worker threads (drivers run on their own threads)
};

struct cluster_state;

class local_cluster final : public serving_backend {
 public:
  // Starts the actor system, the coordinator, the registry and a node, deploys `model` on `replicas`
  // driver replicas and returns once every replica is prepared (or why not).
  static result<std::unique_ptr<local_cluster>, std::string> start(const std::filesystem::path& model, const cluster_options& options);
  ~local_cluster();

  std::unique_ptr<client> connect() override;
  // Cluster-wide and per-replica figures (queue, running, KV blocks, jobs done and refused).
  transport::stats stats();
  std::vector<transport::stats> replica_stats() override;
  std::string model_name() const override { return name(); }
  std::vector<std::string> models() override;
  std::string adapter(const std::string& model, const std::string& name, const std::string& path) override;
  // The coordinator's view: nodes, replicas and deployments (with each one's KV cache type and size).
  result<transport::cluster_status, std::string> cluster_status();
  // Resolves a checkpoint through the registry actor without loading its tensors.
  result<std::string, std::string> resolve(const std::filesystem::path& model);
  // The model name jobs should use.
  const std::string& name() const;

  // For tests: delivers raw bytes, as a peer would, to an actor ("coordinator", "registry", "node",
  // "driver", "client") and returns whether it still answers a stats or ping request afterwards.
  bool poke(const std::string& actor, const std::string& bytes);

 private:
  explicit local_cluster(std::unique_ptr<cluster_state> s);
  std::unique_ptr<cluster_state> s_;
};

}  // namespace troupe::actors
