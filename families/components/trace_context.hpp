#pragma once
// What every component reads while a family traces one step: the builder, the weight map (weights by
// role, with their stored transforms undone), the step's shape and the step inputs, each declared once.
#include <cstdint>
#include <map>
#include <string>

#include "engine/graph/builder.hpp"
#include "families/step_shape.hpp"
#include "families/weight_map.hpp"

namespace troupe::families {

class trace_context {
 public:
  trace_context(graph::builder& b, const weight_map& weights, const step_spec& spec);

  graph::builder& b;
  const step_spec& spec;
  const step_shape& shape() const { return spec.shape; }
  bool stateful() const { return spec.program != program::encode; }
  // The element type the attention KV states are stored as (model::with_kv_type).
  dtype kv_type = dtype::f32;

  bool has(role r, std::int32_t layer = -1) const { return weights_.has({r, layer}); }
  stored_as stored(role r, std::int32_t layer = -1) const;
  // The role's weight as stored (any dtype, for linear and gather_rows); a missing role fails the trace.
  graph::value_id weight(role r, std::int32_t layer = -1);
  // x [.., K] through the role's [N, K] weight (graph::op::linear). An act-order weight (GPTQ desc_act,
  // weight_entry::input_perm) takes x's columns in its stored order first. With LoRA slots in the spec
  // and the role among its targets, each token adds B_s (A_s x) of its row's adapter slot s
  // (graph::op::linear_id over the role's pools; a row without an adapter adds nothing).
  graph::value_id linear(graph::value_id x, role r, std::int32_t layer = -1);
  // A vector weight (norm scale, bias) as f32, with a stored `minus_one` undone.
  graph::value_id vector_f32(role r, std::int32_t layer = -1);

  // Step inputs (see model_schema.hpp), declared on first use.
  graph::value_id token_ids();
  graph::value_id positions();
  graph::value_id write_map();
  graph::value_id read_map();
  graph::value_id token_mask();
  graph::value_id state_rows();
  graph::value_id adapter_rows();
  // The draft program's hidden_states f32 [tokens, hidden].
  graph::value_id hidden_states(std::int64_t hidden);
  // Request input `name` (one of spec.carried_inputs) as a slot of `type`: per position, [tokens,
  // width...]; declared once. Not carried by this step: an invalid value (the caller takes its default).
  graph::value_id request_input(const std::string& name, const graph::tensor_type& type);
  bool carries(const std::string& name) const;

 private:
  const weight_map& weights_;
  graph::value_id token_ids_, positions_, write_map_, read_map_, token_mask_, hidden_states_, state_rows_, adapter_rows_;
  std::map<std::string, graph::value_id> request_inputs_;
  graph::value_id adapter_ids_;  // adapter_rows per token, [tokens, 1]
  graph::value_id lora(graph::value_id x, role r, std::int32_t layer, std::int64_t n);
};

}  // namespace troupe::families
