#pragma once
// The placement planner: given a cluster's inventory (nodes and their devices) and what a model needs
// (bytes per layer, embedding and head, KV bytes per token, scratch), it returns a plan: replicas, each
// a list of pipeline stages, each a tensor-parallel group of devices on one node holding a contiguous
// range of layers, with the KV capacity in tokens every replica gets. A pure function over values: it
// opens no device and talks to no actor; refusals are typed `placement_error` values, never throws.
//
// The memory rules, per device of a stage with `tp` ranks holding `l` layers:
//   weights  = l * layer_bytes_per_rank + ceil(embedding_bytes / tp) on the first stage
//                                         + ceil(head_bytes / tp) on the last stage
//              (layer_bytes_per_rank: ceil(layer_bytes / tp), or with expert parallelism the non-expert
//              share plus ceil(experts / tp) whole experts; layers are split across the ranks, the
//              embedding and head by vocabulary; the K/V
//              projections that replicated KV heads duplicate are not counted, a small underestimate)
//   KV/token = l * ceil(kv_bytes_per_token_per_layer * ceil(kv_heads / tp) / kv_heads)
//              (each rank holds its share of the KV heads; with fewer KV heads than ranks every rank
//              holds one, replicated, so the share is ceil(kv_heads / tp) heads)
//   used     = scratch_bytes + weights + KV/token * tokens  <=  the device's memory
// A replica's KV capacity is the most tokens every one of its devices can hold under that rule (the
// smallest device of a stage bounds the stage: its ranks hold equal shards).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/result.hpp"

