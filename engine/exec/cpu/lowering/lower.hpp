#pragma once
// The CPU executor's lowering, one file per op family (lower_elementwise.cpp, lower_reduce.cpp,
// lower_movement.cpp, lower_linear.cpp, lower_moe.cpp, lower_collective.cpp, lower_norm_rope.cpp,
// lower_attention.cpp): each turns one equation of a planned entry into an instruction, a closure the
// step runs. Private to engine/exec/cpu; the operand geometry every target shares is
// engine/exec/lowering.hpp.
#include <array>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/compile/fusion.hpp"
#include "engine/compile/passes.hpp"
#include "engine/core/quant.hpp"
#include "engine/core/collective.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "engine/exec/cpu/kernels.hpp"
#include "engine/exec/cpu/matmul.hpp"
#include "engine/exec/cpu/thread_pool.hpp"
#include "engine/exec/executor.hpp"
#include "engine/exec/lowering.hpp"

namespace troupe::exec::cpu::lowering {

using graph::op;
using instr = std::function<std::optional<exec_error>()>;

struct executable {
  const weight_source* weights = nullptr;
  std::map<std::string, tensor> states;
  std::map<std::string, packed_matrix> packed;  // by weight role
  std::map<std::string, std::vector<packed_matrix>> experts;  // a linear_id weight [E, N, K]: one per expert
  // Small weights the steps read in place (norms, biases), copied out of the source's file pages.
  std::map<std::string, tensor> copies;  // by weight role
};

struct entry {
  executable_id exe;
  graph::graph g;
  compile::target_plan tp;  // the pruned graph, its buffer plan and the fusion candidates
  tensor arena;
  std::vector<std::byte*> ptr;  // per value
  std::vector<instr> program;
  std::vector<std::uint32_t> program_eqn;  // the equation each instruction runs (profiling)
  std::deque<packed_matrix> own_packed;  // folded weights packed for this entry (stable addresses)
};

inline std::optional<exec_error> fail(exec_error_code c, std::string where, std::string why) {
  return exec_error{c, std::move(where), std::move(why)};
}

// Calls fn(out_index, in_offsets...) over every element of `out` with per-input strides.
template <std::size_t N, class Fn>
void for_each_broadcast(const troupe::shape& out, const std::array<std::vector<std::int64_t>, N>& strides, Fn&& fn) {
  const std::size_t r = out.rank();
  const std::int64_t n = out.numel();
  if (r == 0) {
    std::array<std::int64_t, N> off{};
    fn(0, off);
    return;
  }
  std::vector<std::int64_t> idx(r, 0);
  std::array<std::int64_t, N> off{};
  for (std::int64_t i = 0; i < n; ++i) {
    fn(i, off);
    for (std::size_t d = r; d-- > 0;) {
      ++idx[d];
      for (std::size_t k = 0; k < N; ++k) off[k] += strides[k][d];
      if (idx[d] < out[d]) break;
      for (std::size_t k = 0; k < N; ++k) off[k] -= strides[k][d] * out[d];
      idx[d] = 0;
    }
  }
}

inline double load_any(dtype t, const std::byte* p, std::int64_t i) {
  switch (t) {
    case dtype::f32: return reinterpret_cast<const float*>(p)[i];
    case dtype::i32: return reinterpret_cast<const std::int32_t*>(p)[i];
    case dtype::i64: return static_cast<double>(reinterpret_cast<const std::int64_t*>(p)[i]);
    case dtype::boolean: return p[i] != std::byte{0};
    default: return load_element(t, p, i);
  }
}

template <class T>
T apply_binary(op o, T a, T b) {
  switch (o) {
    case op::add: return a + b;
    case op::sub: return a - b;
    case op::mul: return a * b;
    case op::div: return a / b;
    case op::maximum: return std::isnan(a) || std::isnan(b) ? static_cast<T>(NAN) : std::max(a, b);  // NaN if either is, as the oracle
    case op::minimum: return std::isnan(a) || std::isnan(b) ? static_cast<T>(NAN) : std::min(a, b);
    default: return a;
  }
}

inline unary_kind to_unary(op o) {
  switch (o) {
    case op::neg: return unary_kind::neg;
    case op::abs: return unary_kind::abs;
    case op::exp: return unary_kind::exp;
    case op::log: return unary_kind::log;
    case op::sqrt: return unary_kind::sqrt;
    case op::rsqrt: return unary_kind::rsqrt;
    case op::recip: return unary_kind::recip;
    case op::tanh: return unary_kind::tanh;
    case op::erf: return unary_kind::erf;
    case op::sigmoid: return unary_kind::sigmoid;
    case op::silu: return unary_kind::silu;
    default: return unary_kind::gelu_tanh;
  }
}

// Runs fn(first, last) over [0, n): as one range, or split into one range per thread of the pool when
// each would hold at least `grain` items (ranges start at multiples of `align`). For the row-wise and
// elementwise ops around the products: a batch of decode rows makes them a few microseconds each,
// which is worth a second thread, and prefill makes them long.
inline void split_range(thread_pool& pool, std::int64_t n, std::int64_t grain, std::int64_t align,
                        const std::function<void(std::int64_t first, std::int64_t last)>& fn) {
  const std::int64_t threads = pool.size();
  if (threads < 2 || n < 2 * grain) {
    if (n > 0) fn(0, n);
    return;
  }
  const std::int64_t parts = std::min<std::int64_t>(threads, n / grain);
  const std::int64_t per = ((n + parts - 1) / parts + align - 1) / align * align;
  pool.parallel_for((n + per - 1) / per, [&](std::int64_t t, int) { fn(t * per, std::min(n, (t + 1) * per)); });
}

// One equation being lowered: where it reads and writes, and what the lowering shares.
struct lower_ctx {
  entry& en;
  executable& ex;
  std::size_t i;  // the equation's index
  const std::vector<std::int64_t>& residual_of;  // per equation: the add's side a linear's epilogue takes, or -1
  const std::vector<std::int64_t>& gated_of;     // per equation: the activation a gated product fuses, or -1
  std::optional<exec_error>& err;                // set, with a null instruction, when the equation is refused
  isa level;
  thread_pool* pool;
  const cpu_options& opt;  // the executor's group and pipe
};

// The equation's context as locals, so that the closures copy what they use: en, ex, g, e, i, where,
// P(value) and T(value) (its bytes and type), out, ot, n, lv, pool_ptr, opt, err, residual_of, gated_of.
#define TROUPE_CPU_LOWERING_LOCALS(c)                                                                     \
  [[maybe_unused]] auto& en = (c).en;                                                                      \
  [[maybe_unused]] auto& ex = (c).ex;                                                                      \
  [[maybe_unused]] const auto& g = (c).en.g;                                                               \
  [[maybe_unused]] const auto& e = g.equations()[(c).i];                                                   \
  [[maybe_unused]] const std::size_t i = (c).i;                                                            \
  [[maybe_unused]] const std::string where = "eqn " + std::to_string(i) + " (" + std::string(graph::op_name(e.code)) + ")"; \
  [[maybe_unused]] auto P = [&en](graph::value_id v) { return en.ptr[v.index]; };                        \
  [[maybe_unused]] auto T = [&g](graph::value_id v) -> const graph::tensor_type& { return g.info(v).type; }; \
  [[maybe_unused]] std::byte* out = P(e.out);                                                              \
  [[maybe_unused]] const auto ot = T(e.out);                                                               \
  [[maybe_unused]] const std::int64_t n = ot.dims.numel();                                                 \
  [[maybe_unused]] const isa lv = (c).level;                                                               \
  [[maybe_unused]] thread_pool* pool_ptr = (c).pool;                                                       \
  [[maybe_unused]] const cpu_options& opt = (c).opt;                                                       \
  [[maybe_unused]] auto& err = (c).err;                                                                    \
  [[maybe_unused]] const auto& residual_of = (c).residual_of;                                              \
  [[maybe_unused]] const auto& gated_of = (c).gated_of

// Each family's lowering of the equation c.i (null and c.err set when it refuses; null alone for an op
// that runs as an alias).
instr lower_elementwise(lower_ctx& c);  // neg, abs, exp, log, sqrt, rsqrt, recip, tanh, erf, sigmoid, silu, gelu_tanh, add, sub, mul, div, maximum, minimum, pow, equal, less, less_equal, greater, where, cast
instr lower_reduce(lower_ctx& c);  // reduce_sum, reduce_max, reduce_mean, arg_max, softmax, log_softmax
instr lower_movement(lower_ctx& c);  // reshape, transpose, slice, concat, broadcast
instr lower_linear(lower_ctx& c);  // matmul, linear, gather_rows
instr lower_moe(lower_ctx& c);  // top_k, take_along, linear_id
instr lower_collective(lower_ctx& c);  // all_reduce, all_gather, pipe_send, pipe_recv
instr lower_norm_rope(lower_ctx& c);  // rms_norm, layer_norm, rope
instr lower_recurrent(lower_ctx& c);  // ssm_conv, ssm_scan, delta_rule
instr lower_attention(lower_ctx& c);  // scatter_rows, attention

// A linear (`le`, equation c.i or the one a fused epilogue takes) as one packed matmul storing into y,
// plus r (the residual epilogue) when set.
instr lower_linear_into(lower_ctx& c, const graph::equation& le, float* y, const float* r);

// Sibling linears: equations `eqns` (c.i the first), each a linear of the same x that runs right after
// the one before it, as one batch of products in one dispatch with one preparation of x (a layer's q,
// k and v; its gate and up). Running the later ones early is safe because nothing between them runs:
// the buffer plan frees nothing between consecutive siblings that still has a reader.
instr lower_linear_group(lower_ctx& c, std::span<const std::size_t> eqns);
// Whether equation b may join a group whose first linear is a.
bool linear_siblings(const graph::graph& g, const graph::equation& a, const graph::equation& b);
// The same for expert products: linear_ids of one x and one set of picks (a routed layer's gate and
// up), run over one grouping of the picks in one dispatch.
instr lower_linear_id_group(lower_ctx& c, std::span<const std::size_t> eqns);
bool linear_id_siblings(const graph::graph& g, const graph::equation& a, const graph::equation& b);

}  // namespace troupe::exec::cpu::lowering
