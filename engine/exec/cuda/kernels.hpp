#pragma once
// The CUDA target's graph-op kernels (kernels.cu): plain C++ declarations, so the executor's host code
// includes no CUDA header. Every pointer is a device pointer, every `stream` a cudaStream_t; each
// launcher only enqueues work (no allocation, no synchronization), so an entry's launches can be
// captured into a CUDA graph. Meanings are the oracle's (engine/graph/ops.hpp); values are f32, i32,
// i64 or boolean (one byte), as on the CPU target.
#include <cstdint>

#include "engine/core/dtype.hpp"

namespace troupe::exec::cuda {

// A step's first refusal, written by the kernel that finds it and read back with the outputs. Kernels
// that write carried state (scatter into a KV pool) do nothing once a refusal is set, so a refused
// step leaves the states as the earlier refusal found them.
struct step_flag {
  std::int32_t code = 0;  // flag_code
  std::int32_t eqn = 0;
  std::int64_t value = 0;  // the offending id
  std::int64_t bound = 0;  // the table's rows
};
enum flag_code : std::int32_t {
  flag_none = 0,
  flag_gather_range = 1,   // gather_rows: an id outside [0, rows)
  flag_scatter_range = 2,  // scatter_rows: an id past the rows
  flag_scatter_twice = 3,  // scatter_rows: one slot written twice
  flag_kv_range = 4,       // attention: an allowed index outside [0, S)
  flag_div_zero = 5,       // integer division by zero
  flag_take_range = 6,     // take_along: an index outside [0, E)
  flag_expert_range = 7,   // linear_id: an expert id at or past the experts
  flag_state_row = 8,      // ssm_conv, ssm_scan, delta_rule: a state row at or past the pool's rows
};

// Elementwise operations, the graph's unary, binary, comparison, where and cast ops.
enum class ew : std::int32_t {
  neg, abs, exp, log, sqrt, rsqrt, recip, tanh, erf, sigmoid, silu, gelu_tanh,
  add, sub, mul, div, maximum, minimum, pow,
  equal, less, less_equal, greater,
  where, cast,
};

inline constexpr int max_rank = 8;
// An output shape and, per input, its element strides over it (0 where broadcast), plus a base offset.
struct nd_map {
  std::int32_t rank = 0;
  std::int64_t dims[max_rank] = {};
  std::int64_t strides[3][max_rank] = {};
  std::int64_t base[3] = {};
};

// f32 fast paths: y = op(x); y = op(a, b) with b of n elements, 1 element (scalar) or `row` elements
// (repeated along the last dimension); y = act(g) * u.
void launch_unary_f32(ew op, const float* x, std::int64_t n, float* y, void* stream);
void launch_binary_f32(ew op, const float* a, const float* b, std::int64_t n, std::int64_t b_len, float* y, void* stream);
void launch_gated_f32(ew act, const float* g, const float* u, std::int64_t n, float* y, void* stream);

// Any elementwise op over broadcast inputs of type `in` (for where: inputs 1 and 2; input 0 is the
// boolean condition), output `out` contiguous over the map's shape. Values pass through double as in
// the oracle; a float stored to an integer rounds half to even and saturates.
void launch_elementwise_nd(ew op, dtype in, dtype out, const void* a, const void* b, const void* c, const nd_map& map,
                           void* y, step_flag* flag, std::int32_t eqn, void* stream);

// Reductions along an axis viewed as [outer, len, inner]: sum, max, mean, arg_max (i32 output),
// softmax, log_softmax. `kind` uses ew::add (sum), ew::maximum (max), ew::div (mean), ew::greater
// (arg_max), ew::exp (softmax), ew::log (log_softmax).
void launch_reduce(ew kind, dtype in, dtype out, const void* x, std::int64_t outer, std::int64_t len, std::int64_t inner,
                   void* y, void* stream);

// Movement by element size `es`: y[j] = x[base + sum_d idx_d(j) * strides[0][d]] over the map's shape.
void launch_copy_nd(std::int32_t es, const void* x, const nd_map& map, void* y, void* stream);

// matmul(a [B, M, K], b [B, K, N]) -> [B, M, N], f32.
void launch_matmul_f32(const float* a, const float* b, std::int64_t B, std::int64_t M, std::int64_t K, std::int64_t N,
                       float* y, void* stream);

// Ids of type `t` (i32 or i64) to i32, each checked against [0, rows); an id outside flags `code` and
// becomes 0 (never read out of bounds).
void launch_check_ids(dtype t, const void* ids, std::int64_t count, std::int64_t rows, std::int32_t* ids32, step_flag* flag,
                      std::int32_t eqn, void* stream);
// y[j] = table row ids32[j], `row_bytes` bytes each.
void launch_gather_bytes(const void* table, std::int64_t row_bytes, const std::int32_t* ids32, std::int64_t count, void* y,
                         void* stream);
// scatter_rows: checks every id (range, distinct; a negative id skips its row) and only then, when no
// refusal is set, writes dst's rows ids[j] from src row j. dst is updated in place.
void launch_scatter_rows(dtype t, const void* ids, std::int64_t count, std::int64_t rows, std::int64_t row_bytes,
                         const void* src, void* dst, step_flag* flag, std::int32_t eqn, void* stream);

// dst = src (`bytes` bytes) unless the step's flag holds a refusal: how a step commits a carried state
// computed outside its buffer, so a refused step leaves every state as it was.
void launch_commit(const void* src, std::int64_t bytes, void* dst, const step_flag* flag, void* stream);

// rms_norm (b null) and layer_norm over rows of n.
void launch_norm(const float* x, const float* w, const float* b, std::int64_t rows, std::int64_t n, float eps, float* y,
                 void* stream);

// rope in place on x [T, H, D]: positions of type `pt` (i32 or i64), `half` frequencies.
void launch_rope(float* x, std::int64_t T, std::int64_t H, std::int64_t D, dtype pt, const void* pos, const float* inv_freq,
                 std::int64_t half, bool neox, float scale, void* stream);

// attention over a KV map (op::attention): checks the allowed indices (flag_kv_range) into ix32 [R, C],
// then one flash-style pass per (row, query tile, head): K/V tiles staged in shared memory, online
// softmax, no score matrix. D and Dv at most max_attention_dim.
inline constexpr std::int64_t max_attention_dim = 256;
struct attention_launch {
  const float* q = nullptr;
  const void* k = nullptr;  // [S, Hkv, D] of kv_type (f32, f16, bf16 or q8_0)
  const void* v = nullptr;  // [S, Hkv, Vw] of kv_type
  dtype kv_type = dtype::f32;
  const void* index = nullptr;
  dtype index_type = dtype::i32;
  const std::uint8_t* allow = nullptr;
  std::int32_t* ix32 = nullptr;  // scratch [R, C]
  float* out = nullptr;
  std::int64_t Hq = 0, Hkv = 0, D = 0, Dv = 0, S = 0, R = 0, T = 0, C = 0;
  std::int64_t Vw = 0;  // floats between a v row's heads (0: Dv); the values are each head's first Dv
  float scale = 1.0f, softcap = 0.0f;
  const float* sinks = nullptr;  // [Hq] or null: head h's sink joins its softmax's denominator
  // ALiBi (BLOOM, MPT), or null: head h's score of key c for query n = r T + t gains
  // alibi_slopes[h] * alibi_dist[n C + c] after the scale and the softcap.
  const float* alibi_slopes = nullptr;  // [Hq]
  const float* alibi_dist = nullptr;    // [R, T, C]
  // Decode (T = 1) over a long cache: the keys split into `splits` ranges, a block each, their partial
  // softmax states [max, sum, acc[Dv]] in part [R, Hq, splits, Dv + 2], merged by a second kernel
  // (merge_splits_norm / merge_splits_value). 1: one block reads every key.
  int splits = 1;
  float* part = nullptr;
};
// Key ranges for decode attention over C keys with R x Hq (row, head) blocks: enough that the device's
// multiprocessors (`sms`) get about two blocks each, each range at least 256 keys, at most 64 ranges.
inline int attention_splits(std::int64_t T, std::int64_t C, std::int64_t R, std::int64_t Hq, int sms) {
  if (T != 1 || C < 512) return 1;
  std::int64_t s = (2 * static_cast<std::int64_t>(sms) + R * Hq - 1) / (R * Hq);
  if (s > C / 256) s = C / 256;
  if (s > 64) s = 64;
  return s < 1 ? 1 : static_cast<int>(s);
}
void launch_attention(const attention_launch& a, step_flag* flag, std::int32_t eqn, void* stream);
// cast of f32 rows to q8_0 (a q8_0 KV cache's write): `blocks` blocks of 32 values, each as
// quant::quantize_block_q8_0.
void launch_quantize_q8_0(const float* x, std::int64_t blocks, void* y, void* stream);

// Mixture-of-experts routing (op::top_k, op::take_along; linear_id's GEMV is linear_kernels.hpp's).
// top_k: out [rows, k] i32 = the indices of each f32 row's k first elements in top_k's order.
void launch_top_k(const float* x, std::int64_t rows, std::int64_t E, std::int64_t k, std::int32_t* out, void* stream);
// take_along: out[r, j] = x[r, idx[r, j]] (elements of `es` bytes; idx i32 or i64); an index outside
// [0, E) flags flag_take_range and reads element 0.
void launch_take_along(std::int32_t es, const void* x, std::int64_t rows, std::int64_t E, dtype idx_type, const void* idx,
                       std::int64_t k, void* out, step_flag* flag, std::int32_t eqn, void* stream);
// linear_id's ids (i32 or i64, count of them) to the i32 the GEMV reads: -1 for a negative id (no
// expert: zeros), -1 and flag_expert_range for an id at or past E.
void launch_expert_ids(dtype t, const void* ids, std::int64_t count, std::int64_t E, std::int32_t* ids32, step_flag* flag,
                       std::int32_t eqn, void* stream);

// The recurrent mixers (op::ssm_conv, op::ssm_scan, op::delta_rule; recurrent_kernels.cu), with the
// meaning of engine/graph/recurrent_math.hpp. Each step row r is a sequence: its real tokens are those
// with write[r T + t] >= 0; its carried state is row rows[r] of the pool (S rows), or zeros when its
// first real token is at position 0; rows[r] < 0 is padding (zeros out), rows[r] >= S flags
// flag_state_row. Outputs pack, per row, every token's output and then the row's new state.
struct recurrent_rows {
  const void* rows = nullptr;  // [R], i32 or i64
  dtype rows_type = dtype::i32;
  const std::int32_t* pos = nullptr;    // [R, T]
  const std::int32_t* write = nullptr;  // [R, T]
  std::int64_t R = 0, T = 0, S = 0;
};
inline constexpr std::int64_t max_conv_kernel = 8;    // ssm_conv's K
inline constexpr std::int64_t max_recurrent_lanes = 8; // a state row of at most 8 x 32 = 256 floats
// ssm_conv: x [R, T, C], state [S, (K-1) C], w [C, K] -> y [R, T C + (K-1) C]; a thread per channel.
void launch_ssm_conv(const recurrent_rows& rr, const float* x, const float* state, const float* w, std::int64_t C, std::int64_t K,
                     float* y, step_flag* flag, std::int32_t eqn, void* stream);
// ssm_scan: x [R, T, H, P], dt [R, T, H], A [H], B and Cm [R, T, G, N], state [S, H P N] ->
// y [R, T H P + H P N]; a warp per (row, head, p), lanes over N.
void launch_ssm_scan(const recurrent_rows& rr, const float* x, const float* dt, const float* A, const float* B, const float* Cm,
                     const float* state, std::int64_t H, std::int64_t P, std::int64_t G, std::int64_t N, float* y, step_flag* flag,
                     std::int32_t eqn, void* stream);
// delta_rule: q and k [R, T, Hk, Dk], v [R, T, H, Dv], g and beta [R, T, H], state [S, H Dv Dk] ->
// y [R, T H Dv + H Dv Dk]; a warp per (row, head, state row i < Dv), lanes over Dk.
void launch_delta_rule(const recurrent_rows& rr, const float* q, const float* k, const float* v, const float* g, const float* beta,
                       const float* state, std::int64_t Hk, std::int64_t Dk, std::int64_t H, std::int64_t Dv, float* y, step_flag* flag,
                       std::int32_t eqn, void* stream);

}  // namespace troupe::exec::cuda
