#pragma once
// The op set of the graph IR. It is small on purpose: elementwise maths, reductions, movement, two
// matrix products (one over packed weights), row gather/scatter, and a few structured ops a kernel
// needs whole (norms, rotary embedding, attention). Each op has exactly one meaning, the oracle's, and
// one shape rule, `infer`, shared by the builder, the verifier and every lowering.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/dtype.hpp"
#include "engine/core/result.hpp"
#include "engine/core/shape.hpp"
#include "engine/graph/top_k_order.hpp"  // top_k_before

namespace troupe::graph {

struct tensor_type {
  dtype type = dtype::f32;
  troupe::shape dims;
  friend bool operator==(const tensor_type&, const tensor_type&) = default;
  std::string str() const;  // "f32[4, 512]"
};

enum class op : std::uint8_t {
  // Elementwise, one input; the output has the input's type. Float inputs only, except neg/abs.
  neg, abs, exp, log, sqrt, rsqrt, recip, tanh, erf, sigmoid, silu, gelu_tanh,
  // Elementwise, two inputs of one dtype, broadcast NumPy-style (trailing dimensions align).
  add, sub, mul, div, maximum, minimum, pow,
  // Comparisons: two inputs of one dtype, broadcast; the output is boolean.
  equal, less, less_equal, greater,
  // where(cond: boolean, a, b) with broadcasting of all three; a and b share a dtype.
  where,
  // cast(x) to attrs.to; float to integer rounds half to even and saturates. Also f32 [..., 32 n] to q8_0:
  // each 32-value block of the last axis as ggml's quantize_row_q8_0_ref (d = amax / 127 stored as f16,
  // codes round(x / d) half away from zero), the form a q8_0 KV cache is written in.
  cast,
  // Reductions along attrs.axis (keepdim per attrs). softmax/log_softmax keep the shape; arg_max is i32.
  reduce_sum, reduce_max, reduce_mean, softmax, log_softmax, arg_max,
  // Movement. reshape to attrs.target (same element count); transpose by attrs.ints (a permutation);
  // slice attrs.axis over [ints[0], ints[1]); concat along attrs.axis; broadcast to attrs.target.
  reshape, transpose, slice, concat, broadcast,
  // matmul(a [..., M, K], b [..., K, N]) -> [..., M, N]; batch dimensions equal; float, same dtype.
  matmul,
  // linear(x [..., K], w [N, K] in any stored format incl. GGUF blocks) -> [..., N] in x's dtype: x W^T.
  linear,
  // gather_rows(table [R, C] in any stored format, ids integer [...]) -> [..., C], f32 for every float or
  // block table (an embedding lookup starts the f32 residual stream), the table's dtype for an integer
  // table. An id outside [0, R) is an error of the step, never a read out of bounds.
  gather_rows,
  // scatter_rows(dst [R, ...], ids integer [N], src [N, ...]) -> dst with row ids[i] replaced by src[i]
  // (rows of any plain dtype, or of q8_0 blocks);
  // a negative id skips its row (padding). Ids must be distinct.
  scatter_rows,
  // rms_norm(x [..., N], w [N]) = x / sqrt(mean(x^2) + eps) * w.
  rms_norm,
  // layer_norm(x [..., N], w [N], b [N]) = (x - mean) / sqrt(var + eps) * w + b.
  layer_norm,
  // rope(x [T, H, D], pos integer [T], inv_freq f32 [R/2]) rotates the first R dims of each head by
  // angle pos * inv_freq (cos and sin scaled by attrs.scale); attrs.neox pairs (i, i + R/2), otherwise
  // adjacent pairs (2i, 2i + 1). The remaining D - R dims pass through.
  rope,
  // attention(q [N, Hq, D], k [S, Hkv, D], v [S, Hkv, Dv], index integer [R, C], allow boolean [R, T, C])
  // -> [N, Hq, Dv] with N = R x T: attention over a KV map. Query n = r T + t (head h) reads the keys
  // and values at rows index[r, c] of k and v for every c with allow[r, t, c], through kv head
  // h / (Hq / Hkv). Scores are q.k * attrs.scale, then softcap * tanh(s / softcap) when attrs.softcap
  // > 0; a query with no allowed key yields zeros. An index outside [0, S) where allowed is an error
  // of the step; where not allowed it is never read. An optional sixth input, sinks f32 [Hq] (gpt-oss's
  // attention sinks), adds exp(sinks[h]) to head h's softmax denominator: a logit no value answers.
  // Seven inputs instead: ALiBi (BLOOM, MPT), slopes f32 [Hq] and distances f32 [R, T, C] (each key's
  // position minus the query's), adding slopes[h] * distance to head h's scores after the scale.
  // With attrs.ints = {Dv'} (1 <= Dv' <= Dv) the values are only the first Dv' dims of each v row and the
  // output is [N, Hq, Dv']: latent attention passes its cache of [c, k_pe] keys as v too, c being the
  // value, so the cache holds c once. Beside f32 queries, k and v may each be stored as f16, bf16 or
  // q8_0 (a KV cache's element types, with whole 32-value blocks per head for q8_0): their values are
  // the decoded ones; the output is f32.
  attention,
  // all_reduce(x) -> x's type: the element-wise sum of x over the ranks of the tensor-parallel group the
  // graph runs in (each rank runs its shard's graph; the executor is given the group). f32 only.
  all_reduce,
  // all_gather(x [..., C]) -> [..., C x attrs.ints[0]]: the group's ranks' x side by side along the last
  // dimension, rank r's at [r C, (r + 1) C) (a vocabulary-split head's logits). f32 only.
  all_gather,
  // pipe_send(x) -> x: hands x to pipeline stage attrs.ints[0] (the executor's pipe collective) and
  // passes it on unchanged, so the stage's graph can output what it sent. f32 only.
  pipe_send,
  // pipe_recv() -> f32 attrs.target: what pipeline stage attrs.ints[0] sent (the activations a stage
  // starts from). No inputs; never folded.
  pipe_recv,
  // top_k(x [..., E]) -> i32 [..., k] with k = attrs.ints[0] in [1, E]: the indices of each row's k
  // largest elements, largest first; equal values in index order (the lower first, as llama.cpp's
  // argsort-based top-k); NaN ranks below every number. Float x only.
  top_k,
  // take_along(x [..., E], idx integer [..., k]) -> x's dtype [..., k]: out[..., j] = x[..., idx[..., j]]
  // (NumPy's take_along_axis over the last axis; the leading dimensions equal). An index outside
  // [0, E) is an error of the step.
  take_along,
  // linear_id(x [T, K] or [T, k, K], w [E, N, K] in any stored format, ids integer [T, k]) -> f32
  // [T, k, N]: out[t, j] = x[t] (or x[t, j]) W[ids[t, j]]^T, computing only the selected experts'
  // products (ggml's mul_mat_id). A negative id selects nothing: its output row is zero (an expert
  // another rank of an expert-parallel group holds). An id at or past E is an error of the step.
  linear_id,
  // Recurrent mixers (engine/graph/recurrent_math.hpp has their meaning, written once). Each row of a
  // step is a sequence: its real tokens are those with write[r T + t] >= 0; its carried state is row
  // rows[r] of the state pool, or zeros when its first real token is at position 0; rows[r] < 0 is a
  // padding row. The output packs, per row, every token's output and then the row's new state.
  // ssm_conv(x f32 [R, T, C], state f32 [S, (K-1) C], rows, pos, write integer [R] / [R T] / [R T],
  //          w f32 [C, K]) -> f32 [R, T C + (K-1) C]: the causal depthwise convolution over the row's
  //          window of K-1 earlier inputs and its tokens (no bias; the new window is the last K-1 inputs).
  ssm_conv,
  // ssm_scan(x f32 [R, T, H, P], dt f32 [R, T, H], A f32 [H], B f32 [R, T, G, N], C f32 [R, T, G, N],
  //          state f32 [S, H P N], rows, pos, write) -> f32 [R, T H P + H P N]: Mamba2's selective scan,
  //          per token s = exp(softplus(dt) A) s + softplus(dt) x B^T, y = s C (head h reads group
  //          h / (H / G)).
  ssm_scan,
  // delta_rule(q f32 [R, T, Hk, Dk], k f32 [R, T, Hk, Dk], v f32 [R, T, H, Dv], g f32 [R, T, H],
  //            beta f32 [R, T, H], state f32 [S, H Dv Dk], rows, pos, write) -> f32 [R, T H Dv + H Dv Dk]:
  //            the gated delta rule (Gated DeltaNet), per head h (reading key head h / (H / Hk)) and
  //            real token: S = e^g S; S += beta (v - S k) k^T; o = S q (S is [Dv, Dk]).
  delta_rule,
};

std::string_view op_name(op o);

// Attributes of an equation. Only the fields an op's comment names are meaningful for it.
struct op_attrs {
  std::int64_t axis = 0;
  bool keepdim = false;
  bool neox = false;
  dtype to = dtype::f32;
  double eps = 0.0;
  double scale = 1.0;
  double softcap = 0.0;
  std::vector<std::int64_t> ints;
  troupe::shape target;
  friend bool operator==(const op_attrs&, const op_attrs&) = default;
};

// The shape rule of every op: the output type for these input types and attributes, or why none.
result<tensor_type, std::string> infer(op o, std::span<const tensor_type> inputs, const op_attrs& attrs);

// Number of inputs an op takes; concat takes one or more (returns -1).
int arity(op o);

}  // namespace troupe::graph
