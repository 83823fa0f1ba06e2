#pragma once
// The cluster across processes (CAF's middleman over TCP): a coordinator process, node processes that
// join it, and sessions (clients, `troupe deploy`, `troupe status`) that connect to it. A peer gets the
// coordinator's handle only after an HMAC-SHA256 challenge-response over the cluster's secret: the
// coordinator publishes a gatekeeper, which hands out a fresh nonce and checks
// HMAC(secret, nonce | role | id) before it answers with the coordinator. Links are plain TCP unless
// mutual TLS is configured (tls_options; docs/cluster.md).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "actors/cluster.hpp"
#include "transport/messages.hpp"
#include "engine/core/result.hpp"

namespace troupe::transport {
class rendezvous_store;  // transport/collectives.hpp
}

namespace troupe::actors {

// Reads a secret file (its bytes, without a trailing newline); refuses one shorter than 16 bytes.
result<std::string, std::string> read_secret(const std::filesystem::path& file);
// HMAC-SHA256 as lowercase hex.
std::string hmac_sha256_hex(const std::string& key, const std::string& message);

struct heartbeat_options {
  int interval_ms = 500;   // middleman heartbeats
  int timeout_ms = 1500;   // a peer silent this long is lost
};

// Mutual TLS on the links (CAF's OpenSSL module, Debian's libcaf-openssl): every process of the
// cluster gets a certificate and key signed by the cluster's CA and the CA file; a peer without a
// certificate the CA signed cannot connect. Off when `certificate` is empty.
struct tls_options {
  std::string certificate;  // PEM
  std::string key;          // PEM
  std::string ca_file;      // PEM of the CA that signs every peer
  bool enabled() const { return !certificate.empty(); }
};

struct coordinator_process_options {
  std::string host = "127.0.0.1";
  int port = 0;                          // 0: any free port
  std::string secret;
  std::filesystem::path port_file;       // where the bound port is written (optional)
  std::int64_t max_outstanding = 1024;
  std::int64_t max_per_replica = 256;
  heartbeat_options heartbeat;
  tls_options tls;
  std::filesystem::path state_dir;       // the deployments' desired state is kept here across restarts; empty: not kept
  int progress_timeout_ms = 60000;       // a serving replica silent to the progress probe this long is hung
};
// Runs until SIGINT or SIGTERM. Returns the process exit code.
int run_coordinator(const coordinator_process_options& o);

struct node_process_options {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string secret;
  std::string node_id;                   // empty: node-<pid>
  int executor_threads = 1;
  std::int64_t max_per_replica = 256;
  int drain_timeout_s = 60;              // on SIGTERM: how long running jobs may take to finish
  std::int32_t max_replicas = 0;         // executors (replicas) its device may host; 0: no bound
  std::uint64_t device_memory = 0;       // bytes its (simulated) device offers; a deployment that would
                                         // pass it is refused; 0: no bound
  heartbeat_options heartbeat;
  tls_options tls;
  // The address this node's collectives (the Gloo pipes of stages across nodes) listen on; empty: the
  // local address that routes toward the coordinator.
  std::string collective_host;
  std::vector<int> cuda_devices;  // replicas run on these GPUs (--devices cuda:N[,cuda:M...]); empty: the CPU
};
// Joins the coordinator and serves until SIGINT/SIGTERM, then drains (its replicas take no new job and
// finish the running ones, up to drain_timeout_s) and exits; when the link to the coordinator is lost
// it keeps its replicas and joins again (the coordinator it joins takes them back or stops them). Exit code 3 when the coordinator refuses the join, 1 when it
// cannot be reached at first.
int run_node(const node_process_options& o);

// Why a join (of a node or a session) did not happen, and whether trying again can help.
enum class join_error_code : std::uint8_t {
  unreachable,   // no coordinator answered at the address (retry: it may be starting)
  no_challenge,  // the gatekeeper gave no nonce in time (retry)
  refused,       // the proof did not match the cluster's secret, or the nonce was used (never retry)
  id_taken,      // another joined node has this node id (retry only as a rejoin: the old link may be dying)
  bad_answer,    // the gatekeeper's answer did not decode
};
std::string_view name(join_error_code c);

struct join_error {
  join_error_code code = join_error_code::unreachable;
  std::string reason;
  bool retryable() const { return code == join_error_code::unreachable || code == join_error_code::no_challenge; }
  std::string message() const { return std::string(name(code)) + ": " + reason; }
};

inline std::string describe(const join_error& e) { return e.message(); }

// A refusal by the cluster (deploy, scale, status): the typed code, the retry disposition and a message
// that names what was refused and why (the node, for a replica that could not prepare).
using cluster_error = transport::error;

struct session_state;

// A deployment as `troupe deploy` asks for it.
struct deploy_request {
  std::filesystem::path model;      // a checkpoint every node can read
  std::string name;                 // the served name; empty: the checkpoint's stem
  std::int32_t replicas = 1;        // the desired count (a second identical deploy leaves it)
  driver::driver_options options;
  std::int32_t tensor_parallel = 0;  // 0: the coordinator's planner decides the split
  std::int32_t pipeline_parallel = 0;
  bool across_nodes = false;
  bool expert_parallel = false;     // the tensor_parallel ranks hold whole experts (model::expert_parallel)
  std::string kv_type;              // the KV cache's element type (f32, f16, bf16, q8_0); "": f16
  std::filesystem::path mmproj;     // a vision tower beside a GGUF model (llama.cpp's mmproj), readable by every node; empty: none
  std::string goal;                 // the planner's objective: latency (empty), capacity, throughput
};

// A connection to a running coordinator: clients, deployments and status.
class session final : public serving_backend {
 public:
  static result<std::unique_ptr<session>, join_error> connect(const std::string& host, int port, const std::string& secret,
                                                               heartbeat_options heartbeat = {}, tls_options tls = {});
  ~session();
  std::unique_ptr<client> client_session();
  std::unique_ptr<client> connect() override;
  std::vector<transport::stats> replica_stats() override;
  // The deployed model's name (the first replica's, or what this session deployed).
  std::string model_name() const override;
  // Deploys `model` (a path every node can read) on `replicas` replicas spread over the nodes; returns
  // the model's name once every replica is prepared.
  // tensor_parallel x pipeline_parallel > 1: each replica is that many executors on one node, each over
  // its part (docs/tensor-parallel.md); with across_nodes each pipeline stage takes a node of its own.
  result<std::string, cluster_error> deploy(const std::filesystem::path& model, std::int32_t replicas, const driver::driver_options& options,
                                          std::int32_t tensor_parallel = 0, std::int32_t pipeline_parallel = 0, bool across_nodes = false);
  // The same with every field; a refusal names the node that refused and why.
  result<std::string, cluster_error> deploy(const deploy_request& request);
  // Sets a deployed model's replica count: new replicas are placed and prepared before they take
  // traffic (returns once they serve); removed ones drain (no new jobs, stop after their last).
  result<std::string, cluster_error> scale(const std::string& model, std::int32_t replicas);
  // Nodes, replicas, deployments and load: typed, and as JSON text (actors/status_text.hpp).
  result<transport::cluster_status, cluster_error> cluster_status();
  result<std::string, cluster_error> status();
  std::vector<std::string> models() override;
  bool healthy() override;  // false once the coordinator's link is lost
  // The coordinator's key-value store, for the rendezvous of collective groups whose ranks are in
  // different processes or on different machines (transport::gloo_options::store,
  // nccl_options::store). It must not outlive this session.
  std::shared_ptr<transport::rendezvous_store> rendezvous_store();

 private:
  explicit session(std::unique_ptr<session_state> s);
  std::unique_ptr<session_state> s_;
};

}  // namespace troupe::actors
