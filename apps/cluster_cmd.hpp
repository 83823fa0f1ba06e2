#pragma once
#include "apps/speculation_flags.hpp"
// The cluster's command line: troupe coordinator, node, deploy, submit, status.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace troupe::app {

struct cluster_cmd_options {
  std::string cluster_file; // TOML: [cluster] coordinator, secret_file, heartbeat, TLS; [[node]]; [[deployment]]
  std::string address;      // HOST:PORT (--listen, --join or --coordinator)
  std::string secret_file;
  std::string port_file;    // coordinator: where to write the bound port
  std::string state_dir;    // coordinator: where the deployments' desired state is kept across restarts
  int progress_timeout_ms = 60000;  // coordinator: a replica silent to its progress probe this long is hung
  std::string node_id;
  std::string devices = "cpu:0";
  int threads = 1;
  int max_replicas = 0;     // node: executors its device may host (0: no bound)
  std::string device_memory;  // node: "16GiB", "512MiB" or bytes; empty: no bound
  int heartbeat_ms = 500;
  int timeout_ms = 1500;
  std::string tls_cert, tls_key, tls_ca;  // mutual TLS on the cluster's links
  bool insecure = false;    // plain links, allowed only when the address is loopback
  // deploy
  std::string model;
  int replicas = 1;
  std::int64_t max_rows = 16;
  std::int64_t capacity = 0;  // 0: the model's positions, at most 2048
  bool progress = false;
  int pipeline_parallel = 1;  // deploy: stages per replica, on one node
  bool across_nodes = false;  // deploy: each pipeline stage on a node of its own
  std::string plan;           // deploy: latency | capacity | throughput: the planner's goal
  std::string name;           // deploy: the served name (default: the checkpoint's stem); submit: the model
  std::string collective_host;  // node: where its cross-node collectives listen (empty: toward the coordinator)
  std::string kv_type = "f16";  // deploy: the KV cache's element type (model::with_kv_type)
  std::string mmproj;            // deploy: a vision tower beside a GGUF --model (docs/vision.md)
  int expert_parallel = 1;  // deploy: ranks per replica holding whole experts (sets tensor_parallel)
  speculation_flags speculation;  // deploy: the replicas' draft policy (--draft-model: a path every node can read)
  int tensor_parallel = 1;  // deploy: ranks per replica, on one node    // deploy: draw the replicas' preparation as a progress bar on stderr
  // top
  int interval_ms = 500;
  double duration_s = 0;    // 0: until interrupted (or, with until_idle, until no job is left)
  bool until_idle = false;
  // submit
  std::string prompt;
  std::vector<std::int32_t> prompt_ids;
  bool has_prompt_ids = false;
  std::int64_t max_tokens = 16;
  double temperature = 0.0;
  std::uint64_t seed = 0;
  bool json = false;
  bool ignore_eos = false;  // generate max_tokens even past the model's end of text
  // collectives: one rank of a group that meets through the coordinator's rendezvous
  std::string group = "check";
  int rank = 0;
  int size = 2;
  std::int64_t floats = 1 << 20;
  int rounds = 5;
  // gateway
  std::string listen = "127.0.0.1:8000";
  std::string api_key_file;
};

int run_coordinator_cmd(const cluster_cmd_options& o);
int run_node_cmd(const cluster_cmd_options& o);
int run_deploy_cmd(const cluster_cmd_options& o);
int run_submit_cmd(const cluster_cmd_options& o);
int run_status_cmd(const cluster_cmd_options& o);
int run_gateway_cmd(const cluster_cmd_options& o);
int run_scale_cmd(const cluster_cmd_options& o);
int run_top_cmd(const cluster_cmd_options& o);
int run_collectives_cmd(const cluster_cmd_options& o);
// troupe certs init|issue: the cluster's CA and its processes' certificates (cluster/certs.hpp).
int run_certs_cmd(const std::string& action, const std::string& dir, const std::string& name, int days);

// "16GiB", "512MiB", "2000000" -> bytes; nullopt when it is none of those.
std::optional<std::uint64_t> parse_bytes(const std::string& t);

}  // namespace troupe::app
