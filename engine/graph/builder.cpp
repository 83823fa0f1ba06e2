#include "engine/graph/builder.hpp"

#include <cstring>

namespace troupe::graph {

std::string_view resource_name(budget_resource r) {
  switch (r) {
    case budget_resource::tokens: return "tokens";
    case budget_resource::values: return "values";
    case budget_resource::equations: return "equations";
    case budget_resource::literal_bytes: return "literal_bytes";
    case budget_resource::owned_bytes: return "owned_bytes";
  }
  return "unknown";
}

std::string trace_error::message() const {
  struct visitor {
    std::string operator()(const budget_exceeded& b) const {
      return "budget exhausted: " + std::string(resource_name(b.resource)) + " limit " + std::to_string(b.limit) +
             ", attempted " + std::to_string(b.attempted);
    }
    std::string operator()(const ill_typed& e) const { return "ill-typed " + e.op + ": " + e.reason; }
    std::string operator()(const unsupported_shape& e) const { return "unsupported shape: " + e.reason; }
    std::string operator()(const missing_program& e) const { return "no program '" + e.program + "'"; }
    std::string operator()(const state_mismatch& e) const { return "state mismatch: " + e.reason; }
    std::string operator()(const bad_declaration& e) const { return "bad declaration: " + e.reason; }
  };
  return std::visit(visitor{}, kind);
}

builder::builder(trace_limits limits) : limits_(limits) {}

void builder::fail(trace_error_kind e) {
  if (!error_) error_ = trace_error{std::move(e)};
}

const tensor_type& builder::type_of(value_id v) const {
  if (!v.valid() || v.index >= g_.values_.size()) return none_;
  return g_.values_[v.index].type;
}

std::string builder::scoped(const std::string& name) const {
  std::string s;
  for (const auto& sc : scopes_) s += sc + ".";
  return s + name;
}

void builder::push_scope(std::string name) { scopes_.push_back(std::move(name)); }
void builder::pop_scope() {
  if (!scopes_.empty()) scopes_.pop_back();
}

void builder::label(value_id v, const std::string& name) {
  if (!ok() || !v.valid() || v.index >= g_.values_.size()) return;
  g_.values_[v.index].label = scoped(name);
}

bool builder::charge_value(std::size_t label_bytes) {
  if (!ok()) return false;
  const auto values = static_cast<std::int64_t>(g_.values_.size()) + 1;
  if (values > limits_.values) {
    fail(budget_exceeded{budget_resource::values, limits_.values, values});
    return false;
  }
  const auto owned = owned_ + static_cast<std::int64_t>(sizeof(value_info) + label_bytes);
  if (owned > limits_.owned_bytes) {
    fail(budget_exceeded{budget_resource::owned_bytes, limits_.owned_bytes, owned});
    return false;
  }
  owned_ = owned;
  return true;
}

value_id builder::add_value(const tensor_type& type, value_kind kind, std::string label) {
  if (!charge_value(label.size())) return {};
  g_.values_.push_back(value_info{type, kind, std::move(label)});
  return value_id{static_cast<std::uint32_t>(g_.values_.size() - 1)};
}

bool builder::check_handles(const std::vector<value_id>& vs) {
  if (!ok()) return false;
  for (auto v : vs) {
    if (!v.valid() || v.index >= g_.values_.size()) {
      fail(bad_declaration{"a value handle that this builder did not return"});
      return false;
    }
  }
  return true;
}

void builder::admit_tokens(std::int64_t n) {
  if (!ok()) return;
  const auto t = tokens_ + n;
  if (n < 0 || t > limits_.tokens) {
    fail(budget_exceeded{budget_resource::tokens, limits_.tokens, t});
    return;
  }
  tokens_ = t;
}

value_id builder::slot(slot_kind kind, const tensor_type& type, std::string name) {
  if (!ok()) return {};
  if (name.empty()) name = std::string(slot_kind_name(kind));
  if (kind == slot_kind::request_input && name == slot_kind_name(kind)) {
    fail(bad_declaration{"a request input slot needs a name"});
    return {};
  }
  for (const auto& s : g_.slots_) {
    if (s.slot.name == name) {
      fail(bad_declaration{"slot '" + name + "' declared twice"});
      return {};
    }
  }
  if (is_quantized(type.type) || !type.dims.checked_numel()) {
    fail(bad_declaration{"slot '" + name + "' has type " + type.str()});
    return {};
  }
  const auto v = add_value(type, value_kind::slot, name);
  if (v.valid()) g_.slots_.push_back({v, troupe::graph::slot{kind, name}});
  return v;
}

value_id builder::weight(const weight_role& role, const tensor_type& type) {
  if (!ok()) return {};
  if (role.kind == tensor_role::none) {
    fail(bad_declaration{"a weight needs a role"});
    return {};
  }
  for (const auto& w : g_.weights_) {
    if (w.role == role) {
      if (g_.values_[w.value.index].type != type) {
        fail(bad_declaration{"weight " + role.str() + " declared with two types"});
        return {};
      }
      return w.value;  // one const per role
    }
  }
  const auto n = type.dims.checked_numel();
  if (!n || !storage_bytes(type.type, static_cast<std::uint64_t>(*n))) {
    fail(bad_declaration{"weight " + role.str() + " has ill-formed type " + type.str()});
    return {};
  }
  const auto v = add_value(type, value_kind::weight, role.str());
  if (v.valid()) g_.weights_.push_back({v, role});
  return v;
}

value_id builder::literal(tensor data, std::string label) {
  if (!ok()) return {};
  const auto bytes = static_cast<std::int64_t>(data.bytes());
  const auto lit = literal_bytes_ + bytes;
  if (lit > limits_.literal_bytes) {
    fail(budget_exceeded{budget_resource::literal_bytes, limits_.literal_bytes, lit});
    return {};
  }
  const auto owned = owned_ + bytes;
  if (owned > limits_.owned_bytes) {
    fail(budget_exceeded{budget_resource::owned_bytes, limits_.owned_bytes, owned});
    return {};
  }
  if (is_quantized(data.type())) {
    fail(bad_declaration{"a literal must be of a plain dtype"});
    return {};
  }
  const auto v = add_value(tensor_type{data.type(), data.shape()}, value_kind::literal, label.empty() ? "literal" : scoped(label));
  if (!v.valid()) return {};
  literal_bytes_ = lit;
  owned_ += bytes;
  g_.literals_.push_back({v, std::move(data)});
  return v;
}

value_id builder::scalar(double v, dtype type) {
  if (!ok()) return {};
  tensor t(type, troupe::shape{});
  store_element(type, t.data(), 0, v);
  return literal(std::move(t), "scalar");
}

value_id builder::state_input(const std::string& name, const tensor_type& type) {
  if (!ok()) return {};
  for (const auto& s : g_.states_) {
    if (s.name == name) {
      fail(bad_declaration{"state '" + name + "' declared twice"});
      return {};
    }
  }
  // Plain states, or a q8_0 KV cache (whole 32-value blocks per row).
  const bool blocks_ok = type.type == dtype::q8_0 && type.dims.rank() >= 2 && type.dims.back() % 32 == 0;
  if ((is_quantized(type.type) && !blocks_ok) || !type.dims.checked_numel()) {
    fail(bad_declaration{"state '" + name + "' has type " + type.str()});
    return {};
  }
  const auto v = add_value(type, value_kind::state_in, name);
  if (v.valid()) g_.states_.push_back({name, v, {}});
  return v;
}

void builder::state_output(const std::string& name, value_id v) {
  if (!check_handles({v})) return;
  for (auto& s : g_.states_) {
    if (s.name != name) continue;
    if (s.out.valid()) {
      fail(state_mismatch{"state '" + name + "' written twice"});
    } else if (type_of(s.in) != type_of(v)) {
      fail(state_mismatch{"state '" + name + "' carried as " + type_of(v).str() + " but declared " + type_of(s.in).str()});
    } else {
      s.out = v;
    }
    return;
  }
  fail(state_mismatch{"state '" + name + "' written but never read"});
}

void builder::output(const std::string& name, value_id v) {
  if (!check_handles({v})) return;
  for (const auto& o : g_.outputs_) {
    if (o.name == name) {
      fail(bad_declaration{"output '" + name + "' declared twice"});
      return;
    }
  }
  g_.outputs_.push_back({name, v});
}

value_id builder::apply(op o, std::vector<value_id> inputs, op_attrs attrs) {
  if (!check_handles(inputs)) return {};
  std::vector<tensor_type> types;
  types.reserve(inputs.size());
  for (auto v : inputs) types.push_back(type_of(v));
  auto t = infer(o, types, attrs);
  if (!t) {
    fail(ill_typed{std::string(op_name(o)), t.error()});
    return {};
  }
  const auto eqns = static_cast<std::int64_t>(g_.eqns_.size()) + 1;
  if (eqns > limits_.equations) {
    fail(budget_exceeded{budget_resource::equations, limits_.equations, eqns});
    return {};
  }
  const auto eqn_bytes = static_cast<std::int64_t>(sizeof(equation) + inputs.size() * sizeof(value_id) +
                                                   attrs.ints.size() * sizeof(std::int64_t));
  const auto owned = owned_ + eqn_bytes;
  if (owned > limits_.owned_bytes) {
    fail(budget_exceeded{budget_resource::owned_bytes, limits_.owned_bytes, owned});
    return {};
  }
  const auto out = add_value(*t, value_kind::computed, scoped(std::string(op_name(o))));
  if (!out.valid()) return {};
  owned_ += eqn_bytes;
  g_.eqns_.push_back(equation{o, std::move(inputs), out, std::move(attrs)});
  return out;
}

value_id builder::unary(op o, value_id x) { return apply(o, {x}); }
value_id builder::binary(op o, value_id a, value_id b) { return apply(o, {a, b}); }
value_id builder::where(value_id c, value_id a, value_id b) { return apply(op::where, {c, a, b}); }

value_id builder::cast(value_id x, dtype to) {
  op_attrs a;
  a.to = to;
  return apply(op::cast, {x}, a);
}

value_id builder::reduce(op o, value_id x, std::int64_t axis, bool keepdim) {
  op_attrs a;
  a.axis = axis;
  a.keepdim = keepdim;
  return apply(o, {x}, a);
}

value_id builder::softmax(value_id x, std::int64_t axis) { return reduce(op::softmax, x, axis); }
value_id builder::log_softmax(value_id x, std::int64_t axis) { return reduce(op::log_softmax, x, axis); }
value_id builder::arg_max(value_id x, std::int64_t axis) { return reduce(op::arg_max, x, axis); }

value_id builder::reshape(value_id x, troupe::shape target) {
  op_attrs a;
  a.target = target;
  return apply(op::reshape, {x}, a);
}

value_id builder::transpose(value_id x, std::vector<std::int64_t> perm) {
  op_attrs a;
  a.ints = std::move(perm);
  return apply(op::transpose, {x}, a);
}

value_id builder::slice(value_id x, std::int64_t axis, std::int64_t begin, std::int64_t end) {
  op_attrs a;
  a.axis = axis;
  a.ints = {begin, end};
  return apply(op::slice, {x}, a);
}

value_id builder::concat(const std::vector<value_id>& xs, std::int64_t axis) {
  op_attrs a;
  a.axis = axis;
  return apply(op::concat, xs, a);
}

value_id builder::broadcast(value_id x, troupe::shape target) {
  op_attrs a;
  a.target = target;
  return apply(op::broadcast, {x}, a);
}

value_id builder::matmul(value_id a, value_id b) { return apply(op::matmul, {a, b}); }
value_id builder::linear(value_id x, value_id w) { return apply(op::linear, {x, w}); }
value_id builder::gather_rows(value_id table, value_id ids) { return apply(op::gather_rows, {table, ids}); }
value_id builder::scatter_rows(value_id dst, value_id ids, value_id src) { return apply(op::scatter_rows, {dst, ids, src}); }

value_id builder::all_reduce(value_id x) { return apply(op::all_reduce, {x}); }

value_id builder::all_gather(value_id x, std::int64_t ranks) {
  op_attrs a;
  a.ints = {ranks};
  return apply(op::all_gather, {x}, a);
}

value_id builder::pipe_send(value_id x, std::int64_t to_stage) {
  op_attrs a;
  a.ints = {to_stage};
  return apply(op::pipe_send, {x}, a);
}

value_id builder::pipe_recv(troupe::shape dims, std::int64_t from_stage) {
  op_attrs a;
  a.ints = {from_stage};
  a.target = dims;
  return apply(op::pipe_recv, {}, a);
}

value_id builder::ssm_conv(value_id x, value_id state, value_id rows, value_id pos, value_id write, value_id w) {
  return apply(op::ssm_conv, {x, state, rows, pos, write, w});
}

value_id builder::ssm_scan(value_id x, value_id dt, value_id A, value_id B, value_id C, value_id state, value_id rows, value_id pos,
                           value_id write) {
  return apply(op::ssm_scan, {x, dt, A, B, C, state, rows, pos, write});
}

value_id builder::delta_rule(value_id q, value_id k, value_id v, value_id g, value_id beta, value_id state, value_id rows, value_id pos,
                             value_id write) {
  return apply(op::delta_rule, {q, k, v, g, beta, state, rows, pos, write});
}

value_id builder::top_k(value_id x, std::int64_t k) {
  op_attrs a;
  a.ints = {k};
  return apply(op::top_k, {x}, a);
}

value_id builder::take_along(value_id x, value_id idx) { return apply(op::take_along, {x, idx}); }
value_id builder::linear_id(value_id x, value_id w, value_id ids) { return apply(op::linear_id, {x, w, ids}); }

void builder::witness(const std::string& name, value_id v, witness_check check, std::int64_t bound) {
  output(name, v);
  if (ok()) g_.witnesses_.push_back({name, check, bound});
}

value_id builder::rms_norm(value_id x, value_id w, double eps) {
  op_attrs a;
  a.eps = eps;
  return apply(op::rms_norm, {x, w}, a);
}

value_id builder::layer_norm(value_id x, value_id w, value_id b, double eps) {
  op_attrs a;
  a.eps = eps;
  return apply(op::layer_norm, {x, w, b}, a);
}

value_id builder::rope(value_id x, value_id pos, value_id inv_freq, bool neox, double scale) {
  op_attrs a;
  a.neox = neox;
  a.scale = scale;
  return apply(op::rope, {x, pos, inv_freq}, a);
}

value_id builder::attention(value_id q, value_id k, value_id v, value_id index, value_id allow, double scale, double softcap,
                            value_id sinks, std::int64_t value_dims) {
  op_attrs a;
  a.scale = scale;
  a.softcap = softcap;
  if (value_dims > 0) a.ints = {value_dims};
  if (sinks.valid()) return apply(op::attention, {q, k, v, index, allow, sinks}, a);
  return apply(op::attention, {q, k, v, index, allow}, a);
}

result<graph, trace_error> builder::finish() && {
  if (ok()) {
    for (const auto& s : g_.states_)
      if (!s.out.valid()) fail(state_mismatch{"state '" + s.name + "' read but never written"});
  }
  if (ok() && g_.outputs_.empty()) fail(bad_declaration{"a graph needs at least one output"});
  if (ok()) {
    if (auto v = verify(g_); !v) fail(bad_declaration{"verifier: " + v.error().message()});
  }
  if (!ok()) return unexpected(*error_);
  return std::move(g_);
}

}  // namespace troupe::graph
