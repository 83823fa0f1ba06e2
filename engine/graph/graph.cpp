#include "engine/graph/graph.hpp"

#include <cmath>

#include <cstdio>
#include <set>

namespace troupe::graph {

std::string_view slot_kind_name(slot_kind k) {
  switch (k) {
    case slot_kind::token_ids: return "token_ids";
    case slot_kind::positions: return "positions";
    case slot_kind::token_mask: return "token_mask";
    case slot_kind::kv_read_map: return "kv_read_map";
    case slot_kind::kv_write_map: return "kv_write_map";
    case slot_kind::state_rows: return "state_rows";
    case slot_kind::seq_lens: return "seq_lens";
    case slot_kind::hidden_states: return "hidden_states";
    case slot_kind::request_input: return "request_input";
    case slot_kind::adapter_rows: return "adapter_rows";
  }
  return "unknown";
}

std::string weight_role::str() const {
  const std::string name{role_name(kind)};
  return layer >= 0 ? "layers." + std::to_string(layer) + "." + name : name;
}

namespace {

std::string vname(value_id v) { return "%" + std::to_string(v.index); }

std::string attrs_str(op o, const op_attrs& a) {
  std::string s;
  auto add = [&](const std::string& kv) { s += (s.empty() ? "" : ", ") + kv; };
  auto num = [](double d) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", d);
    return std::string(buf);
  };
  auto ints = [&] {
    std::string r = "[";
    for (std::size_t i = 0; i < a.ints.size(); ++i) r += (i ? ", " : "") + std::to_string(a.ints[i]);
    return r + "]";
  };
  switch (o) {
    case op::cast: add("to=" + std::string(name(a.to))); break;
    case op::top_k: if (!a.ints.empty()) add("k=" + std::to_string(a.ints[0])); break;
    case op::all_gather: if (!a.ints.empty()) add("ranks=" + std::to_string(a.ints[0])); break;
    case op::pipe_send: case op::pipe_recv: if (!a.ints.empty()) add("peer=" + std::to_string(a.ints[0])); break;
    case op::reduce_sum: case op::reduce_max: case op::reduce_mean: case op::arg_max:
      add("axis=" + std::to_string(a.axis));
      if (a.keepdim) add("keepdim");
      break;
    case op::softmax: case op::log_softmax: case op::concat: add("axis=" + std::to_string(a.axis)); break;
    case op::reshape: case op::broadcast: add("to=" + a.target.str()); break;
    case op::transpose: add("perm=" + ints()); break;
    case op::slice: add("axis=" + std::to_string(a.axis) + ", range=" + ints()); break;
    case op::rms_norm: case op::layer_norm: add("eps=" + num(a.eps)); break;
    case op::rope: add(a.neox ? "neox" : "interleaved"); if (a.scale != 1.0) add("scale=" + num(a.scale)); break;
    case op::attention: add("scale=" + num(a.scale)); if (a.softcap > 0) add("softcap=" + num(a.softcap)); break;
    default: break;
  }
  return s.empty() ? "" : " {" + s + "}";
}

}  // namespace

std::optional<std::string> witness_fails(const witness_binding& w, dtype t, const std::byte* p, std::int64_t n) {
  if (n > 0 && p == nullptr) return "its value is not available to check";
  for (std::int64_t i = 0; i < n; ++i) {
    double v = 0;
    switch (t) {
      case dtype::f32: v = reinterpret_cast<const float*>(p)[i]; break;
      case dtype::i32: v = reinterpret_cast<const std::int32_t*>(p)[i]; break;
      case dtype::i64: v = static_cast<double>(reinterpret_cast<const std::int64_t*>(p)[i]); break;
      default: return "of dtype " + std::string(name(t)) + ", which no check reads";
    }
    if (w.check == witness_check::finite && !std::isfinite(v)) return "element " + std::to_string(i) + " is not finite";
    if (w.check == witness_check::index_range && !(v >= 0 && v < static_cast<double>(w.bound)))
      return "element " + std::to_string(i) + " = " + std::to_string(static_cast<std::int64_t>(v)) + " outside [0, " +
             std::to_string(w.bound) + ")";
  }
  return std::nullopt;
}

