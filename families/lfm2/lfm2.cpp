// LFM2 (HF model_type lfm2, GGUF architecture lfm2): Liquid's hybrid of gated short convolutions and
// attention. Each layer is RMSNorm (operator_norm), either a short convolution (components/shortconv.hpp)
// or GQA attention with per-head RMSNorm on q and k and NeoX rope, a residual add, RMSNorm and a SwiGLU
// (w1 gate, w3 up, w2 down), a residual add; the final norm (HF embedding_norm, GGUF token_embd_norm)
// and the head tied to the embedding unless the checkpoint has its own. layer_types names the layers
// (GGUF: head_count_kv 0 on a convolution layer). The MLP width is HF's block_ff_dim adjusted as
// Lfm2MLP does (2/3, block_ffn_dim_multiplier, rounded up to block_multiple_of); GGUF stores the result.
// The routed variant (HF lfm2_moe, GGUF lfm2moe) keeps num_dense_layers leading layers dense (of
// intermediate_size) and routes the others: sigmoid scores over num_experts, the top k chosen by the
// scores plus expert_bias, weighted by the scores renormalized and times routed_scaling_factor, SwiGLU
// experts of moe_intermediate_size.
#include <cmath>

#include "families/components/decoder_config.hpp"
#include "families/components/moe.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

using kind = dense_decoder_spec::layer_kind;

std::vector<name_rule> names(bool gguf, std::int64_t experts) {
  std::vector<name_rule> t;
  auto global = [&](role r, const char* key, presence p = presence::required, role tied = role::none) { t.push_back({r, false, key, p, tied}); };
  auto layer = [&](role r, std::string key, presence p, std::int64_t stack = 0) {
    t.push_back({r, true, std::move(key), p, role::none, stored_as::as_is, stack});
  };
  constexpr auto req = presence::required, opt = presence::optional;
  const auto dense = experts > 0 ? opt : req;  // a routed model's dense roles: its leading layers' (checked by the decoder)
  global(role::token_embd, gguf ? "token_embd.weight" : "model.embed_tokens.weight");
  global(role::output, gguf ? "output.weight" : "lm_head.weight", presence::tied, role::token_embd);
  global(role::output_norm, gguf ? "token_embd_norm.weight" : "model.embedding_norm.weight");
  const std::string L = gguf ? "blk.{L}." : "model.layers.{L}.";
  // Each layer's mixer is checked by its kind (the name table holds both as optional).
  for (auto [r, g, h, p] : {std::tuple{role::attn_norm, "attn_norm.weight", "operator_norm.weight", req},
                            {role::ffn_norm, "ffn_norm.weight", "ffn_norm.weight", req},
                            {role::attn_q, "attn_q.weight", "self_attn.q_proj.weight", opt},
                            {role::attn_k, "attn_k.weight", "self_attn.k_proj.weight", opt},
                            {role::attn_v, "attn_v.weight", "self_attn.v_proj.weight", opt},
                            {role::attn_output, "attn_output.weight", "self_attn.out_proj.weight", opt},
                            {role::attn_q_norm, "attn_q_norm.weight", "self_attn.q_layernorm.weight", opt},
                            {role::attn_k_norm, "attn_k_norm.weight", "self_attn.k_layernorm.weight", opt},
                            {role::ssm_in, "shortconv.in_proj.weight", "conv.in_proj.weight", opt},
                            {role::ssm_conv1d, "shortconv.conv.weight", "conv.conv.weight", opt},
                            {role::ssm_out, "shortconv.out_proj.weight", "conv.out_proj.weight", opt},
                            {role::ffn_gate, "ffn_gate.weight", "feed_forward.w1.weight", dense},
                            {role::ffn_up, "ffn_up.weight", "feed_forward.w3.weight", dense},
                            {role::ffn_down, "ffn_down.weight", "feed_forward.w2.weight", dense}})
    layer(r, L + (gguf ? g : h), p);
  if (experts > 0) {
    layer(role::ffn_gate_inp, L + (gguf ? "ffn_gate_inp.weight" : "feed_forward.gate.weight"), opt);
    layer(role::exp_probs_b, L + (gguf ? "exp_probs_b.bias" : "feed_forward.expert_bias"), opt);
    for (auto [r, g, h] : {std::tuple{role::ffn_gate_exps, "ffn_gate_exps.weight", "feed_forward.experts.{E}.w1.weight"},
                           {role::ffn_up_exps, "ffn_up_exps.weight", "feed_forward.experts.{E}.w3.weight"},
                           {role::ffn_down_exps, "ffn_down_exps.weight", "feed_forward.experts.{E}.w2.weight"}})
      layer(r, L + (gguf ? g : h), opt, gguf ? 0 : experts);
  }
  return t;
}

