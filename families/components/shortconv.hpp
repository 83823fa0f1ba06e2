#pragma once
// The gated short convolution of LFM2 (HF Lfm2ShortConv, llama.cpp's build_shortconv_block): one input
// projection to [B | C | x] (each of width C = hidden), B * x through a causal depthwise convolution
// of kernel K over the sequence's carried window (the last K - 1 inputs, state conv.L, per sequence),
// times C, then the output projection. No nonlinearity, no bias.
//
// Weight roles, per layer: ssm_in [3 C, hidden], ssm_conv1d [C, K] (HF's [C, 1, K] read as it lies),
// ssm_out [hidden, C].
#include <cstdint>
#include <optional>

#include "families/components/decoder.hpp"
#include "families/model_schema.hpp"

namespace troupe::families {

struct shortconv_params {
  std::int64_t channels = 0;  // C (the hidden size)
  std::int64_t conv = 3;      // K (conv_L_cache)
};

graph::value_id shortconv_mixer(decoder_trace& d, graph::value_id x, std::int32_t layer, const shortconv_params& p);
void add_shortconv_states(std::vector<state_decl>& states, const shortconv_params& p, std::int64_t layer);
// The shape of a short-convolution role (hidden size H), or nullopt for others; ssm_conv1d's element
// count (its stored shape varies by form) is shortconv_numel's.
std::optional<troupe::shape> shortconv_shape(role r, const shortconv_params& p, std::int64_t H);
std::int64_t shortconv_numel(const shortconv_params& p);

}  // namespace troupe::families
