#include "engine/exec/lowering.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace troupe::exec {

bool computable_type(dtype t) { return t == dtype::f32 || t == dtype::i32 || t == dtype::i64 || t == dtype::boolean; }

std::optional<exec_error> check_value_types(const graph::graph& g, const std::vector<bool>& runs, std::string_view target) {
  using graph::op;
  for (std::size_t i = 0; i < g.equations().size(); ++i) {
    if (!runs[i]) continue;
    const auto& e = g.equations()[i];
    const auto& t = g.info(e.out).type;
    const std::string where = "eqn " + std::to_string(i) + " (" + std::string(graph::op_name(e.code)) + ")";
    if (!computable_type(t.type))
      return exec_error{exec_error_code::unsupported, where,
                        "the " + std::string(target) + " target computes in f32 and i32; this value is " + t.str()};
    for (auto v : e.inputs) {
      const bool weight_operand = ((e.code == op::linear || e.code == op::linear_id) && v == e.inputs[1]) ||
                                  (e.code == op::gather_rows && v == e.inputs[0]);
      if (!weight_operand && !computable_type(g.info(v).type.type))
        return exec_error{exec_error_code::unsupported, where, "input of type " + g.info(v).type.str()};
    }
  }
  return std::nullopt;
}

std::optional<exec_error> check_slots(const graph::graph& g, const step_inputs& in) {
  for (const auto& s : g.slots()) {
    const auto it = in.slots.find(s.slot.name);
    const std::string where = "slot " + s.slot.name;
    if (it == in.slots.end()) return exec_error{exec_error_code::bad_binding, where, "not bound"};
    const auto& t = g.info(s.value).type;
    if (it->second.type() != t.type || it->second.shape() != t.dims)
      return exec_error{exec_error_code::bad_binding, where,
                        "expects " + t.str() + ", got " + graph::tensor_type{it->second.type(), it->second.shape()}.str()};
  }
  return std::nullopt;
}

std::optional<exec_error> check_witnesses(const graph::graph& g, const std::function<const std::byte*(graph::value_id)>& bytes_of) {
  for (const auto& w : g.witnesses()) {
    const auto o = std::find_if(g.outputs().begin(), g.outputs().end(), [&](const auto& b) { return b.name == w.output; });
    if (o == g.outputs().end()) continue;  // the verifier refuses this; nothing to check
    const auto& t = g.info(o->value).type;
    const std::byte* p = bytes_of(o->value);
    const std::int64_t n = t.dims.numel();
    if (auto why = graph::witness_fails(w, t.type, p, n)) return exec_error{exec_error_code::invalid_witness, "witness " + w.output, *why};
  }
  return std::nullopt;
}

std::vector<std::int64_t> broadcast_strides(const troupe::shape& in, const troupe::shape& out) {
  std::vector<std::int64_t> st(out.rank(), 0);
  std::int64_t s = 1;
  for (std::size_t i = in.rank(); i-- > 0;) {
    const std::size_t o = out.rank() - in.rank() + i;
    st[o] = in[i] == 1 ? 0 : s;
    s *= in[i];
  }
  return st;
}

std::vector<std::int64_t> dense_strides(const troupe::shape& s) {
  std::vector<std::int64_t> st(s.rank(), 1);
  for (std::size_t d = s.rank(); d-- > 1;) st[d - 1] = st[d] * s[d];
  return st;
}

}  // namespace troupe::exec