namespace troupe::placement {

// ---- inventory --------------------------------------------------------------------------------------

// Kinds of device, fastest first: a plan uses the first kind on which the model fits.
enum class device_kind : std::uint8_t { cuda, cpu };
std::string_view name(device_kind k);

struct device {
  std::string name;                // "cuda:0", "cpu:0"; unique within its node
  device_kind kind = device_kind::cpu;
  std::uint64_t memory_bytes = 0;  // what placement may fill (weights, scratch, KV)
};

struct node {
  std::string id;                // unique within the inventory
  std::vector<device> devices;
};

struct inventory {
  std::vector<node> nodes;
};

// A device by position: inventory.nodes[node].devices[device].
struct device_ref {
  std::size_t node = 0;
  std::size_t device = 0;
  friend bool operator==(device_ref, device_ref) = default;
};
const device& at(const inventory& inv, device_ref d);  // d must name a device of inv

// How two devices talk: over the node's own interconnect or over the network. Tensor parallelism
// (an all-reduce inside every layer) needs same_node; pipeline stages may cross the network.
enum class link_kind : std::uint8_t { same_node, network };
link_kind link_between(device_ref a, device_ref b);

// ---- what a model needs -----------------------------------------------------------------------------

// One model's memory needs, in bytes for the whole model at its stored dtype (the planner splits them).
// Tied embeddings (one tensor for both ends): give its bytes in both fields; a single-stage replica then
// counts it twice, a safe overestimate, while a pipelined one needs the copy on its last stage anyway.
struct requirements {
  std::int32_t layers = 0;                          // transformer blocks, 1..max_layers
  std::uint64_t layer_bytes = 0;                    // weights of one block, all ranks together
  std::uint64_t embedding_bytes = 0;                // token embedding (first stage)
  std::uint64_t head_bytes = 0;                     // final norm and output head (last stage)
  std::uint64_t kv_bytes_per_token_per_layer = 0;   // K and V of one token in one block, all KV heads; > 0
  std::uint64_t scratch_bytes = 0;                  // activations and scratch per device, admitted step shapes
  std::int32_t heads = 0;                           // attention (query) heads
  std::int32_t kv_heads = 0;                        // KV heads; divide heads (MHA: equal, GQA/MQA: fewer)
  // A routed model: its experts per layer and one expert's bytes in one layer (part of layer_bytes).
  // Under expert parallelism the ranks hold whole experts, ceil(experts / tp) on the fullest rank.
  std::int32_t experts = 0;
  std::uint64_t expert_bytes = 0;
};

// The bytes of one layer on the fullest of `tp` ranks: 1 / tp of everything under tensor
// parallelism; under expert parallelism 1 / tp of what is not a routed expert plus ceil(experts / tp)
// whole experts.
std::uint64_t layer_bytes_per_rank(const requirements& req, std::int32_t tp, bool expert_parallel);
inline constexpr std::int32_t max_layers = 65536;

// Whether `tp` ranks can split the attention: tp divides the heads, and tp divides the KV heads or the
// KV heads divide tp (then each KV head is replicated on tp / kv_heads ranks).
bool admissible_tensor_parallel(const requirements& req, std::int32_t tp);
// KV heads each rank holds: ceil(kv_heads / tp) (1 when the KV heads are replicated).
std::int32_t kv_heads_per_rank(const requirements& req, std::int32_t tp);

// ---- policy -----------------------------------------------------------------------------------------

// What the plan optimises, choosing among replica shapes (tensor-parallel degree x pipeline depth):
//   latency    the fewest pipeline stages, then the widest tensor parallelism inside a node; as many
//              replicas of that shape as fit.
//   capacity   the most KV tokens per replica (pipelining across nodes when that adds memory); among
//              shapes within 5% of the best, the fewest stages, then the widest tensor parallelism.
//              One replica unless `replicas` asks for more.
//   throughput the most replicas, then the fewest stages, then the most KV tokens per replica.
enum class objective : std::uint8_t { latency, capacity, throughput };
std::string_view name(objective o);

struct policy {
  objective goal = objective::latency;
  std::optional<std::int32_t> max_tensor_parallel;  // at most this many ranks per stage (>= 1)
  std::optional<std::int32_t> replicas;             // exactly this many replicas (>= 1), else the goal's default
  std::int64_t min_kv_tokens = 1;                   // KV tokens every replica holds at least (0..max_kv_tokens)
  bool expert_parallel = false;                     // the tensor-parallel ranks hold whole experts (layer_bytes_per_rank)
};
inline constexpr std::int64_t max_kv_tokens = std::int64_t{1} << 40;

// ---- plan -------------------------------------------------------------------------------------------

// Layers [first, end).
struct layer_range {
  std::int32_t first = 0;
  std::int32_t end = 0;
  friend bool operator==(layer_range, layer_range) = default;
};

// A pipeline stage: a tensor-parallel group on one node (devices in rank order) and its layers; the
// first stage of a replica also holds the embedding, the last the head. The byte counts are per device.
struct stage {
  std::vector<device_ref> devices;
  layer_range layers;
  std::uint64_t weight_bytes = 0;        // its share of the layers, plus embedding / head shares
  std::uint64_t kv_bytes_per_token = 0;  // its KV for one token over all its layers
};

struct replica {
  std::vector<stage> stages;    // in pipeline order; their layer ranges cover [0, layers) once
  std::int64_t kv_tokens = 0;   // tokens of KV every device of the replica can hold
};

// Every replica has the same shape and device kind; replicas never share a device.
struct plan {
  device_kind kind = device_kind::cpu;
  std::int32_t tensor_parallel = 1;  // ranks per stage
  std::int32_t pipeline = 1;         // stages per replica
  std::vector<replica> replicas;
};

// The shape, then one line per replica:
//   cuda, pipeline 2 x tensor parallel 2, 1 replica
//   replica 0 (kv 1536819 tokens): node-a[cuda:0 cuda:1] layers [0, 40) | node-b[cuda:0 cuda:1] layers [40, 80)
std::string describe(const plan& p, const inventory& inv);

// ---- errors -----------------------------------------------------------------------------------------

enum class placement_error_code : std::uint8_t {
  bad_requirements,     // a requirement out of range (no layers, heads not a multiple of KV heads, ...)
  bad_policy,           // a constraint out of range (replicas or max tensor parallel below 1, ...)
  bad_inventory,        // duplicate node ids or device names
  no_devices,           // the inventory has no device
  heads_not_divisible,  // memory allows a tensor-parallel degree the heads cannot be split by (see tensor_parallel)
  does_not_fit,         // no arrangement holds the model (see shortfall_bytes)
  replicas_do_not_fit,  // the asked replica count does not fit (see replicas_fit)
};
std::string_view name(placement_error_code c);

struct placement_error {
  placement_error_code code = placement_error_code::does_not_fit;
  std::string reason;
  std::uint64_t shortfall_bytes = 0;   // does_not_fit: what the best arrangement lacks, summed over its devices
  std::int32_t tensor_parallel = 0;    // heads_not_divisible: the smallest degree that would fit
  std::int32_t replicas_fit = 0;       // replicas_do_not_fit: the most replicas any shape holds
  std::string message() const;
};

// The plan for one model on an inventory under a policy. Deterministic: the same values give the same
// plan. Shapes considered: every tensor-parallel degree up to the largest node's device count of a kind
// (and max_tensor_parallel), every pipeline depth up to the layer count; replicas are placed one after
// another on the largest free groups (devices of a node sorted by memory, largest first). A refusal
// names the closest miss: does_not_fit reports the arrangement whose first replica lacks the fewest
// bytes (summed over its devices, with min_kv_tokens of KV), over every admissible shape.
result<plan, placement_error> make_plan(const inventory& inv, const requirements& req, const policy& pol);

}  // namespace troupe::placement
