#pragma once
// A traced step: a flat, topologically ordered list of single-output equations over typed values with
// static shapes. Values come from slots (what the driver binds each step), weight consts (named by a
// typed role, never by a checkpoint tensor name), literals (small tables the tracer computed), state
// inputs (KV and other carried state, paired with a state output) or equations. A graph is a value:
// immutable once built, produced only by `builder::finish`, checked by `verify`.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/tensor.hpp"
#include "engine/graph/ops.hpp"
#include "engine/graph/weight_roles.hpp"

namespace troupe::graph {

// A value's index in its graph.
struct value_id {
  std::uint32_t index = invalid_index;
  static constexpr std::uint32_t invalid_index = 0xffffffffu;
  bool valid() const { return index != invalid_index; }
  friend bool operator==(value_id, value_id) = default;
};

enum class value_kind : std::uint8_t { slot, weight, literal, state_in, computed };

// What a slot holds. Step inputs are computed by the driver from its own geometry, the same for every
// family; a request input is one a family declares in its schema and is named. hidden_states: the
// target's final hidden state at each token, f32 [tokens, hidden] (a draft program's input, handed
// over by the driver from the target's step).
enum class slot_kind : std::uint8_t {
  token_ids, positions, token_mask, kv_read_map, kv_write_map, state_rows, seq_lens, hidden_states, request_input,
  adapter_rows,  // i32 [rows]: each row's LoRA adapter slot (-1: none), a driver-pass input
};
std::string_view slot_kind_name(slot_kind k);

struct slot {
  slot_kind kind = slot_kind::token_ids;
  std::string name;  // the request input's name; for step inputs the kind's name
  friend bool operator==(const slot&, const slot&) = default;
};

// A typed weight role: attn_q of layer 3, token_embd (layer -1: not per layer).
struct weight_role {
  tensor_role kind = tensor_role::none;
  std::int32_t layer = -1;
  std::string str() const;  // "blk.3.attn_q" style: "layers.3.attn_q" or "token_embd"
  friend bool operator==(const weight_role&, const weight_role&) = default;
};

struct value_info {
  tensor_type type;
  value_kind kind = value_kind::computed;
  std::string label;  // a stable (scope, name) label for dumps and comparisons, e.g. "layers.3.attn_out"
};

struct equation {
  op code = op::add;
  std::vector<value_id> inputs;
  value_id out;
  op_attrs attrs;
};

struct slot_binding { value_id value; graph::slot slot; };
struct weight_binding { value_id value; weight_role role; };
struct literal_binding { value_id value; tensor data; };
struct state_pair { std::string name; value_id in; value_id out; };
struct output_binding { std::string name; value_id value; };
// A validation output (the seed's router witness): an output the executor checks before any readback,
// so a routed graph whose selections went wrong fails its step with a typed error instead of
// producing a wrong token. index_range: every element an integer in [0, bound); finite: no NaN or inf.
enum class witness_check : std::uint8_t { index_range, finite };
struct witness_binding { std::string output; witness_check check; std::int64_t bound = 0; };
// Why the n elements of type t at p fail the witness (f32, i32 or i64), or nothing when they hold.
std::optional<std::string> witness_fails(const witness_binding& w, dtype t, const std::byte* p, std::int64_t n);

class graph {
 public:
  const std::vector<value_info>& values() const { return values_; }
  const std::vector<equation>& equations() const { return eqns_; }
  const std::vector<slot_binding>& slots() const { return slots_; }
  const std::vector<weight_binding>& weights() const { return weights_; }
  const std::vector<literal_binding>& literals() const { return literals_; }
  const std::vector<state_pair>& states() const { return states_; }
  const std::vector<output_binding>& outputs() const { return outputs_; }
  const std::vector<witness_binding>& witnesses() const { return witnesses_; }
  const value_info& info(value_id v) const { return values_[v.index]; }

  // A readable listing, one line per value and equation, for debugging and golden comparisons.
  std::string dump() const;

 private:
  friend class builder;
  friend struct graph_test_access;  // lets the verifier's tests corrupt a graph on purpose
  std::vector<value_info> values_;
  std::vector<equation> eqns_;
  std::vector<slot_binding> slots_;
  std::vector<weight_binding> weights_;
  std::vector<literal_binding> literals_;
  std::vector<state_pair> states_;
  std::vector<output_binding> outputs_;
  std::vector<witness_binding> witnesses_;
};

struct verify_error {
  std::string where;   // "eqn 12 (linear)", "state kv.k.0", "slot positions"
  std::string reason;
  std::string message() const { return where + ": " + reason; }
};

// Checks a graph's invariants: every value defined exactly once and before use, each equation's
// recorded type equal to `infer`'s, slots of known kinds and unique, state pairs of equal types with a
// state input on one side, weights with named roles, outputs defined and uniquely named.
result<void, verify_error> verify(const graph& g);

}  // namespace troupe::graph
