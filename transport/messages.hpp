#pragma once
// The domain form of every message that may cross a process (transport/schema/troupe.capnp is the wire
// form). Plain values: no Cap'n Proto or CAF here, so actors and tests include this cheaply. The codec
// (transport/codec.hpp) is the one place that converts between the two.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "engine/core/dtype.hpp"

namespace troupe::transport {

inline constexpr std::uint32_t protocol_version = 2;

struct sampling {
  float temperature = 0.0f;
  std::int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::int32_t top_logprobs = 0;
  std::uint64_t seed = 0;
  std::vector<std::pair<std::int32_t, float>> logit_bias;
  friend bool operator==(const sampling&, const sampling&) = default;
};

// Where an image goes in a prompt's text (llama.cpp's default media marker); the replica puts its
// vision tower's begin token there.
inline constexpr std::string_view media_marker = "<__media__>";

struct chat_message {
  std::string role;
  std::string content;
  friend bool operator==(const chat_message&, const chat_message&) = default;
};

struct request_input {
  std::string name;
  troupe::dtype dtype = troupe::dtype::f32;
  std::vector<std::int64_t> shape;
  std::string data;
  std::vector<std::int64_t> positions;
  friend bool operator==(const request_input&, const request_input&) = default;
};

// A constrained output (engine/guide/spec.hpp's kinds, in its order; the driver compiles it).
enum class guide_kind : std::uint8_t { none, json_object, json_schema, regex, grammar, choice };
inline constexpr auto last_guide_kind = guide_kind::choice;
struct guide {
  guide_kind kind = guide_kind::none;
  std::string text;  // the schema, pattern, GBNF, or a JSON array of choices
  friend bool operator==(const guide&, const guide&) = default;
};

// Exactly one prompt form.
using prompt = std::variant<std::string, std::vector<std::int32_t>, std::vector<chat_message>>;

struct job_submit {
  std::uint64_t job_id = 0;
  std::string model;
  transport::prompt prompt;
  transport::sampling sampling;
  std::vector<std::string> stop;
  std::vector<std::int32_t> stop_ids;
  std::int64_t max_tokens = 16;  // 0: what the replica's capacity leaves after the prompt
  bool ignore_eos = false;
  std::vector<request_input> inputs;
  std::int32_t priority = 0;
  std::int64_t deadline_ms = 0;
  std::string tools_json;
  std::vector<std::int32_t> prior_output;
  transport::guide guide;
  bool embed = false;  // the prompt's embedding (the encode program, pooled as the model declares)
  bool no_speculation = false;  // decode without the replica's draft policy
  std::int32_t beams = 0;       // > 1: a beam search of that width (driver.hpp: seq_request::beams)
  float length_penalty = 1.0f;
  bool early_stopping = false;
  std::string adapter;  // a LoRA adapter the replica has loaded (load_request::adapters), by name
  // Encoded images (PNG, JPEG, ...), one per media marker ("<__media__>") of the prompt, in order.
  std::vector<std::string> images;
  friend bool operator==(const job_submit&, const job_submit&) = default;
};

struct top_logprob {
  std::int32_t token = 0;
  float logprob = 0.0f;
  friend bool operator==(const top_logprob&, const top_logprob&) = default;
};

struct token_logprob {
  std::int32_t token = 0;
  float logprob = 0.0f;
  std::vector<top_logprob> top;
  friend bool operator==(const token_logprob&, const token_logprob&) = default;
};

struct usage {
  std::int64_t prompt_tokens = 0;
  std::int64_t completion_tokens = 0;
  std::int64_t cached_tokens = 0;
  friend bool operator==(const usage&, const usage&) = default;
};

// How a job ended (running: it has not); engine/driver's reasons and the deadline.
enum class finish_reason : std::uint8_t { running, eos, stop_string, length, capacity, cancelled, deadline, pool_exhausted, error };
inline constexpr auto last_finish_reason = finish_reason::error;
std::string_view name(finish_reason r);  // "" for running
std::optional<finish_reason> finish_reason_named(std::string_view name);

// One hypothesis of a beam search job, with its job's finish (best first).
struct beam {
  std::vector<std::int32_t> ids;
  std::string text;
  double logprob = 0, score = 0;
  transport::finish_reason finish_reason = finish_reason::length;
  friend bool operator==(const beam&, const beam&) = default;
};

struct token_chunk {
  std::uint64_t job_id = 0;
  std::vector<std::int32_t> ids;
  std::string text;
  std::vector<token_logprob> logprobs;
  transport::finish_reason finish_reason = finish_reason::running;
  transport::usage usage;
  std::uint64_t replica = 0;  // the replica that produced it (0: not said)
  std::vector<float> embedding;  // an embed job's vector, with its finish
  std::vector<transport::beam> beams;  // a beam search job's hypotheses, with its finish, best first
  friend bool operator==(const token_chunk&, const token_chunk&) = default;
};

struct cancel_job {
  std::uint64_t job_id = 0;
  friend bool operator==(const cancel_job&, const cancel_job&) = default;
};

enum class retry : std::uint8_t { failed, overloaded, disconnected, unimplemented };

// Why a message, a job or a cluster operation was refused: the union of the layers' codes (in the
// schema's order, transport/schema/troupe.capnp ErrorCode).
enum class error_code : std::uint8_t {
  internal,             // a fault of troupe's own
  bad_message,          // bytes that do not decode (transport/codec.hpp)
  invalid_request,      // a request no replica could ever run (bad prompt form, inputs, ...)
  unknown_model,        // no deployment serves the named model (or several do and none was named)
  overloaded,           // a bound on jobs is reached; retry later or elsewhere
  disconnected,         // the peer serving it went away; the job may be resumed
  cancelled,
  unimplemented,        // a message kind the receiver does not know
  no_replica,           // the model is deployed but no replica of it serves now (one is being replaced)
  busy,                 // a deploy or scale of the same deployment is in progress
  name_taken,           // the served name belongs to another checkpoint
  no_room,              // no node has the devices, memory or replica bound for one more replica
  prepare_failed,       // a replica's driver could not prepare (the node and the reason named)
  no_nodes,             // no node has joined
  // the driver's (engine/driver/driver.hpp driver_error_code, by name)
  bad_options, entry_limit, byte_limit, bad_request, bad_input, incompatible, unsupported_feature, no_head, too_long,
  pool_too_small, unknown_sequence, program_not_offered, step_failed,
  unauthenticated,      // a join whose proof does not match the cluster's secret (or a used nonce)
};
inline constexpr auto last_error_code = error_code::unauthenticated;
std::string_view name(error_code c);
// The code of a name (a driver code's name included); nullopt when there is none.
std::optional<error_code> error_code_named(std::string_view name);
struct error;
// "code: message", for people.
std::string describe(const error& e);

struct error {
  std::uint64_t job_id = 0;
  error_code code = error_code::internal;
  std::string message;
  transport::retry retry = retry::failed;
  friend bool operator==(const error&, const error&) = default;
};

struct sample_row {
  std::uint64_t sequence = 0;
  std::uint64_t draw = 0;
  transport::sampling sampling;
  bool want_logits = false;
  friend bool operator==(const sample_row&, const sample_row&) = default;
};

// An entry's key as a remote rank compiles it (engine/driver's entry_key without the head, which is not
// part of the graph a rank runs). actors/rank_actor.cpp converts and validates.
enum class program_kind : std::uint8_t { step, encode };
enum class kv_layout : std::uint8_t { contiguous, paged };
enum class logit_rows : std::uint8_t { last, all };
struct entry_key {
  program_kind program = program_kind::step;
  std::int64_t rows = 1, tokens = 1, capacity = 1;
  transport::kv_layout kv = kv_layout::paged;
  std::int64_t block_size = 0, pool_blocks = 0;
  transport::logit_rows logits = logit_rows::last;
  bool hidden_carry = false;
  std::vector<std::string> carried;
  std::int64_t state_rows = 0;  // rows of each recurrent state pool (0: the rows)
  friend bool operator==(const entry_key&, const entry_key&) = default;
};

struct step_batch {
  transport::entry_key entry;
  std::vector<std::int32_t> token_ids, positions, kv_write_map, kv_read_map;
  std::vector<sample_row> rows;
  friend bool operator==(const step_batch&, const step_batch&) = default;
};

struct load_request {
  std::string model;
  std::string device;
  std::string shard;
  std::int64_t max_rows = 0, capacity = 0, block_size = 0, pool_blocks = 0;  // 0: the driver's default
  std::int64_t prefill_chunk = 0, token_budget = 0;
  bool no_prefix_cache = false, no_preempt = false;
  std::int32_t tensor_parallel = 0;  // ranks of one replica on the node (docs/tensor-parallel.md); 0 or 1: one
  std::int32_t pipeline_parallel = 0;  // stages of one replica, each tensor_parallel ranks; 0 or 1: one
  bool across_nodes = false;           // each stage on a node of its own, its ranks meeting through the coordinator
  std::int32_t world_rank = 0;         // a remote rank's place in the replica (stage x tensor_parallel + rank)
  std::string group;                   // the replica's rendezvous prefix, fresh per replica
  std::uint64_t replica_id = 0;        // the coordinator's id of the replica this load starts
  bool expert_parallel = false;        // the tensor_parallel ranks hold whole experts (model::expert_parallel)
  // Speculative decoding (driver.hpp: speculation_options): "" none, "ngram" or "model" (draft_model,
  // a checkpoint path on the node, drafts on the replica's first executor); draft_tokens 0: the default.
  std::string speculative;
  std::string draft_model;
  std::int32_t draft_tokens = 0;
  // The KV cache's element type (f32, f16, bf16, q8_0; model::with_kv_type); "": the default, f16.
  std::string kv_type;
  // LoRA adapters every replica loads (docs/adapters.md): "name=path" of PEFT directories on the node,
  // how many are resident at once (0: all of them) and the largest rank (0: 16).
  std::vector<std::string> adapters;
  std::int32_t adapter_slots = 0;
  std::int32_t max_adapter_rank = 0;
  std::string mmproj;  // a vision tower: llama.cpp's mmproj GGUF on the node beside a GGUF model (docs/vision.md)
  friend bool operator==(const load_request&, const load_request&) = default;
};

enum class device_kind : std::uint8_t { cpu, cuda };
std::string_view name(device_kind k);

struct device {
  std::string name;
  device_kind kind = device_kind::cpu;
  std::uint64_t memory_bytes = 0;
  friend bool operator==(const device&, const device&) = default;
};

struct stats {
  std::int64_t queued = 0, running = 0, kv_blocks_used = 0, kv_blocks_total = 0;
  double tokens_per_second = 0;
  std::int64_t jobs_done = 0, jobs_refused = 0;
  std::int64_t prompt_tokens = 0, prefix_hit_tokens = 0;
  std::int64_t draft_tokens = 0, accepted_tokens = 0;  // speculative decoding: drafts verified, of which accepted
  friend bool operator==(const stats&, const stats&) = default;
};

struct node_hello {
  std::string node_id, host;
  std::uint16_t port = 0;
  std::vector<device> devices;
  friend bool operator==(const node_hello&, const node_hello&) = default;
};

struct node_inventory {
  std::string node_id;
  std::vector<device> devices;
  friend bool operator==(const node_inventory&, const node_inventory&) = default;
};

struct inventory {
  std::vector<node_inventory> nodes;
  friend bool operator==(const inventory&, const inventory&) = default;
};

struct deploy {
  std::string model;        // the served name; load.model is the checkpoint's path
  std::int32_t replicas = 1;  // the desired count
  load_request load;
  std::string goal;         // the planner's objective: latency (empty), capacity, throughput
  friend bool operator==(const deploy&, const deploy&) = default;
};

struct scale {
  std::string model;
  std::int32_t replicas = 1;
  friend bool operator==(const scale&, const scale&) = default;
};

// A checkpoint as the registry resolved it: the family and one replica's needs (placement's
// requirements); `error` non-empty: refused.
struct resolved_model {
  std::string path, family;
  std::uint64_t bytes = 0;
  std::int64_t max_positions = 0;
  std::int32_t layers = 0;
  std::uint64_t layer_bytes = 0, embedding_bytes = 0, head_bytes = 0, kv_bytes_per_token_per_layer = 0, scratch_bytes = 0;
  std::int32_t heads = 0, kv_heads = 0;
  bool plannable = false;
  std::string error;
  std::int32_t experts = 0;        // routed experts per layer (0: a dense model)
  std::uint64_t expert_bytes = 0;  // one routed expert's weights in one layer (part of layer_bytes)
  friend bool operator==(const resolved_model&, const resolved_model&) = default;
};

enum class replica_state : std::uint8_t { preparing, serving, draining, failed };
std::string_view name(replica_state s);

struct node_status {
  std::string id;
  std::vector<device> devices;
  std::string state;  // joining, ready, draining
  std::int32_t replicas = 0;
  std::uint64_t committed_bytes = 0;
  friend bool operator==(const node_status&, const node_status&) = default;
};

struct replica_status {
  std::uint64_t id = 0;
  std::string model;
  std::vector<std::string> nodes;    // stage nodes in pipeline order; the driver runs on the last
  std::vector<std::string> devices;
  replica_state state = replica_state::preparing;
  std::int64_t outstanding = 0, prepare_done = 0, prepare_total = 0;
  std::int32_t tensor_parallel = 1, pipeline_parallel = 1;
  friend bool operator==(const replica_status&, const replica_status&) = default;
};

struct deployment_status {
  std::string name, path;
  std::int32_t desired = 0, serving = 0;
  std::string family;
  // The KV cache each replica keeps: its element type, bytes per token (every layer), positions per
  // sequence, and the tokens its pool holds (so kv_tokens / capacity sequences of full length fit).
  std::string kv_type;
  std::int64_t kv_bytes_per_token = 0, capacity = 0, kv_tokens = 0;
  std::vector<std::string> adapters;  // the LoRA adapters its replicas load (served as NAME and SERVED:NAME)
  friend bool operator==(const deployment_status&, const deployment_status&) = default;
};

struct cluster_status {
  std::vector<node_status> nodes;
  std::vector<replica_status> replicas;
  std::vector<deployment_status> deployments;
  std::int64_t jobs = 0, refused = 0;
  friend bool operator==(const cluster_status&, const cluster_status&) = default;
};

using message = std::variant<job_submit, token_chunk, cancel_job, error, step_batch, entry_key, load_request, node_hello, inventory, deploy,
                             scale, stats, resolved_model, cluster_status>;

}  // namespace troupe::transport
