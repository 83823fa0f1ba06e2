#pragma once
// The Mamba2 mixer (HF Mamba2Mixer, llama.cpp's build_mamba2_layer): one input projection to
// z, xBC and dt; a causal depthwise convolution over xBC with its carried window (kernel K, state
// ssm.conv.L: the last K - 1 inputs); SiLU; the selective scan over heads of width P with grouped B/C
// of state size N, dt through its bias and softplus, A = -exp(A_log), its carried state ssm.state.L
// ([H, P, N]); the D skip; y * silu(z) normed per group (RMSNorm over d_inner / G); the output projection.
// Both states are per sequence (state_decl::per_row), bound through the step's state_rows slot.
//
// Weight roles, per layer: ssm_in [2 D + 2 G N + H, hidden], ssm_conv1d [D + 2 G N, K] (HF's
// [C, 1, K] read as it lies), ssm_conv1d_bias, ssm_dt_bias [H], ssm_a (GGUF: A itself, [H] or [H, 1])
// or ssm_a_log (HF), ssm_d [H], ssm_norm [D] (GGUF [G, D / G]), ssm_out [hidden, D].
#include <array>
#include <optional>

#include "families/components/decoder.hpp"
#include "families/model_schema.hpp"
#include "families/weight_map.hpp"

namespace troupe::families {

struct mamba2_params {
  std::int64_t inner = 0;    // D = expand x hidden
  std::int64_t state = 0;    // N
  std::int64_t heads = 0;    // H
  std::int64_t groups = 1;   // G
  std::int64_t conv = 4;     // K
  double norm_eps = 1e-5;    // the gated norm's
  // The gated norm's groups: 0, the B/C groups (HF Mamba2, llama.cpp); 1 spans the whole inner width
  // (HF Bamba and Granite 4's MambaRMSNormGated).
  std::int64_t norm_groups = 0;
  bool gated_norm = true;  // false: y * silu(z) with no norm (Falcon-H1's mamba_rms_norm false; no ssm_norm)
  // A tensor-parallel shard whose one gated-norm group spans this many ranks (each holding inner / ranks
  // of it): the sum of squares is all-reduced over them. 1: the norm's groups are whole here.
  std::int64_t norm_ranks = 1;
  // Falcon-H1's mup multipliers: the input projection's z, x, B, C and dt rows scaled by these (the
  // checkpoint's ssm_multipliers times ssm_in_multiplier), the mixer's output by out_scale.
  std::array<double, 5> in_scale{1.0, 1.0, 1.0, 1.0, 1.0};
  double out_scale = 1.0;
  bool reduce_output = false;  // a tensor-parallel shard (heads and groups split): all_reduce ssm_out's partial sums
  std::int64_t head_dim() const { return heads > 0 ? inner / heads : 0; }
  std::int64_t conv_channels() const { return inner + 2 * groups * state; }
  std::int64_t gated_norm_groups() const { return norm_groups > 0 ? norm_groups : groups; }
};

graph::value_id mamba2_mixer(decoder_trace& d, graph::value_id x, std::int32_t layer, const mamba2_params& p);

// The Mamba2 mixer's per-layer name rules in either form, under `hf_prefix` for HF (its mixer's
// module, "backbone.layers.{L}.mixer.") and blk.{L}. for GGUF, each of presence `p` (the conv bias
// always optional).
void add_mamba2_names(std::vector<name_rule>& t, bool gguf, const std::string& hf_prefix, presence p);

// Whether `r` is one of the Mamba2 mixer's roles (ssm_*), which a tensor-parallel split takes by heads.
bool is_mamba2_role(role r);
// The layer's two per-sequence states: the conv window and the scan state.
void add_mamba2_states(std::vector<state_decl>& states, const mamba2_params& p, std::int64_t layer);

// The shape of a Mamba2 role (hidden size H), or nullopt for one whose stored shape varies by form
// (ssm_conv1d, ssm_a, ssm_d, ssm_norm: their element counts, `mamba2_numel`, are checked instead).
std::optional<troupe::shape> mamba2_shape(role r, const mamba2_params& p, std::int64_t H);
std::optional<std::int64_t> mamba2_numel(role r, const mamba2_params& p);

}  // namespace troupe::families
