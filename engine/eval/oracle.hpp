#pragma once
// The CPU oracle: evaluates any graph op by op in plain code, every float result computed in double
// and rounded once to the value's dtype. It is the reference every executor is tested against and the
// meaning of each op; it is slow on purpose and never chosen by the driver.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/collective.hpp"
#include "engine/core/result.hpp"
#include "engine/core/tensor.hpp"
#include "engine/graph/graph.hpp"

namespace troupe::eval {

// Where weight consts come from: a role to a view of the stored tensor (any dtype, incl. GGUF blocks).
class const_source {
 public:
  virtual ~const_source() = default;
  virtual std::optional<tensor_view> find(const graph::weight_role& role) const = 0;
};

// A const_source over a plain map, for tests and small tools.
class map_const_source final : public const_source {
 public:
  void add(graph::weight_role role, tensor t);
  std::optional<tensor_view> find(const graph::weight_role& role) const override;

 private:
  std::vector<std::pair<graph::weight_role, tensor>> items_;
};

struct eval_inputs {
  std::map<std::string, tensor_view> slots;   // by slot name
  std::map<std::string, tensor_view> states;  // by state name
  const const_source* weights = nullptr;
};

struct eval_options {
  bool keep_values = false;  // keep every intermediate, for debugging and executor comparisons
  collective* group = nullptr;  // the tensor-parallel group a shard's all_reduce ops sum over
  collective* pipe = nullptr;   // the pipeline a stage's pipe_send / pipe_recv ops talk over (rank = stage)
};

struct evaluation {
  std::map<std::string, tensor> outputs;
  std::map<std::string, tensor> states;  // the carried state outputs, by state name
  std::vector<tensor> values;            // every value, when keep_values
};

enum class eval_error_code { missing_slot, missing_state, missing_weight, type_mismatch, index_out_of_range, duplicate_index, division_by_zero, no_group, invalid_witness };

struct eval_error {
  eval_error_code code;
  std::string where;   // "slot positions", "eqn 7 (gather_rows)"
  std::string reason;
  std::string message() const;
};

// Evaluates `g` (which must verify) on the given inputs.
result<evaluation, eval_error> evaluate(const graph::graph& g, const eval_inputs& in, const eval_options& opt = {});

}  // namespace troupe::eval
