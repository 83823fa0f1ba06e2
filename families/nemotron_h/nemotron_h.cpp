// Nemotron-H (HF model_type nemotron_h, GGUF architectures nemotron_h and nemotron_h_moe): a hybrid
// whose layers are each one block behind their own RMSNorm and a residual add: a Mamba2 mixer (M),
// attention without any positional encoding (*), a plain MLP with squared ReLU (-), or (the routed
// variant, Nemotron 3 Nano) a routed block (E): sigmoid scores over n_routed_experts, the top k chosen
// by the scores plus e_score_correction_bias (group-limited over n_group / topk_group), weighted by the
// scores renormalized (norm_topk_prob) and times routed_scaling_factor, experts of up and down with
// squared ReLU, and one ungated shared expert of the same shape. HF names the pattern
// (hybrid_override_pattern); llama.cpp's GGUF keeps it as per-layer arrays: head_count_kv 0 and
// feed_forward_length 0 make a Mamba2 layer, feed_forward_length 0 alone an attention layer, and a
// feed-forward layer routes when the file has experts. The latent projections of Nemotron 3 Super
// (moe_latent_size) are refused by name.
#include <cmath>

#include "families/components/config_reader.hpp"
#include "families/components/decoder_config.hpp"
#include "families/components/moe.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

using kind = dense_decoder_spec::layer_kind;

std::vector<name_rule> names(bool gguf, std::int64_t experts) {
  std::vector<name_rule> t;
  auto global = [&](role r, const char* key, presence p = presence::required, role tied = role::none) { t.push_back({r, false, key, p, tied}); };
  auto layer = [&](role r, std::string key, presence p = presence::optional, std::int64_t stack = 0) {
    t.push_back({r, true, std::move(key), p, role::none, stored_as::as_is, stack});
  };
  const std::string L = gguf ? "blk.{L}." : "backbone.layers.{L}.mixer.";
  global(role::token_embd, gguf ? "token_embd.weight" : "backbone.embeddings.weight");
  global(role::output, gguf ? "output.weight" : "lm_head.weight", presence::tied, role::token_embd);
  global(role::output_norm, gguf ? "output_norm.weight" : "backbone.norm_f.weight");
  layer(role::attn_norm, gguf ? "blk.{L}.attn_norm.weight" : "backbone.layers.{L}.norm.weight", presence::required);
  for (auto [r, g, h] : {std::tuple{role::attn_q, "attn_q.weight", "q_proj.weight"}, {role::attn_k, "attn_k.weight", "k_proj.weight"},
                         {role::attn_v, "attn_v.weight", "v_proj.weight"}, {role::attn_output, "attn_output.weight", "o_proj.weight"},
                         {role::attn_output_bias, "attn_output.bias", "o_proj.bias"}, {role::ffn_up, "ffn_up.weight", "up_proj.weight"},
                         {role::ffn_down, "ffn_down.weight", "down_proj.weight"}, {role::ffn_up_bias, "ffn_up.bias", "up_proj.bias"},
                         {role::ffn_down_bias, "ffn_down.bias", "down_proj.bias"}})
    layer(r, L + (gguf ? g : h));
  add_mamba2_names(t, gguf, "backbone.layers.{L}.mixer.", presence::optional);  // each layer's block is checked by kind
  if (experts > 0) {  // the routed blocks (checked by the decoder)
    for (auto [r, g, h] : {std::tuple{role::ffn_gate_inp, "ffn_gate_inp.weight", "gate.weight"},
                           {role::exp_probs_b, "exp_probs_b.bias", "gate.e_score_correction_bias"},
                           {role::ffn_up_shexp, "ffn_up_shexp.weight", "shared_experts.up_proj.weight"},
                           {role::ffn_down_shexp, "ffn_down_shexp.weight", "shared_experts.down_proj.weight"}})
      layer(r, L + (gguf ? g : h));
    if (gguf) {
      layer(role::ffn_up_exps, L + "ffn_up_exps.weight");
      layer(role::ffn_down_exps, L + "ffn_down_exps.weight");
    } else {  // one tensor per expert, stacked
      layer(role::ffn_up_exps, L + "experts.{E}.up_proj.weight", presence::optional, experts);
      layer(role::ffn_down_exps, L + "experts.{E}.down_proj.weight", presence::optional, experts);
    }
  }
  return t;
}