std::string graph::dump() const {
  std::string out;
  for (const auto& s : slots_)
    out += vname(s.value) + " = slot " + std::string(slot_kind_name(s.slot.kind)) + " \"" + s.slot.name + "\" : " +
           info(s.value).type.str() + "\n";
  for (const auto& w : weights_) out += vname(w.value) + " = weight @" + w.role.str() + " : " + info(w.value).type.str() + "\n";
  for (const auto& l : literals_) out += vname(l.value) + " = literal \"" + info(l.value).label + "\" : " + info(l.value).type.str() + "\n";
  for (const auto& s : states_) out += vname(s.in) + " = state \"" + s.name + "\" : " + info(s.in).type.str() + "\n";
  for (const auto& e : eqns_) {
    out += vname(e.out) + " = " + std::string(op_name(e.code)) + "(";
    for (std::size_t i = 0; i < e.inputs.size(); ++i) out += (i ? ", " : "") + vname(e.inputs[i]);
    out += ")" + attrs_str(e.code, e.attrs) + " : " + info(e.out).type.str();
    if (!info(e.out).label.empty()) out += "  # " + info(e.out).label;
    out += "\n";
  }
  for (const auto& s : states_) out += "state \"" + s.name + "\" <- " + vname(s.out) + "\n";
  for (const auto& o : outputs_) out += "output \"" + o.name + "\" = " + vname(o.value) + "\n";
  return out;
}

result<void, verify_error> verify(const graph& g) {
  const auto n = g.values().size();
  std::vector<char> defined(n, 0);
  auto bad = [](std::string where, std::string why) { return unexpected(verify_error{std::move(where), std::move(why)}); };
  auto in_range = [&](value_id v) { return v.valid() && v.index < n; };
  auto define = [&](value_id v, value_kind kind, const std::string& where) -> result<void, verify_error> {
    if (!in_range(v)) return bad(where, "value out of range");
    if (defined[v.index]) return bad(where, vname(v) + " defined twice");
    if (g.info(v).kind != kind) return bad(where, vname(v) + " is of another kind");
    defined[v.index] = 1;
    return {};
  };

  std::set<std::string> names;
  for (const auto& s : g.slots()) {
    const std::string where = "slot " + s.slot.name;
    if (static_cast<int>(s.slot.kind) > static_cast<int>(slot_kind::adapter_rows)) return bad(where, "unknown slot kind");
    if (s.slot.name.empty()) return bad(where, "unnamed slot");
    if (!names.insert(s.slot.name).second) return bad(where, "slot declared twice");
    if (auto r = define(s.value, value_kind::slot, where); !r) return r;
  }
  for (const auto& w : g.weights()) {
    const std::string where = "weight " + w.role.str();
    if (w.role.kind == tensor_role::none) return bad(where, "weight without a role");
    if (auto r = define(w.value, value_kind::weight, where); !r) return r;
  }
  for (const auto& l : g.literals()) {
    const std::string where = "literal " + vname(l.value);
    if (auto r = define(l.value, value_kind::literal, where); !r) return r;
    if (tensor_type{l.data.type(), l.data.shape()} != g.info(l.value).type) return bad(where, "data differs from the value's type");
  }
  names.clear();
  for (const auto& s : g.states()) {
    const std::string where = "state " + s.name;
    if (!names.insert(s.name).second) return bad(where, "state declared twice");
    if (auto r = define(s.in, value_kind::state_in, where); !r) return r;
  }
  for (std::size_t i = 0; i < g.equations().size(); ++i) {
    const auto& e = g.equations()[i];
    const std::string where = "eqn " + std::to_string(i) + " (" + std::string(op_name(e.code)) + ")";
    std::vector<tensor_type> types;
    for (auto v : e.inputs) {
      if (!in_range(v) || !defined[v.index]) return bad(where, "input " + vname(v) + " used before it is defined");
      types.push_back(g.info(v).type);
    }
    auto t = infer(e.code, types, e.attrs);
    if (!t) return bad(where, t.error());
    if (auto r = define(e.out, value_kind::computed, where); !r) return r;
    if (*t != g.info(e.out).type) return bad(where, "recorded type " + g.info(e.out).type.str() + " but infers " + t->str());
  }
  for (std::size_t i = 0; i < n; ++i)
    if (!defined[i]) return bad(vname(value_id{static_cast<std::uint32_t>(i)}), "never defined");
  for (const auto& s : g.states()) {
    const std::string where = "state " + s.name;
    if (!in_range(s.out)) return bad(where, "never written");
    if (g.info(s.out).type != g.info(s.in).type) return bad(where, "carried type differs from the declared type");
  }
  names.clear();
  for (const auto& o : g.outputs()) {
    if (!in_range(o.value)) return bad("output " + o.name, "value out of range");
    if (!names.insert(o.name).second) return bad("output " + o.name, "output declared twice");
  }
  for (const auto& w : g.witnesses()) {
    if (!names.contains(w.output)) return bad("witness " + w.output, "not an output");
    if (w.check == witness_check::index_range && w.bound < 1) return bad("witness " + w.output, "an index range needs a positive bound");
  }
  return {};
}

}  // namespace troupe::graph
