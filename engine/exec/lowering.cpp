#include "engine/exec/lowering.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace troupe::exec {

lowering_family lowering_family_of(graph::op code) {
  using graph::op;
  using enum lowering_family;
  switch (code) {
    case op::reduce_sum:
    case op::reduce_max:
    case op::reduce_mean:
    case op::arg_max:
    case op::softmax:
    case op::log_softmax: return reduce;
    case op::reshape:
    case op::transpose:
    case op::slice:
    case op::concat:
    case op::broadcast: return movement;
    case op::matmul:
    case op::linear:
    case op::gather_rows: return linear;
    case op::top_k:
    case op::take_along:
    case op::linear_id: return moe;
    case op::ssm_conv:
    case op::ssm_scan:
    case op::delta_rule: return recurrent;
    case op::all_reduce:
    case op::all_gather:
    case op::pipe_send:
    case op::pipe_recv: return collective;
    case op::rms_norm:
    case op::layer_norm:
    case op::rope: return norm_rope;
    case op::scatter_rows:
    case op::attention: return attention;
    case op::neg:
    case op::abs:
    case op::exp:
    case op::log:
    case op::sqrt:
    case op::rsqrt:
    case op::recip:
    case op::tanh:
    case op::erf:
    case op::sigmoid:
    case op::silu:
    case op::gelu_tanh:
    case op::add:
    case op::sub:
    case op::mul:
    case op::div:
    case op::maximum:
    case op::minimum:
    case op::pow:
    case op::equal:
    case op::less:
    case op::less_equal:
    case op::greater:
    case op::where:
    case op::cast: return elementwise;
  }
  return elementwise;  // not reached: the switch names every op, and -Wswitch holds it so
}

std::optional<exec_error> check_state_rows(std::string_view state, std::int64_t rows, std::span<const std::pair<std::int64_t, std::int64_t>> pairs) {
  for (const auto& [from, to] : pairs)
    if (from < 0 || to < 0 || from >= rows || to >= rows)
      return exec_error{exec_error_code::bad_binding, "state " + std::string(state),
                        "row " + std::to_string(from) + " -> " + std::to_string(to) + " outside its " + std::to_string(rows) + " rows"};
  return std::nullopt;
}

bool computable_type(dtype t) { return t == dtype::f32 || t == dtype::i32 || t == dtype::i64 || t == dtype::boolean; }
bool kv_storage_type(dtype t) { return t == dtype::f16 || t == dtype::bf16 || t == dtype::q8_0; }

std::optional<exec_error> check_value_types(const graph::graph& g, const std::vector<bool>& runs, std::string_view target) {
  using graph::op;
  for (std::size_t i = 0; i < g.equations().size(); ++i) {
    if (!runs[i]) continue;
    const auto& e = g.equations()[i];
    const auto& t = g.info(e.out).type;
    const std::string where = "eqn " + std::to_string(i) + " (" + std::string(graph::op_name(e.code)) + ")";
    // A KV cache stored as f16, bf16 or q8_0: written by a cast of f32 rows and scatter_rows, read by
    // attention. Nothing else computes in those types.
    const bool kv_write = (e.code == op::cast || e.code == op::scatter_rows) && kv_storage_type(t.type);
    if (!computable_type(t.type) && !kv_write)
      return exec_error{exec_error_code::unsupported, where,
                        "the " + std::string(target) + " target computes in f32 and i32; this value is " + t.str()};
    for (std::size_t j = 0; j < e.inputs.size(); ++j) {
      const auto v = e.inputs[j];
      const bool weight_operand = ((e.code == op::linear || e.code == op::linear_id) && v == e.inputs[1]) ||
                                  (e.code == op::gather_rows && v == e.inputs[0]);
      const bool kv_operand = kv_storage_type(g.info(v).type.type) &&
                              ((e.code == op::attention && (j == 1 || j == 2)) || (e.code == op::scatter_rows && (j == 0 || j == 2)));
      if (!weight_operand && !kv_operand && !computable_type(g.info(v).type.type))
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

attention_geometry attention_geometry_of(const graph::graph& g, const graph::equation& e) {
  const auto& qs = g.info(e.inputs[0]).type.dims;
  const auto& ks = g.info(e.inputs[1]).type.dims;
  const auto& ms = g.info(e.inputs[4]).type.dims;
  attention_geometry a;
  a.Hq = qs[1];
  a.D = qs[2];
  a.Hkv = ks[1];
  a.S = ks[0];
  a.Dv = g.info(e.out).type.dims[2];
  a.Vw = g.info(e.inputs[2]).type.dims[2];
  a.R = ms[0];
  a.T = ms[1];
  a.C = ms[2];
  a.scale = static_cast<float>(e.attrs.scale);
  a.softcap = static_cast<float>(e.attrs.softcap);
  return a;
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