// The routed blocks' configuration (`experts` 0: none), from either form.
result<moe_params, config_error> read_routing(const config_reader& r) {
  moe_params m;
  auto experts = r.count_or("n_routed_experts", "expert_count", 0);
  if (!experts) return unexpected(experts.error());
  if (*experts == 0) return m;
  auto used = r.positive("num_experts_per_tok", "expert_used_count");
  auto width = r.positive("moe_intermediate_size", "expert_feed_forward_length");
  auto shared = r.count_or("moe_shared_expert_intermediate_size", "expert_shared_feed_forward_length", 0);
  auto shared_count = r.count_or("n_shared_experts", "expert_shared_count", 1);
  auto norm = r.flag_or("norm_topk_prob", "expert_weights_norm", true);
  auto scale = r.number_or("routed_scaling_factor", "expert_weights_scale", 1.0);
  auto groups = r.count_or("n_group", "expert_group_count", 1);
  auto groups_used = r.count_or("topk_group", "expert_group_used_count", 1);
  if (auto e = first_error(used, width, shared, shared_count, norm, scale, groups, groups_used)) return unexpected(*e);
  if (r.raw().has(r.key("moe_latent_size", "moe_latent_size"))) return unexpected(r.error(r.key("moe_latent_size", "moe_latent_size"), "latent expert projections are not supported"));
  if (*experts > 4096 || *used > *experts)
    return unexpected(r.error(r.key("num_experts_per_tok", "expert_used_count"), "must lie in [1, experts] (at most 4096 experts)"));
  if (*shared_count > 1) return unexpected(r.error(r.key("n_shared_experts", "expert_shared_count"), "at most one shared expert is supported"));
  if (*width > (std::int64_t{1} << 20) || *shared > (std::int64_t{1} << 20))
    return unexpected(r.error(r.key("moe_intermediate_size", "expert_feed_forward_length"), "past the bound of 2^20"));
  if (!(std::isfinite(*scale) && *scale >= 0)) return unexpected(r.error(r.key("routed_scaling_factor", "expert_weights_scale"), "must be a non-negative number"));
  if (*groups > 1 && (*experts % *groups != 0 || *groups_used < 1 || *groups_used > *groups))
    return unexpected(r.error(r.key("n_group", "expert_group_count"), "groups must divide the experts, and topk_group lie in [1, groups]"));
  m.experts = *experts;
  m.used = *used;
  m.width = *width;
  m.gate = gating::sigmoid;
  m.norm_topk = *norm;
  m.routed_scale = *scale == 0.0 ? 1.0 : *scale;  // llama.cpp: 0 means unscaled
  m.act = activation::relu_sqr;
  m.shared_width = *shared_count > 0 ? *shared : 0;
  m.shared_gate_proj = false;
  m.shared_gated = false;
  if (*groups > 1) m.groups = *groups, m.groups_used = *groups_used;
  return m;
}

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "nemotron_h");
  auto fail = [](config_error e) { return unexpected(model_error{std::move(e)}); };
  auto hidden = r.positive("hidden_size", "embedding_length");
  auto layers = r.positive("num_hidden_layers", "block_count");
  auto heads = r.positive("num_attention_heads", "attention.head_count");
  auto state = r.positive("ssm_state_size", "ssm.state_size");
  auto groups = r.positive_or("n_groups", "ssm.group_count", 1);
  auto conv = r.positive_or("conv_kernel", "ssm.conv_kernel", 4);
  auto eps = r.number_or("layer_norm_epsilon", "attention.layer_norm_rms_epsilon", 1e-5);
  auto positions = r.positive_or("max_position_embeddings", "context_length", 4096);
  auto routing = read_routing(r);
  if (auto e = first_error(hidden, layers, heads, state, groups, conv, eps, positions, routing)) return fail(*e);
  const std::int64_t L = *layers;
  const bool routed = routing->experts > 0;
  if (L > static_cast<std::int64_t>(store.size())) return fail(r.error(r.key("num_hidden_layers", "block_count"), "more layers than tensors"));
  std::vector<kind> kinds(static_cast<std::size_t>(L), kind::mamba2);
  std::int64_t kv_heads = 0, head_dim = 0, ffn = 0, inner = 0, ssm_heads = 0;
  if (r.gguf()) {
    auto kv = r.raw().get_int_array(r.key("", "attention.head_count_kv"));
    auto ff = r.raw().get_int_array(r.key("", "feed_forward_length"));
    if (!kv || !ff || static_cast<std::int64_t>(kv->size()) != L || static_cast<std::int64_t>(ff->size()) != L)
      return fail(r.error(r.key("", "attention.head_count_kv"), "head_count_kv and feed_forward_length must be arrays of one value per layer"));
    for (std::int64_t l = 0; l < L; ++l) {
      const auto k = (*kv)[static_cast<std::size_t>(l)], f = (*ff)[static_cast<std::size_t>(l)];
      if (k < 0 || f < 0) return fail(r.error(r.key("", "feed_forward_length"), "negative sizes"));
      kinds[static_cast<std::size_t>(l)] = f > 0 ? kind::ffn_only : k > 0 ? kind::attention_only : kind::mamba2;
      if (k > 0) {
        if (kv_heads != 0 && kv_heads != k) return fail(r.error(r.key("", "attention.head_count_kv"), "attention layers must share their KV heads"));
        kv_heads = k;
      }
      if (f > 0) {
        if (ffn != 0 && ffn != f) return fail(r.error(r.key("", "feed_forward_length"), "MLP layers must share their width"));
        ffn = f;
      }
    }
    auto hd = r.positive_or("", "attention.key_length", *hidden / *heads);
    auto i = r.positive("", "ssm.inner_size");
    auto h = r.positive("", "ssm.time_step_rank");
    if (auto e = first_error(hd, i, h)) return fail(*e);
    head_dim = *hd;
    inner = *i;
    ssm_heads = *h;
  } else {
    const auto pattern = r.text("hybrid_override_pattern", "");
    if (!pattern || static_cast<std::int64_t>(pattern->size()) != L)
      return fail(r.error("hybrid_override_pattern", "must name each of the " + std::to_string(L) + " layers (M, * or -)"));
    for (std::int64_t l = 0; l < L; ++l) {
      const char c = (*pattern)[static_cast<std::size_t>(l)];
      if (c != 'M' && c != '*' && c != '-' && c != 'E') return fail(r.error("hybrid_override_pattern", std::string("unknown layer kind '") + c + "'"));
      if ((c == 'E') != routed && (c == 'E' || c == '-'))
        return fail(r.error("hybrid_override_pattern", routed ? "a routed model's feed-forward layers are E" : "E needs n_routed_experts"));
      kinds[static_cast<std::size_t>(l)] = c == 'M' ? kind::mamba2 : c == '*' ? kind::attention_only : kind::ffn_only;
    }
    auto kv = r.positive_or("num_key_value_heads", "", *heads);
    auto hd = r.positive_or("head_dim", "", *hidden / *heads);
    auto ff = routed ? r.positive_or("intermediate_size", "", routing->width) : r.positive("intermediate_size", "");
    auto mh = r.positive("mamba_num_heads", "");
    auto md = r.positive("mamba_head_dim", "");
    if (auto e = first_error(kv, hd, ff, mh, md)) return fail(*e);
    const auto act = r.text("mlp_hidden_act", "").value_or("relu2");
    if (act != "relu2") return fail(r.error("mlp_hidden_act", "only relu2 is supported"));
    kv_heads = *kv;
    head_dim = *hd;
    ffn = *ff;
    ssm_heads = *mh;
    inner = *mh * *md;
  }
  constexpr std::int64_t bound = std::int64_t{1} << 20;
  for (auto [v, what] : {std::pair{*hidden, "hidden_size"}, {inner, "inner size"}, {*state, "state size"}, {ssm_heads, "mamba heads"},
                         {ffn, "intermediate_size"}, {head_dim, "head_dim"}, {*heads, "heads"}})
    if (v > bound) return fail(r.error(what, std::to_string(v) + " is past the bound of " + std::to_string(bound)));
  if (ssm_heads < 1 || inner % ssm_heads != 0 || ssm_heads % *groups != 0)
    return fail(r.error(r.key("mamba_num_heads", "ssm.time_step_rank"), "mamba heads must divide the inner size and be a multiple of the groups"));
  if (kv_heads > 0 && *heads % kv_heads != 0) return fail(r.error(r.key("num_key_value_heads", "attention.head_count_kv"), "heads must be a multiple of KV heads"));
  if (*conv < 2 || *conv > 64) return fail(r.error(r.key("conv_kernel", "ssm.conv_kernel"), "the kernel must lie in [2, 64]"));

  std::int64_t vocab = 0;
  if (r.gguf()) {
    const auto embd = store.find("token_embd.weight");
    if (!embd || embd->shape().rank() != 2) return fail(r.error("token_embd.weight", "missing: it gives the vocabulary size"));
    vocab = embd->shape()[0];
  } else {
    auto v = r.positive("vocab_size", "");
    if (!v) return fail(v.error());
    vocab = *v;
  }
  // No positional encoding (basics.rope.dims 0): the Mamba2 layers carry order.
  const decoder_basics basics{vocab, *hidden, ffn, L, *heads, kv_heads > 0 ? kv_heads : *heads, head_dim, *positions, *eps};
  auto s = uniform_spec("nemotron_h", basics, r);
  s.config.kv_elems_per_token_per_layer = 2 * kv_heads * head_dim;  // 0 without an attention layer
  s.ffn.gated = false;
  s.ffn.act = activation::relu_sqr;
  s.kinds = kinds;
  s.mamba2 = mamba2_params{inner, *state, ssm_heads, *groups, *conv, *eps};
  if (routed) {  // every feed-forward layer routes
    s.moe.assign(static_cast<std::size_t>(L), moe_params{});
    for (std::int64_t l = 0; l < L; ++l)
      if (kinds[static_cast<std::size_t>(l)] == kind::ffn_only) s.moe[static_cast<std::size_t>(l)] = *routing;
  }
  auto m = make_dense_decoder(std::move(s), store, names(r.gguf(), routing->experts));
  if (!m) return m;
  // Each layer's block must be whole (the name table holds every block's roles as optional).
  for (std::int64_t l = 0; l < L; ++l) {
    const auto k = kinds[static_cast<std::size_t>(l)];
    if (k == kind::mamba2 || (k == kind::ffn_only && routed)) continue;  // checked by the decoder
    const auto need = k == kind::attention_only ? std::vector<role>{role::attn_q, role::attn_k, role::attn_v, role::attn_output}
                                                : std::vector<role>{role::ffn_up, role::ffn_down};
    if (auto e = missing_in_layer((*m)->weights(), l, need)) return unexpected(std::move(*e));
  }
  return m;
}

constexpr family_key keys[] = {{load::config_source::hf_json, "nemotron_h"}, {load::config_source::gguf, "nemotron_h"},
                               {load::config_source::gguf, "nemotron_h_moe"}};

}  // namespace

const family_entry nemotron_h_entry{"nemotron_h", keys, build};

}  // namespace troupe::families