// The routed variant's configuration (experts 0: a dense model) and its leading dense layers.
result<std::pair<moe_params, std::int64_t>, config_error> read_routing(const config_reader& r) {
  moe_params m;
  auto experts = r.count_or("num_experts", "expert_count", 0);
  if (!experts) return unexpected(experts.error());
  if (*experts == 0) return std::pair{m, std::int64_t{0}};
  auto used = r.positive("num_experts_per_tok", "expert_used_count");
  auto width = r.positive("moe_intermediate_size", "expert_feed_forward_length");
  auto dense = r.count_or("num_dense_layers", "leading_dense_block_count", 0);
  auto norm = r.flag_or("norm_topk_prob", "", true);  // GGUF: llama.cpp always renormalizes
  auto scale = r.number_or("routed_scaling_factor", "expert_weights_scale", 1.0);
  auto bias = r.flag_or("use_expert_bias", "", true);
  auto gating = r.count_or("", "expert_gating_func", 2);
  if (auto e = first_error(used, width, dense, norm, scale, bias, gating)) return unexpected(*e);
  if (*gating != 2) return unexpected(r.error(r.key("", "expert_gating_func"), "only sigmoid gating (2) is LFM2's"));
  if (!*bias) return unexpected(r.error("use_expert_bias", "routing without the expert bias is not supported"));
  if (*experts > 4096 || *used > *experts) return unexpected(r.error(r.key("num_experts_per_tok", "expert_used_count"), "must lie in [1, experts]"));
  if (*width > (std::int64_t{1} << 20)) return unexpected(r.error(r.key("moe_intermediate_size", "expert_feed_forward_length"), "past the bound of 2^20"));
  if (!(std::isfinite(*scale) && *scale >= 0)) return unexpected(r.error(r.key("routed_scaling_factor", "expert_weights_scale"), "must be a non-negative number"));
  m.experts = *experts;
  m.used = *used;
  m.width = *width;
  m.gate = gating::sigmoid;
  m.norm_topk = *norm;
  m.routed_scale = *scale == 0.0 ? 1.0 : *scale;
  m.act = activation::silu;
  return std::pair{m, *dense};
}

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "lfm2");
  auto fail = [](config_error e) { return unexpected(model_error{std::move(e)}); };
  auto hidden = r.positive("hidden_size", "embedding_length");
  auto layers = r.positive("num_hidden_layers", "block_count");
  auto heads = r.positive("num_attention_heads", "attention.head_count");
  auto eps = r.number_or("norm_eps", "attention.layer_norm_rms_epsilon", 1e-5);
  auto positions = r.positive_or("max_position_embeddings", "context_length", 128000);
  auto theta = r.number_or("rope_theta", "rope.freq_base", 1000000.0);
  auto cache = r.positive("conv_L_cache", "shortconv.l_cache");
  auto routing = read_routing(r);
  if (auto e = first_error(hidden, layers, heads, eps, positions, theta, cache, routing)) return fail(*e);
  const auto& [moe, dense_layers] = *routing;
  const std::int64_t L = *layers;
  if (L > static_cast<std::int64_t>(store.size())) return fail(r.error(r.key("num_hidden_layers", "block_count"), "more layers than tensors"));
  if (*hidden % *heads != 0) return fail(r.error(r.key("num_attention_heads", "attention.head_count"), "the heads must divide the hidden size"));
  if (*cache < 2 || *cache > 64) return fail(r.error(r.key("conv_L_cache", "shortconv.l_cache"), "the kernel must lie in [2, 64]"));
  std::vector<kind> kinds;  // each layer's, from either form below
  std::int64_t kv_heads = 0, ffn = 0;
  if (r.gguf()) {
    auto kv = r.raw().get_int_array(r.key("", "attention.head_count_kv"));
    if (!kv) return fail(r.error(r.key("", "attention.head_count_kv"), "must hold one value per layer"));
    auto h = hybrid_layers_from_kv(r, *kv, L, kind::shortconv_ffn);
    if (!h) return fail(h.error());
    kinds = std::move(h->kinds);
    kv_heads = h->kv_heads;
    auto f = r.positive("", "feed_forward_length");
    if (!f) return fail(f.error());
    ffn = *f;
  } else {
    auto h = hybrid_layers_from_types(r, L, kind::shortconv_ffn, "conv", "full_attention");
    if (!h) return fail(h.error());
    kinds = std::move(h->kinds);
    auto kv = r.positive_or("num_key_value_heads", "", *heads);
    auto ff = moe.experts > 0 ? r.positive("intermediate_size", "") : r.positive("block_ff_dim", "");
    auto adjust = r.flag_or("block_auto_adjust_ff_dim", "", false);
    auto multiplier = r.number_or("block_ffn_dim_multiplier", "", 0.0);
    auto multiple = r.positive_or("block_multiple_of", "", 1);
    auto bias = r.flag_or("conv_bias", "", false);
    if (auto e = first_error(kv, ff, adjust, multiplier, multiple, bias)) return fail(*e);
    if (*bias) return fail(r.error("conv_bias", "biases on the short convolution are not supported"));
    kv_heads = *kv;
    ffn = *ff;
    if (*adjust && moe.experts == 0) {  // Lfm2MLP's rule (Lfm2MoeMLP takes intermediate_size as it is)
      ffn = static_cast<std::int64_t>(2.0 * static_cast<double>(ffn) / 3.0);
      if (*multiplier > 0) ffn = static_cast<std::int64_t>(*multiplier * static_cast<double>(ffn));
      ffn = *multiple * ((ffn + *multiple - 1) / *multiple);
    }
  }
  constexpr std::int64_t bound = std::int64_t{1} << 20;
  if (*hidden > bound || ffn < 1 || ffn > bound) return fail(r.error(r.key("block_ff_dim", "feed_forward_length"), "the widths must lie in [1, 2^20]"));
  if (kv_heads > 0 && *heads % kv_heads != 0) return fail(r.error(r.key("num_key_value_heads", "attention.head_count_kv"), "heads must be a multiple of KV heads"));

  std::int64_t vocab = 0;
  if (const auto embd = store.find(r.gguf() ? "token_embd.weight" : "model.embed_tokens.weight"); embd && embd->shape().rank() == 2)
    vocab = embd->shape()[0];
  else
    return fail(r.error("embed_tokens", "missing: it gives the vocabulary size"));

  const std::int64_t D = *hidden / *heads;
  decoder_basics basics{vocab, *hidden, ffn, L, *heads, kv_heads > 0 ? kv_heads : *heads, D, *positions, *eps};
  basics.rope.dims = D;
  basics.rope.theta = *theta;
  auto s = uniform_spec("lfm2", basics, r);
  s.config.kv_elems_per_token_per_layer = 2 * kv_heads * D;  // 0 without an attention layer
  for (auto& a : s.attention) a.qk_norm = true;
  s.kinds = kinds;
  s.shortconv = shortconv_params{*hidden, *cache};
  if (moe.experts > 0) {  // the leading layers dense, the others routed
    s.moe.assign(static_cast<std::size_t>(L), moe);
    for (std::int64_t l = 0; l < std::min(dense_layers, L); ++l) s.moe[static_cast<std::size_t>(l)] = moe_params{};
  }
  auto m = make_dense_decoder(std::move(s), store, names(r.gguf(), moe.experts));
  if (!m) return m;
  for (std::int64_t l = 0; l < L; ++l) {
    if (kinds[static_cast<std::size_t>(l)] != kind::attention_ffn) continue;
    const role need[] = {role::attn_q, role::attn_k, role::attn_v, role::attn_output, role::attn_q_norm, role::attn_k_norm};
    if (auto e = missing_in_layer((*m)->weights(), l, need)) return unexpected(std::move(*e));
  }
  return m;
}

constexpr family_key keys[] = {{load::config_source::hf_json, "lfm2"}, {load::config_source::gguf, "lfm2"},
                               {load::config_source::hf_json, "lfm2_moe"}, {load::config_source::gguf, "lfm2moe"}};

}  // namespace

const family_entry lfm2_entry{"lfm2", keys, build};

}  // namespace troupe::families
