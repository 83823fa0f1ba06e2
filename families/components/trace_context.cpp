#include "families/components/trace_context.hpp"

#include <algorithm>
#include <cstring>

#include "families/model_schema.hpp"

namespace troupe::families {

trace_context::trace_context(graph::builder& builder, const weight_map& weights, const step_spec& s)
    : b(builder), spec(s), weights_(weights) {}

stored_as trace_context::stored(role r, std::int32_t layer) const {
  const auto* e = weights_.find({r, layer});
  return e ? e->stored : stored_as::as_is;
}

graph::value_id trace_context::weight(role r, std::int32_t layer) {
  const graph::weight_role w{r, layer};
  const auto* e = weights_.find(w);
  if (!e) {
    b.fail(graph::bad_declaration{"the weight map has no role " + w.str()});
    return {};
  }
  return b.weight(w, {e->view.type(), e->view.shape()});
}

graph::value_id trace_context::linear(graph::value_id x, role r, std::int32_t layer) {
  const auto w = weight(r, layer);
  if (!b.ok()) return {};
  const auto* e = weights_.find({r, layer});
  if (e->input_perm) {
    // x's columns in the weight's order: as rows of x^T, gathered, transposed back.
    const auto& p = *e->input_perm;
    const auto dims = b.type_of(x).dims;
    const std::int64_t K = dims.back(), M = dims.numel() / std::max<std::int64_t>(K, 1);
    tensor perm(dtype::i32, p.shape());
    std::memcpy(perm.data(), p.data(), p.bytes());
    const auto ids = b.literal(std::move(perm), "input_perm");
    const auto t = b.transpose(b.reshape(x, {M, K}), {1, 0});
    x = b.reshape(b.transpose(b.gather_rows(t, ids), {1, 0}), dims);
  }
  const auto y = b.linear(x, w);
  const auto& l = spec.lora;
  if (l.slots > 0 && layer >= 0 && spec.program == program::step && std::ranges::find(l.targets, r) != l.targets.end())
    return b.add(y, lora(x, r, layer, e->view.shape()[0]));
  return y;
}

graph::value_id trace_context::lora(graph::value_id x, role r, std::int32_t layer, std::int64_t n) {
  const auto pools = graph::lora_pools_of(r);
  if (!pools) {
    b.fail(graph::bad_declaration{"no LoRA pools for role " + std::string(graph::role_name(r))});
    return {};
  }
  const auto dims = b.type_of(x).dims;
  const std::int64_t K = dims.back(), T = dims.numel() / std::max<std::int64_t>(K, 1);
  const std::int64_t S = spec.lora.slots, R = spec.lora.rank;
  if (!adapter_ids_.valid()) {
    // Each row's slot for each of its tokens: [rows] -> [rows, tokens] -> [tokens, 1].
    const auto rows = adapter_rows();
    const std::int64_t rn = shape().rows(), tn = shape().tokens();
    adapter_ids_ = b.reshape(b.broadcast(b.reshape(rows, {rn, 1}), {rn, tn}), {rn * tn, 1});
  }
  const auto a = b.weight({pools->a, layer}, {dtype::f32, {S, R, K}});
  const auto bw = b.weight({pools->b, layer}, {dtype::f32, {S, n, R}});
  const auto h = b.linear_id(b.reshape(x, {T, K}), a, adapter_ids_);  // [T, 1, R]
  const auto d = b.linear_id(h, bw, adapter_ids_);                     // [T, 1, n]
  std::vector<std::int64_t> out(static_cast<std::size_t>(dims.rank()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = dims[static_cast<std::int64_t>(i)];
  out.back() = n;
  return b.reshape(d, troupe::shape(std::span<const std::int64_t>(out)));
}

graph::value_id trace_context::vector_f32(role r, std::int32_t layer) {
  auto w = weight(r, layer);
  if (!b.ok()) return {};
  if (b.type_of(w).type != dtype::f32) w = b.cast(w, dtype::f32);
  if (stored(r, layer) == stored_as::minus_one) w = b.add(w, b.scalar(1.0));
  return w;
}

namespace {
graph::value_id declare(graph::builder& b, graph::value_id& cache, graph::slot_kind kind, const step_spec& spec, std::int64_t hidden = 0) {
  if (cache.valid()) return cache;
  for (const auto& in : step_inputs(spec.program, spec.shape, hidden))
    if (in.kind == kind) return cache = b.slot(kind, in.type);
  b.fail(graph::bad_declaration{"program " + std::string(program_name(spec.program)) + " has no step input " +
                                std::string(graph::slot_kind_name(kind))});
  return {};
}
}  // namespace

graph::value_id trace_context::token_ids() { return declare(b, token_ids_, graph::slot_kind::token_ids, spec); }
graph::value_id trace_context::positions() { return declare(b, positions_, graph::slot_kind::positions, spec); }
graph::value_id trace_context::write_map() { return declare(b, write_map_, graph::slot_kind::kv_write_map, spec); }
graph::value_id trace_context::read_map() { return declare(b, read_map_, graph::slot_kind::kv_read_map, spec); }
graph::value_id trace_context::token_mask() { return declare(b, token_mask_, graph::slot_kind::token_mask, spec); }
graph::value_id trace_context::state_rows() { return declare(b, state_rows_, graph::slot_kind::state_rows, spec); }
graph::value_id trace_context::adapter_rows() { return declare(b, adapter_rows_, graph::slot_kind::adapter_rows, spec); }
bool trace_context::carries(const std::string& name) const {
  return std::find(spec.carried_inputs.begin(), spec.carried_inputs.end(), name) != spec.carried_inputs.end();
}

graph::value_id trace_context::request_input(const std::string& name, const graph::tensor_type& type) {
  if (!carries(name)) return {};
  if (auto it = request_inputs_.find(name); it != request_inputs_.end()) return it->second;
  return request_inputs_[name] = b.slot(graph::slot_kind::request_input, type, name);
}

graph::value_id trace_context::hidden_states(std::int64_t hidden) {
  return declare(b, hidden_states_, graph::slot_kind::hidden_states, spec, hidden);
}

}  // namespace troupe::families
