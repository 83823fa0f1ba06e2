#pragma once
// The builder a tracer writes a step through. Each call appends one value or equation and returns a
// data-free handle, so a tracer cannot branch on tensor values and the graph is the same every step.
// Errors are sticky: the first refusal (an ill-typed op, an untraceable shape, an exhausted budget)
// is kept, later calls append nothing, and `finish` returns it instead of a graph. Budgets are checked
// before the append they cover, so a refused trace never holds more than its limits allow.
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "engine/graph/graph.hpp"

namespace troupe::graph {

struct trace_limits {
  std::int64_t tokens = 1 << 20;              // new tokens in one step (rows x tokens per row)
  std::int64_t values = 1 << 22;              // values in the graph
  std::int64_t equations = 1 << 22;           // equations in the graph
  std::int64_t literal_bytes = 64LL << 20;    // bytes of literal tables the tracer embeds
  std::int64_t owned_bytes = 256LL << 20;     // bytes the graph owns in all (records and literals)
};

enum class budget_resource : std::uint8_t { tokens, values, equations, literal_bytes, owned_bytes };
std::string_view resource_name(budget_resource r);

// The typed refusals of tracing. The failure class is the alternative; the specifics are data.
struct budget_exceeded { budget_resource resource; std::int64_t limit; std::int64_t attempted; };
struct ill_typed { std::string op; std::string reason; };          // an op's inputs do not fit its rule
struct unsupported_shape { std::string reason; };                  // the family cannot trace this shape
struct missing_program { std::string program; };                   // the family does not offer it
struct state_mismatch { std::string reason; };                     // declared states != carried states
struct bad_declaration { std::string reason; };                    // a slot, weight or output misdeclared
using trace_error_kind =
    std::variant<budget_exceeded, ill_typed, unsupported_shape, missing_program, state_mismatch, bad_declaration>;

struct trace_error {
  trace_error_kind kind;
  std::string message() const;
};

class builder {
 public:
  explicit builder(trace_limits limits = {});

  // Sources.
  value_id slot(slot_kind kind, const tensor_type& type, std::string name = {});
  value_id weight(const weight_role& role, const tensor_type& type);
  value_id literal(tensor data, std::string label = {});
  value_id scalar(double v, dtype type = dtype::f32);  // a rank-0 literal
  value_id state_input(const std::string& name, const tensor_type& type);
  void state_output(const std::string& name, value_id v);
  void output(const std::string& name, value_id v);
  // An output that is also a witness the executor checks before readback (graph.hpp).
  void witness(const std::string& name, value_id v, witness_check check, std::int64_t bound = 0);

  // Admits `n` new tokens against the token budget (the model's trace calls it before tracing).
  void admit_tokens(std::int64_t n);

  // Ops: one method per op of ops.hpp; each infers the output type or fails the trace.
  value_id unary(op o, value_id x);
  value_id binary(op o, value_id a, value_id b);
  value_id add(value_id a, value_id b) { return binary(op::add, a, b); }
  value_id sub(value_id a, value_id b) { return binary(op::sub, a, b); }
  value_id mul(value_id a, value_id b) { return binary(op::mul, a, b); }
  value_id div(value_id a, value_id b) { return binary(op::div, a, b); }
  value_id where(value_id cond, value_id a, value_id b);
  value_id cast(value_id x, dtype to);
  value_id reduce(op o, value_id x, std::int64_t axis, bool keepdim = false);
  value_id softmax(value_id x, std::int64_t axis = -1);
  value_id log_softmax(value_id x, std::int64_t axis = -1);
  value_id arg_max(value_id x, std::int64_t axis = -1);
  value_id reshape(value_id x, troupe::shape target);
  value_id transpose(value_id x, std::vector<std::int64_t> perm);
  value_id slice(value_id x, std::int64_t axis, std::int64_t begin, std::int64_t end);
  value_id concat(const std::vector<value_id>& xs, std::int64_t axis);
  value_id broadcast(value_id x, troupe::shape target);
  value_id matmul(value_id a, value_id b);
  value_id linear(value_id x, value_id w);
  value_id gather_rows(value_id table, value_id ids);
  value_id scatter_rows(value_id dst, value_id ids, value_id src);
  value_id rms_norm(value_id x, value_id w, double eps);
  value_id layer_norm(value_id x, value_id w, value_id b, double eps);
  value_id rope(value_id x, value_id pos, value_id inv_freq, bool neox, double scale = 1.0);
  // `value_dims` > 0: the values are the first value_dims of each v row (op::attention's attrs.ints).
  value_id attention(value_id q, value_id k, value_id v, value_id index, value_id allow, double scale, double softcap = 0.0,
                     value_id sinks = {}, std::int64_t value_dims = 0);
  value_id all_reduce(value_id x);
  value_id all_gather(value_id x, std::int64_t ranks);
  value_id pipe_send(value_id x, std::int64_t to_stage);
  value_id pipe_recv(troupe::shape dims, std::int64_t from_stage);
  value_id top_k(value_id x, std::int64_t k);
  value_id take_along(value_id x, value_id idx);
  value_id linear_id(value_id x, value_id w, value_id ids);
  value_id ssm_conv(value_id x, value_id state, value_id rows, value_id pos, value_id write, value_id w);
  value_id ssm_scan(value_id x, value_id dt, value_id A, value_id B, value_id C, value_id state, value_id rows, value_id pos,
                    value_id write);
  value_id delta_rule(value_id q, value_id k, value_id v, value_id g, value_id beta, value_id state, value_id rows, value_id pos,
                      value_id write);
  // The general form every method above goes through.
  value_id apply(op o, std::vector<value_id> inputs, op_attrs attrs = {});

  // Labels: values appended inside a scope are labelled "scope.name"; scopes nest.
  void push_scope(std::string name);
  void pop_scope();
  void label(value_id v, const std::string& name);

  // Refuses the trace with a tracer's own typed error (the first error wins).
  void fail(trace_error_kind e);
  bool ok() const { return !error_.has_value(); }
  const std::optional<trace_error>& error() const { return error_; }
  const tensor_type& type_of(value_id v) const;
  std::int64_t owned_bytes() const { return owned_; }

  // The graph, verified, or the first refusal. The builder is consumed.
  result<graph, trace_error> finish() &&;

 private:
  bool charge_value(std::size_t label_bytes);
  value_id add_value(const tensor_type& type, value_kind kind, std::string label);
  std::string scoped(const std::string& name) const;
  bool check_handles(const std::vector<value_id>& vs);

  trace_limits limits_;
  graph g_;
  std::optional<trace_error> error_;
  std::vector<std::string> scopes_;
  std::int64_t tokens_ = 0;
  std::int64_t literal_bytes_ = 0;
  std::int64_t owned_ = 0;
  tensor_type none_;
};

}  // namespace troupe::graph
