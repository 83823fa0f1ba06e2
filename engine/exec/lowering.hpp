#pragma once
#include <functional>
// What every target checks and computes the same way when it lowers a graph and binds a step: the
// value types its kernels compute in, the step's slots against the graph, and the element strides of
// broadcasting and movement ops.
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "engine/core/shape.hpp"
#include "engine/exec/executor.hpp"

namespace troupe::exec {

// The value types the targets compute in: f32, i32, i64 and boolean.
bool computable_type(dtype t);
// The element types a KV cache may be stored in besides f32 (model::with_kv_type): states of these
// types, the casts and scatter_rows that write them and the attention that reads them are lowered.
bool kv_storage_type(dtype t);

// Every value a running equation (`runs`) computes or reads is computable (the stored weights linear
// and gather_rows read excepted), or the unsupported refusal naming the equation and `target`.
std::optional<exec_error> check_value_types(const graph::graph& g, const std::vector<bool>& runs, std::string_view target);

// Every slot of `g` is bound in `in` with its type and shape, or the bad_binding refusal naming it.
std::optional<exec_error> check_slots(const graph::graph& g, const step_inputs& in);

// Every (from, to) pair of an executor::copy_state_rows call lies inside a state of `rows` rows, or
// the bad_binding refusal naming the state and the pair.
std::optional<exec_error> check_state_rows(std::string_view state, std::int64_t rows, std::span<const std::pair<std::int64_t, std::int64_t>> pairs);

// Every witness of `g` (graph.hpp) holds, reading each witness output's bytes through `bytes_of`, or the
// invalid_witness error naming it. Run after a step's program and before any output is read back.
std::optional<exec_error> check_witnesses(const graph::graph& g, const std::function<const std::byte*(graph::value_id)>& bytes_of);

// The operand geometry of op::attention (engine/graph/ops.hpp), as every target's kernel takes it: q
// [R T, Hq, D], keys [S, Hkv, D], value rows Vw wide of which the first Dv are the values, a KV map
// [R, C], an allow mask [R, T, C].
struct attention_geometry {
  std::int64_t Hq = 0, D = 0, Hkv = 0, S = 0, Dv = 0, Vw = 0, R = 0, T = 0, C = 0;
  float scale = 1.0f, softcap = 0.0f;
};
attention_geometry attention_geometry_of(const graph::graph& g, const graph::equation& e);

// The lowering file each op belongs to (engine/exec/<target>/lowering/lower_<family>.cpp): every
// target dispatches an equation by this, so an op added to the graph is classified in one place.
enum class lowering_family { elementwise, reduce, movement, linear, moe, collective, norm_rope, attention, recurrent };
lowering_family lowering_family_of(graph::op code);

// Element strides of `in` over the output shape `out` under NumPy broadcasting (0 where broadcast).
std::vector<std::int64_t> broadcast_strides(const troupe::shape& in, const troupe::shape& out);
// Row-major element strides of `s`.
std::vector<std::int64_t> dense_strides(const troupe::shape& s);

}  // namespace troupe::exec
