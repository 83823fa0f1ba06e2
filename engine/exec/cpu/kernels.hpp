#pragma once
// The CPU kernels besides matrix products: attention over a KV map, norms, rotary embedding and the
// activation and row-wise ops the compiler lowers to. Every one matches the oracle's op of the same
// name (engine/graph/ops.hpp) within a stated f32 tolerance, on every isa level.
#include <cstdint>

#include "engine/exec/cpu/isa.hpp"
#include "engine/exec/cpu/thread_pool.hpp"

namespace troupe::exec::cpu {

// The element types a KV cache's keys and values are read in (op::attention): f32, f16, bf16, or
// q8_0 blocks (an f16 scale and 32 int8 codes per 32 values of a head), decoded in registers.
enum class kv_elem : std::uint8_t { f32, f16, bf16, q8_0 };

// attention over a KV map (see op::attention): q [R*T, Hq, D], k [S, Hkv, D], v [S, Hkv, Dv] (both of
// element type `kv`), index [R, C] (rows of k/v), allow [R, T, C] (0/1 bytes), out [R*T, Hq, Dv].
// Online softmax: no score matrix is materialized. Allowed indices are in [0, S) (the caller checks).
struct attention_args {
  const float* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  kv_elem kv = kv_elem::f32;
  const std::int32_t* index = nullptr;
  const std::uint8_t* allow = nullptr;
  float* out = nullptr;
  std::int64_t R = 0, T = 0, C = 0, Hq = 0, Hkv = 0, D = 0, Dv = 0;
  std::int64_t Vw = 0;  // floats between a v row's heads (0: Dv); the values are each head's first Dv
  float scale = 1.0f;
  float softcap = 0.0f;
  const float* sinks = nullptr;  // [Hq]: each head's sink logit in the softmax denominator (null: none)
  // ALiBi (null: none): slopes [Hq] and distances [R, T, C] (key position minus query position);
  // head h's score of key c gains slopes[h] * distance.
  const float* alibi_slopes = nullptr;
  const float* alibi_dist = nullptr;
  // Every token as a decode token (the per-query form over key ranges fixed by the capacity): a
  // speculation verify window, whose logits must be the bits decode would have given. Prefill chunks
  // keep the block form, which gives a token the same bits whatever chunk it is in.
  bool per_token = false;
};
void attention(const attention_args& a, thread_pool& pool, isa level);

// The recurrent mixers' per-row kernels (engine/graph/recurrent_math.hpp has their meaning; these are
// its vector form), over heads [h0, h1) of one step row, `state` its carried state or null for zeros.
// Mamba2's selective scan: x [T, H, P], dt [T, H], A [H], B and C [T, G, N]; out [T H P + H P N].
struct ssm_scan_args {
  const float *x = nullptr, *dt = nullptr, *A = nullptr, *B = nullptr, *C = nullptr, *state = nullptr;
  const std::int32_t* write = nullptr;  // [T]: a token with write < 0 is padding
  std::int64_t T = 0, H = 0, P = 0, G = 0, N = 0;
  float* out = nullptr;
};
void ssm_scan_heads(const ssm_scan_args& a, std::int64_t h0, std::int64_t h1, isa level);
// The gated delta rule: q and k [T, Hk, Dk], v [T, H, Dv], g and beta [T, H]; out [T H Dv + H Dv Dk].
struct delta_rule_args {
  const float *q = nullptr, *k = nullptr, *v = nullptr, *g = nullptr, *beta = nullptr, *state = nullptr;
  const std::int32_t* write = nullptr;
  std::int64_t T = 0, Hk = 0, Dk = 0, H = 0, Dv = 0;
  float* out = nullptr;
};
void delta_rule_heads(const delta_rule_args& a, std::int64_t h0, std::int64_t h1, isa level);
// The causal depthwise convolution over channels [c0, c1) of one row (recurrent_math.hpp ssm_conv_row
// is its meaning): x [T, C], the carried window state [K-1, C] (null: zeros), w_t the weights
// transposed to [K, C]; out [T C + (K-1) C]: each real token's output (padding tokens' rows are left as
// they are), then the row's last K-1 inputs. Channels are lanes, so a row splits over threads by them.
struct ssm_conv_args {
  const float *x = nullptr, *state = nullptr, *w_t = nullptr;
  const std::int32_t* write = nullptr;  // [T]: a token with write < 0 is padding
  std::int64_t T = 0, C = 0, K = 0;
  float* out = nullptr;
};
void ssm_conv_channels(const ssm_conv_args& a, std::int64_t c0, std::int64_t c1, isa level);

// y = x rounded to f16, to nearest even (a KV cache's write).
void to_f16(const float* x, std::int64_t n, std::uint16_t* y, isa level);

// y = x / sqrt(mean(x^2) + eps) * w over rows of n (y may alias x).
void rms_norm(const float* x, const float* w, std::int64_t rows, std::int64_t n, float eps, float* y, isa level);
// layer norm with weight and bias (y may alias x).
void layer_norm(const float* x, const float* w, const float* b, std::int64_t rows, std::int64_t n, float eps, float* y,
                isa level);
// In place: x [T, H, D], pos [T], inv_freq [half]; rotates the first 2 * half dims of each head.
void rope(float* x, std::int64_t T, std::int64_t H, std::int64_t D, const std::int32_t* pos, const float* inv_freq,
          std::int64_t half, bool neox, float scale, isa level);
// Row-wise softmax / log-softmax over the last axis (y may alias x).
void softmax_rows(const float* x, std::int64_t rows, std::int64_t n, bool log, float* y, isa level);

enum class unary_kind : std::uint8_t { neg, abs, exp, log, sqrt, rsqrt, recip, tanh, erf, sigmoid, silu, gelu_tanh };
void unary(unary_kind k, const float* x, std::int64_t n, float* y, isa level);
// y = a op b over n elements, where a operand marked scalar is read at [0] for every element (the
// innermost run of a broadcast). maximum / minimum give NaN when either side is NaN, as the oracle.
enum class binary_kind : std::uint8_t { add, sub, mul, div, maximum, minimum };
void binary(binary_kind k, const float* a, bool a_scalar, const float* b, bool b_scalar, std::int64_t n, float* y, isa level);
// y = act(g) * u, the gated feed-forward's middle (act: silu or gelu_tanh).
void gated(unary_kind act, const float* g, const float* u, std::int64_t n, float* y, isa level);

}  // namespace troupe::exec::cpu
