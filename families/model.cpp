#include "families/model.hpp"

#include <algorithm>

namespace troupe::families {

std::string_view program_name(program p) {
  switch (p) {
    case program::step: return "step";
    case program::encode: return "encode";
    case program::draft: return "draft";
  }
  return "unknown";
}

std::string step_shape::str() const {
  std::string s = "rows=" + std::to_string(rows_) + " tokens=" + std::to_string(tokens_) + " capacity=" + std::to_string(capacity_);
  if (kv_.kind == kv_layout_kind::paged)
    s += " paged(block=" + std::to_string(kv_.block_size) + ", blocks=" + std::to_string(kv_.pool_blocks) + ")";
  s += logits_ == logit_rows::all ? " logits=all" : " logits=last";
  if (hidden_carry_) s += " hidden";
  if (state_rows_ > 0) s += " state_rows=" + std::to_string(state_rows_);
  return s;
}

namespace {

std::optional<std::string> shape_problem(program p, const step_shape& s) {
  if (s.rows() < 1 || s.tokens() < 1) return "rows and tokens must be at least 1";
  if (p == program::encode) return std::nullopt;
  if (s.capacity() < 1) return "capacity must be at least 1";
  if (s.tokens() > s.capacity()) return "a row cannot take more new tokens than its capacity";
  if (s.kv().kind == kv_layout_kind::paged) {
    if (s.kv().block_size < 1 || s.kv().pool_blocks < 1) return "a paged layout needs a block size and pool blocks";
    if (s.capacity() % s.kv().block_size != 0) return "capacity must be a whole number of blocks";
  }
  std::int64_t t;
  if (__builtin_mul_overflow(s.rows(), s.tokens(), &t) || __builtin_mul_overflow(s.rows(), s.capacity(), &t))
    return "rows x tokens or rows x capacity overflows";
  return std::nullopt;
}

}  // namespace

result<graph::graph, graph::trace_error> model::trace(const step_spec& spec, const graph::trace_limits& limits) const {
  using graph::trace_error;
  if (!schema().offers(spec.program))
    return unexpected(trace_error{graph::missing_program{std::string(program_name(spec.program))}});
  if (auto why = shape_problem(spec.program, spec.shape))
    return unexpected(trace_error{graph::unsupported_shape{*why + " (" + spec.shape.str() + ")"}});
  for (const auto& name : spec.carried_inputs)
    if (!schema().find_input(name))
      return unexpected(trace_error{graph::bad_declaration{"carried input '" + name + "' is not in the schema"}});

  graph::builder b(limits);
  b.admit_tokens(spec.shape.total_tokens());  // before the tracer body runs
  if (!b.ok()) return unexpected(*b.error());
  trace_into(spec, b);
  auto g = std::move(b).finish();
  if (!g) return g;

  // The graph must carry exactly the program's declared states, each of [slots, slot_shape...].
  const auto& declared = schema().states(spec.program);
  if (g->states().size() != declared.size())
    return unexpected(trace_error{graph::state_mismatch{"the graph carries " + std::to_string(g->states().size()) +
                                                        " states, the schema declares " + std::to_string(declared.size())}});
  for (const auto& d : declared) {
    const auto it = std::find_if(g->states().begin(), g->states().end(), [&](const auto& s) { return s.name == d.name; });
    if (it == g->states().end()) return unexpected(trace_error{graph::state_mismatch{"declared state '" + d.name + "' is not carried"}});
    std::vector<std::int64_t> dims{d.per_row ? spec.shape.state_rows() : spec.shape.kv_slots()};
    dims.insert(dims.end(), d.slot_shape.begin(), d.slot_shape.end());
    const graph::tensor_type want{d.element, troupe::shape(std::span<const std::int64_t>(dims))};
    if (g->info(it->in).type != want)
      return unexpected(trace_error{graph::state_mismatch{"state '" + d.name + "' is " + g->info(it->in).type.str() + ", declared " + want.str()}});
  }
  return g;
}

std::vector<step_input> step_inputs(program p, const step_shape& s, std::int64_t hidden) {
  const std::int64_t n = s.total_tokens();
  const graph::tensor_type per_token{dtype::i32, {n}};
  if (p == program::encode)
    return {{graph::slot_kind::token_ids, per_token}, {graph::slot_kind::positions, per_token}, {graph::slot_kind::token_mask, per_token}};
  std::vector<step_input> in{{graph::slot_kind::token_ids, per_token},
                             {graph::slot_kind::positions, per_token},
                             {graph::slot_kind::kv_write_map, per_token},
                             {graph::slot_kind::kv_read_map, {dtype::i32, {s.rows(), s.capacity()}}},
                             {graph::slot_kind::state_rows, {dtype::i32, {s.rows()}}},
                             {graph::slot_kind::adapter_rows, {dtype::i32, {s.rows()}}}};
  if (p == program::draft && hidden > 0) in.push_back({graph::slot_kind::hidden_states, {dtype::f32, {n, hidden}}});
  return in;
}

result<void, schema_error> model_schema::declare(request_input_decl d) {
  if (d.name.empty()) return unexpected(schema_error{d.name, "a request input needs a name"});
  if (find_input(d.name)) return unexpected(schema_error{d.name, "declared twice"});
  if (is_quantized(d.element)) return unexpected(schema_error{d.name, "element type must be a plain dtype"});
  if (d.width.empty()) return unexpected(schema_error{d.name, "a width is needed (one value per position is width [1])"});
  for (auto w : d.width)
    if (w < 1) return unexpected(schema_error{d.name, "widths must be positive"});
  if (d.presence != input_presence::defaulted && d.fill != 0.0) return unexpected(schema_error{d.name, "only a defaulted input has a fill"});
  inputs_.push_back(std::move(d));
  return {};
}

void model_schema::add_program(program p, std::vector<state_decl> states) { programs_.emplace_back(p, std::move(states)); }

bool model_schema::offers(program p) const {
  return std::any_of(programs_.begin(), programs_.end(), [&](const auto& e) { return e.first == p; });
}

const std::vector<state_decl>& model_schema::states(program p) const {
  static const std::vector<state_decl> none;
  for (const auto& e : programs_)
    if (e.first == p) return e.second;
  return none;
}

const request_input_decl* model_schema::find_input(const std::string& name) const {
  for (const auto& d : inputs_)
    if (d.name == name) return &d;
  return nullptr;
}

result<std::unique_ptr<model>, model_error> model::stage(int, int) const {
  return unexpected(model_error{config_error{config().family, "pipeline_parallel", "this family cannot be split into pipeline stages"}});
}

weight_footprint footprint(const model& m) {
  weight_footprint f;
  const auto& c = m.config();
  const bool own_head = m.weights().has({role::output, -1});
  for (const auto& e : m.weights().entries()) {
    const double n = static_cast<double>(e.view.numel()), b = static_cast<double>(e.view.bytes());
    const bool routed = graph::is_expert_stack(e.role.kind) && c.experts > 0;
    double share = routed ? static_cast<double>(c.experts_per_token) / static_cast<double>(c.experts) : 1.0;
    // A token reads one row of an embedding table that is not also the head.
    if (e.role.kind == role::token_embd && own_head && e.view.shape().rank() == 2 && e.view.shape()[0] > 0)
      share = 1.0 / static_cast<double>(e.view.shape()[0]);
    f.params += n;
    f.bytes += b;
    f.active_params += n * share;
    f.active_bytes += b * share;
  }
  return f;
}

result<std::unique_ptr<model>, model_error> model::expert_parallel() const {
  return unexpected(model_error{config_error{config().family, "expert_parallel", "the model has no routed experts to place"}});
}

result<std::unique_ptr<model>, model_error> model::with_kv_type(dtype t) const {
  return unexpected(model_error{config_error{config().family, "kv_type",
                                             "this family keeps no attention KV cache of another type (asked for " + std::string(name(t)) + ")"}});
}

sequence_state_bytes state_bytes(const model& m) {
  sequence_state_bytes b;
  for (const auto& d : m.schema().states(program::step)) {
    std::uint64_t n = 1;
    for (auto x : d.slot_shape) n *= static_cast<std::uint64_t>(x);
    (d.per_row ? b.per_sequence : b.per_token) += static_cast<std::int64_t>(storage_bytes(d.element, n).value_or(0));
  }
  return b;
}

std::int64_t kv_bytes_per_token_per_layer(const model& m) {
  const auto elems = m.config().kv_elems_per_token_per_layer;
  const auto& i = info(m.kv_type());
  const auto be = static_cast<std::int64_t>(i.block_elems);
  return (elems + be - 1) / be * static_cast<std::int64_t>(i.block_bytes);
}

std::optional<dtype> kv_type_from_name(std::string_view n) {
  if (n.empty()) return default_kv_type;
  for (auto t : {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0})
    if (n == name(t)) return t;
  return std::nullopt;
}

result<std::unique_ptr<model>, model_error> model::shard(int, int) const {
  return unexpected(model_error{config_error{config().family, "tensor_parallel", "this family cannot be split across devices"}});
}

}  // namespace troupe::families
