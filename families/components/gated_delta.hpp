#pragma once
// The Gated DeltaNet mixer (Qwen3-Next's linear attention; HF Qwen3NextGatedDeltaNet, llama.cpp's
// build_layer_attn_linear): q, k, v and the output gate z from the input (one fused projection, or
// llama.cpp's attn_qkv + attn_gate), beta and alpha from a second (in_proj_ba); a causal depthwise
// convolution over [q | k | v] with its carried window, SiLU; q and k L2-normalized, q scaled by
// 1 / sqrt(Dk); the gated delta rule (graph::op::delta_rule) with g = -exp(A_log) softplus(alpha +
// dt_bias) and beta = sigmoid(b), over its carried [H, Dv, Dk] state; RMSNorm of each head's output
// times silu(z); the output projection. Value head h reads key head h / (H / Hk), as HF's
// repeat_interleave. Both states are per sequence (state_decl::per_row).
//
// Weight roles, per layer: ssm_in [Hk (2 Dk + 2 r Dv), hidden] (HF in_proj_qkvz and llama.cpp's
// legacy ssm_in: per key head [q Dk | k Dk | v r Dv | z r Dv], r = H / Hk) or attn_qkv [2 Hk Dk + H Dv,
// hidden] with attn_gate [H Dv, hidden]; ssm_ba [Hk 2 r, hidden] (per key head [b r | a r]);
// ssm_conv1d [C, K] (HF [C, 1, K]); ssm_dt_bias [H]; ssm_a (GGUF: -exp(A_log)) or ssm_a_log [H];
// ssm_norm [Dv]; ssm_out [hidden, H Dv].
#include <optional>

#include "families/components/decoder.hpp"
#include "families/model_schema.hpp"

namespace troupe::families {

struct gated_delta_params {
  std::int64_t key_heads = 0;    // Hk
  std::int64_t key_dim = 0;      // Dk
  std::int64_t value_heads = 0;  // H
  std::int64_t value_dim = 0;    // Dv
  std::int64_t conv = 4;         // K
  double norm_eps = 1e-6;        // the gated norm's and the L2 norms'
  bool reduce_output = false;    // a tensor-parallel shard (key heads split): all_reduce ssm_out's partial sums
  std::int64_t key_width() const { return key_heads * key_dim; }
  std::int64_t value_width() const { return value_heads * value_dim; }
  std::int64_t conv_channels() const { return 2 * key_width() + value_width(); }
  std::int64_t ratio() const { return key_heads > 0 ? value_heads / key_heads : 0; }
};

graph::value_id gated_delta_mixer(decoder_trace& d, graph::value_id x, std::int32_t layer, const gated_delta_params& p);

// The layer's two per-sequence states: the conv window (ssm.conv.L) and the delta-rule state (ssm.state.L).
void add_gated_delta_states(std::vector<state_decl>& states, const gated_delta_params& p, std::int64_t layer);

// The shape of a Gated DeltaNet role (hidden size H), or nullopt for one whose stored shape varies by
// form (ssm_conv1d, ssm_a: their element counts, `gated_delta_numel`, are checked instead).
std::optional<troupe::shape> gated_delta_shape(role r, const gated_delta_params& p, std::int64_t H);
std::optional<std::int64_t> gated_delta_numel(role r, const gated_delta_params& p);

}  // namespace troupe::families
