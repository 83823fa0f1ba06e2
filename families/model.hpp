#pragma once
// A model family's contract with the rest of troupe: its configuration, its schema, its weight map and
// a tracer. `trace` is provided: it checks the step against the schema and the limits, admits the
// token count, runs the family's `trace_into` and checks the graph carries exactly the declared
// states. A family knows no backend, actor, placement or I/O.
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <string>
#include <vector>

#include "engine/graph/builder.hpp"
#include "families/family_error.hpp"
#include "families/model_schema.hpp"
#include "families/step_shape.hpp"
#include "families/weight_map.hpp"

namespace troupe::families {

// What the rest of troupe needs to know of a model without tracing it.
struct model_config {
  std::string family;        // "llama"
  std::int64_t vocab = 0;    // rows of the logits
  std::int64_t hidden = 0;
  std::int64_t layers = 0;
  std::int64_t max_positions = 0;
  std::int32_t bos_id = -1;
  std::vector<std::int32_t> eos_ids;
  // KV elements per token per layer (of an attention layer), for placement and capacity planning; their
  // bytes are kv_bytes(model) below, at the model's kv_type().
  std::int64_t kv_elems_per_token_per_layer = 0;
  // A routed model: experts per routed layer and how many each token runs (0: dense). A decode step
  // reads experts_per_token / experts of the routed weights (the `*_exps` roles).
  std::int64_t experts = 0, experts_per_token = 0;
};

class model;
// Parameters and stored bytes a model holds, and those one token's decode reads: every weight, but of
// each routed layer's `*_exps` tensors only experts_per_token / experts of them, and of an embedding
// table that is not also the head one row.
struct weight_footprint {
  double params = 0, bytes = 0, active_params = 0, active_bytes = 0;
};
weight_footprint footprint(const model& m);
// What one sequence carries in the step program's states: bytes per token (the attention KV of every
// layer, at the model's kv_type) and bytes per sequence whatever its length (recurrent layers' conv
// windows and scan states).
struct sequence_state_bytes {
  std::int64_t per_token = 0, per_sequence = 0;
};
sequence_state_bytes state_bytes(const model& m);
// Bytes of KV cache one token takes in one attention layer, at the model's kv_type() (q8_0: 34 bytes
// per 32 values).
std::int64_t kv_bytes_per_token_per_layer(const model& m);
// The KV element types a deployment may choose, by name ("f32", "f16", "bf16", "q8_0"), or nullopt;
// the empty name is the deployments' default, f16 (llama.cpp's).
inline constexpr dtype default_kv_type = dtype::f16;
std::optional<dtype> kv_type_from_name(std::string_view name);

class model {
 public:
  virtual ~model() = default;
  virtual const model_config& config() const = 0;
  virtual const model_schema& schema() const = 0;
  virtual const families::weight_map& weights() const = 0;

  result<graph::graph, graph::trace_error> trace(const step_spec& spec, const graph::trace_limits& limits = {}) const;

  // Rank `rank` of a `size`-way tensor-parallel split: a model of the same family over that rank's
  // slices of the weights (attention heads, feed-forward columns; embeddings, norms and the head whole),
  // whose traces all_reduce the partial sums of the row-split projections. Run every rank's entries on
  // executors of one group (cpu_options::group) and they compute what the whole model computes. The
  // default refuses; a family that can be split says so by overriding it.
  virtual result<std::unique_ptr<model>, model_error> shard(int rank, int size) const;

  // Stage `stage` of a `stages`-deep pipeline split: a model over a contiguous range of the layers
  // (layers x stage / stages up to layers x (stage + 1) / stages), the first stage holding the
  // embedding, the last the final norm and the head. A later stage's trace receives the residual stream
  // from the stage before (op::pipe_recv) and an earlier one sends it on (op::pipe_send): run each
  // stage's entries on an executor whose pipe has the stage as its rank (cpu_options::pipe). Splits
  // compose: the stages of a tensor-parallel shard are that shard's ranks in each stage. The default
  // refuses.
  virtual result<std::unique_ptr<model>, model_error> stage(int stage, int stages) const;

  // This model set to split by whole experts: a shard of it (`shard(rank, size)`) holds E / size of
  // each routed layer's experts whole, rather than 1 / size of every expert's width, and the routed
  // outputs join in the same all_reduce (expert parallelism over the tensor-parallel group, as vLLM's
  // --enable-expert-parallel). Attention and dense layers split as before. The default refuses: a
  // model without routed layers has no experts to place.
  virtual result<std::unique_ptr<model>, model_error> expert_parallel() const;

  // This model with its attention KV cache stored as `t` (f32, f16, bf16 or q8_0; llama.cpp's
  // --cache-type-k/-v): each step rounds the new keys and values to `t` as it writes them (q8_0: one f16
  // scale per 32 values of a head) and attention reads them in place. Recurrent states stay f32. The
  // kv_type() of the result is `t`; its splits keep it. The default accepts f32 only (a copy of nothing
  // to change is refused too: a family that stores no KV says so).
  virtual result<std::unique_ptr<model>, model_error> with_kv_type(dtype t) const;
  // The element type of the attention KV states (f32 unless with_kv_type chose another).
  virtual dtype kv_type() const { return dtype::f32; }

 protected:
  // The family's tracer body. Errors go into the builder (sticky); `trace` returns them.
  virtual void trace_into(const step_spec& spec, graph::builder& b) const = 0;
};

}  // namespace troupe::families
