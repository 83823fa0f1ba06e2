#pragma once
// The mixture-of-experts feed-forward every routed family shares: a router (softmax or sigmoid scores
// over the experts, the top k, optional renormalization and scaling), the routed experts computed only
// where selected (graph::op::linear_id, grouped by expert on the targets), and optional shared experts
// that every token runs (gated by a sigmoid, as Qwen2-MoE). Which layers route and how is data
// (`moe_params` per layer); a dense layer of a routed model keeps the plain feed-forward.
//
// Weight roles read here, per layer: ffn_gate_inp [E, H] (the router), ffn_gate_exps and ffn_up_exps
// [E, F, H], ffn_down_exps [E, H, F]; for shared experts ffn_gate_shexp, ffn_up_shexp [Fs, H],
// ffn_down_shexp [H, Fs] and optionally ffn_gate_inp_shexp [H] (the shared expert's gate), and
// exp_probs_b [E] (DeepSeek-V3's selection bias: added to the scores to choose, not to weigh); biases
// when present: ffn_gate_inp_bias [E] on the router's scores, ffn_{gate,up}_exps_bias [E, F] and
// ffn_down_exps_bias [E, H] on each selected expert's products (gpt-oss). The
// router's selections are witnesses (graph.hpp): every index in [0, E), every weight finite.
#include <cstdint>
#include <optional>

#include "engine/load/weight_store.hpp"
#include "families/components/config_reader.hpp"
#include "families/components/decoder.hpp"

namespace troupe::families {

// softmax_selected: the top k of the raw scores, their weights a softmax over those k (gpt-oss;
// llama.cpp's SOFTMAX_WEIGHT).
enum class gating : std::uint8_t { softmax, sigmoid, softmax_selected };

struct moe_params {
  std::int64_t experts = 0;  // 0: a dense layer
  std::int64_t used = 0;     // experts per token (k)
  std::int64_t width = 0;    // one expert's intermediate size
  gating gate = gating::softmax;
  bool norm_topk = true;       // the k selected weights renormalized to sum to 1
  double routed_scale = 1.0;   // every routed weight times this (routed_scaling_factor)
  activation act = activation::silu;
  std::int64_t shared_width = 0;  // the shared experts' intermediate size (0: none)
  bool shared_gate_proj = true;   // the shared experts have a gate projection (ffn_gate_shexp); else act(up) (Nemotron-H)
  bool shared_gated = false;      // sigmoid(x . ffn_gate_inp_shexp) scales the shared experts' output
  bool reduce_output = false;     // a tensor-parallel shard (each expert's width split): all_reduce the output
  // Group-limited selection (DeepSeek-V2 group_limited_greedy, V3 noaux_tc): the experts in `groups`
  // equal groups, each scored by its best expert (max) or its best two summed (top2_sum, V3 and
  // llama.cpp), the best `groups_used` groups kept and the top k chosen among their experts. 0: off.
  std::int64_t groups = 0, groups_used = 0;
  // An expert-parallel shard holds experts [expert_offset, expert_offset + local_experts) of the
  // `experts` the router scores; others' picks give zeros here (0: all experts are here).
  std::int64_t expert_offset = 0, local_experts = 0;
  enum class group_score : std::uint8_t { max, top2_sum } group_rule = group_score::top2_sum;
};

// How a family's checkpoints spell the routing options: the HF and GGUF keys of each.
struct moe_keys {
  const char* experts_hf = "num_experts";
  const char* used_hf = "num_experts_per_tok";
  const char* width_hf = "moe_intermediate_size";  // "" : the dense intermediate_size
  const char* norm_hf = "norm_topk_prob";          // "" : always renormalized
  bool norm_default = true;
  const char* shared_width_hf = "";                // "" : no shared experts
  const char* sparse_step_hf = "";                 // decoder_sparse_step ("" : every layer routes)
  const char* dense_layers_hf = "";                // mlp_only_layers ("" : none)
};

// Reads the routing configuration of every layer (experts = 0 for a dense one) from either form, or
// the refusal naming the key. `layers` and `dense_ffn` come from the decoder basics.
result<std::vector<moe_params>, config_error> read_moe(const config_reader& r, const moe_keys& keys, std::int64_t layers,
                                                       std::int64_t dense_ffn);

// The experts of a model's routed layers (the most of any layer; 0: none is routed): what its name
// table stacks HF's per-expert tensors over.
std::int64_t routed_experts(const std::vector<moe_params>& layers);

// The routed feed-forward of one layer over x [N, H].
graph::value_id moe_feed_forward(decoder_trace& d, graph::value_id x, std::int32_t layer, const moe_params& p);

// The expected shape of each routed role of a layer with `p` (hidden size H), or nullopt for others.
std::optional<troupe::shape> moe_shape(role r, const moe_params& p, std::int64_t H);

}  // namespace troupe::families
