// Granite 4 hybrids (HF model_type granitemoehybrid, GGUF architecture granitehybrid): each layer is
// RMSNorm, a Mamba2 mixer or attention, a residual add, RMSNorm, a feed-forward and a residual add;
// layer_types (GGUF: per-layer head_count_kv, 0 for a Mamba2 layer) names the mixers. The feed-forward
// is routed (softmax over num_local_experts, the top k renormalized, an ungated shared expert of
// shared_intermediate_size beside them) or, with no experts, one SwiGLU of that width. Granite's four
// multipliers apply as in the dense family: embeddings, each block's output before its residual add,
// the attention scores (in place of 1/sqrt(head_dim)) and the logits (divided). The attention has no
// positional encoding unless position_embedding_type is rope (GGUF: rope.scaling.finetuned, which
// llama.cpp reads as that switch).
//
// HF stores GraniteMoe's fused projections: block_sparse_moe.input_linear [E, 2F, H] (gate rows, then
// up rows, per expert: split here at load into the experts' gate and up stacks, a copy) and
// shared_mlp.input_linear [2S, H] (gate, then up: two views of the tensor). HF's gated norm spans the
// whole inner width (MambaRMSNormGated); llama.cpp's GGUF norms per B/C group. The two agree for the
// one group the released models have.
#include <cmath>
#include <cstring>

#include "families/components/decoder_config.hpp"
#include "families/components/mamba2.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

using kind = dense_decoder_spec::layer_kind;

std::vector<name_rule> names(bool gguf, bool routed) {
  std::vector<name_rule> t;
  auto global = [&](role r, const char* key, presence p = presence::required, role tied = role::none) { t.push_back({r, false, key, p, tied}); };
  auto layer = [&](role r, std::string key, presence p = presence::optional, stored_as s = stored_as::as_is) {
    t.push_back({r, true, std::move(key), p, role::none, s});
  };
  constexpr auto req = presence::required;
  if (gguf) {
    global(role::token_embd, "token_embd.weight");
    global(role::output, "output.weight", presence::tied, role::token_embd);
    global(role::output_norm, "output_norm.weight");
    layer(role::attn_norm, "blk.{L}.attn_norm.weight", req);
    layer(role::ffn_norm, "blk.{L}.ffn_norm.weight", req);
    // llama.cpp's converter permutes Q/K rows as arch llama's (undone when rope is on; a dot product
    // without rope does not see it).
    layer(role::attn_q, "blk.{L}.attn_q.weight", presence::optional, stored_as::rope_interleaved);
    layer(role::attn_k, "blk.{L}.attn_k.weight", presence::optional, stored_as::rope_interleaved);
    for (auto [r, key] : {std::pair{role::attn_v, "attn_v.weight"}, {role::attn_output, "attn_output.weight"}, {role::attn_q_bias, "attn_q.bias"},
                          {role::attn_k_bias, "attn_k.bias"}, {role::attn_v_bias, "attn_v.bias"}, {role::attn_output_bias, "attn_output.bias"},
                          {role::ffn_gate, "ffn_gate.weight"}, {role::ffn_up, "ffn_up.weight"}, {role::ffn_down, "ffn_down.weight"},
                          {role::ffn_gate_inp, "ffn_gate_inp.weight"}, {role::ffn_gate_exps, "ffn_gate_exps.weight"},
                          {role::ffn_up_exps, "ffn_up_exps.weight"}, {role::ffn_down_exps, "ffn_down_exps.weight"},
                          {role::ffn_gate_shexp, "ffn_gate_shexp.weight"}, {role::ffn_up_shexp, "ffn_up_shexp.weight"},
                          {role::ffn_down_shexp, "ffn_down_shexp.weight"}})
      layer(r, std::string("blk.{L}.") + key);
    add_mamba2_names(t, true, "", presence::optional);  // each layer's mixer is checked by its kind
    return t;
  }
  global(role::token_embd, "model.embed_tokens.weight");
  global(role::output, "lm_head.weight", presence::tied, role::token_embd);
  global(role::output_norm, "model.norm.weight");
  const std::string L = "model.layers.{L}.";
  layer(role::attn_norm, L + "input_layernorm.weight", req);
  layer(role::ffn_norm, L + "post_attention_layernorm.weight", req);
  for (auto [r, key] : {std::pair{role::attn_q, "q_proj.weight"}, {role::attn_k, "k_proj.weight"}, {role::attn_v, "v_proj.weight"},
                        {role::attn_output, "o_proj.weight"}, {role::attn_q_bias, "q_proj.bias"}, {role::attn_k_bias, "k_proj.bias"},
                        {role::attn_v_bias, "v_proj.bias"}, {role::attn_output_bias, "o_proj.bias"}})
    layer(r, L + "self_attn." + key);
  add_mamba2_names(t, false, L + "mamba.", presence::optional);
  // The shared MLP's fused [gate | up]: the dense feed-forward, or split into the shared expert below.
  layer(role::ffn_gate_up, L + "shared_mlp.input_linear.weight", req);
  layer(routed ? role::ffn_down_shexp : role::ffn_down, L + "shared_mlp.output_linear.weight", req);
  if (routed) {
    layer(role::ffn_gate_inp, L + "block_sparse_moe.router.layer.weight", req);
    layer(role::hf_gate_up_exps, L + "block_sparse_moe.input_linear.weight", req);
    layer(role::ffn_down_exps, L + "block_sparse_moe.output_linear.weight", req);
  }
  return t;
}

// HF's fused GraniteMoe tensors as the routed component's roles: input_linear [E, 2F, H] to the gate
// and up stacks [E, F, H] (a copy: each expert's halves interleave across the stack); the shared MLP's
// [2S, H] to its gate and up [S, H] (views: each half is contiguous). A dense model keeps its shared
// MLP as the fused ffn_gate_up the decoder reads.
result<weight_map, weight_error> split_fused(const weight_map& m, bool routed) {
  std::vector<weight_entry> out;
  std::vector<std::shared_ptr<const tensor>> owned;
  for (const auto& e : m.entries()) {
    const auto r = e.role.kind;
    const std::int32_t l = e.role.layer;
    const auto& v = e.view;
    const auto& s = v.shape();
    if (r == role::ffn_gate_up && routed) {
      if (s.rank() != 2 || s[0] % 2 != 0) return unexpected(weight_error{weight_error_code::shape_mismatch, e.role, e.key, "[2S, H]", s.str()});
      const std::int64_t S = s[0] / 2, H = s[1];
      const auto half = *storage_bytes(v.type(), static_cast<std::uint64_t>(S * H));
      out.push_back({{role::ffn_gate_shexp, l}, e.key, tensor_view(v.type(), troupe::shape{S, H}, v.data()), stored_as::as_is});
      out.push_back({{role::ffn_up_shexp, l}, e.key, tensor_view(v.type(), troupe::shape{S, H}, v.data() + half), stored_as::as_is});
      continue;
    }
    if (r != role::hf_gate_up_exps) {
      out.push_back(e);
      continue;
    }
    if (s.rank() != 3 || s[1] % 2 != 0) return unexpected(weight_error{weight_error_code::shape_mismatch, e.role, e.key, "[E, 2F, H]", s.str()});
    if (!is_float(v.type()))
      return unexpected(weight_error{weight_error_code::unsupported_dtype, e.role, e.key, "a float type", std::string(name(v.type()))});
    const std::int64_t E = s[0], F = s[1] / 2, H = s[2];
    const auto rows = *storage_bytes(v.type(), static_cast<std::uint64_t>(F * H));
    for (int up = 0; up < 2; ++up) {
      auto t = std::make_shared<tensor>(v.type(), troupe::shape{E, F, H});
      for (std::int64_t x = 0; x < E; ++x)
        std::memcpy(t->data() + static_cast<std::size_t>(x) * rows, v.data() + static_cast<std::size_t>(2 * x + up) * rows, rows);
      out.push_back({{up ? role::ffn_up_exps : role::ffn_gate_exps, l}, e.key, t->view(), stored_as::as_is});
      owned.push_back(std::move(t));
    }
  }
  return m.derive(std::move(out), std::move(owned));
}

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "granite_hybrid");
  auto fail = [](config_error e) { return unexpected(model_error{std::move(e)}); };
  auto hidden = r.positive("hidden_size", "embedding_length");
  auto layers = r.positive("num_hidden_layers", "block_count");
  auto heads = r.positive("num_attention_heads", "attention.head_count");
  auto eps = r.number_or("rms_norm_eps", "attention.layer_norm_rms_epsilon", 1e-5);
  auto positions = r.positive_or("max_position_embeddings", "context_length", 4096);
  auto state = r.positive("mamba_d_state", "ssm.state_size");
  auto groups = r.positive_or("mamba_n_groups", "ssm.group_count", 1);
  auto conv = r.positive_or("mamba_d_conv", "ssm.conv_kernel", 4);
  auto ssm_heads = r.positive("mamba_n_heads", "ssm.time_step_rank");
  auto experts = r.count_or("num_local_experts", "expert_count", 0);
  auto used = r.count_or("num_experts_per_tok", "expert_used_count", 0);
  auto embed = r.number_or("embedding_multiplier", "embedding_scale", 1.0);
  auto residual = r.number_or("residual_multiplier", "residual_scale", 1.0);
  auto attention = r.number_or("attention_multiplier", "attention.scale", 0.0);
  auto logits = r.number_or("logits_scaling", "logit_scale", 1.0);
  auto theta = r.number_or("rope_theta", "rope.freq_base", 10000.0);
  if (auto e = first_error(hidden, layers, heads, eps, positions, state, groups, conv, ssm_heads, experts, used, embed, residual, attention, logits, theta))
    return fail(*e);
  const std::int64_t L = *layers;
  if (L > static_cast<std::int64_t>(store.size())) return fail(r.error(r.key("num_hidden_layers", "block_count"), "more layers than tensors"));
  for (auto [v, hf, gguf] : {std::tuple{*embed, "embedding_multiplier", "embedding_scale"}, {*residual, "residual_multiplier", "residual_scale"},
                             {*logits, "logits_scaling", "logit_scale"}})
    if (!(std::isfinite(v) && v > 0)) return fail(r.error(r.key(hf, gguf), "must be a positive number"));
  if (!(std::isfinite(*attention) && *attention >= 0)) return fail(r.error(r.key("attention_multiplier", "attention.scale"), "must be a non-negative number"));

  std::vector<kind> kinds;  // each layer's, from either form below
  std::int64_t kv_heads = 0, inner = 0, ffn = 0, shared = 0;
  bool rope = false;
  if (r.gguf()) {
    // A layer is Mamba2 when its head_count_kv is 0 (llama.cpp's rule); a scalar means no Mamba2 layer.
    std::vector<std::int64_t> kv;
    if (auto a = r.raw().get_int_array(r.key("", "attention.head_count_kv")); a) {
      kv = *a;
    } else {
      auto one = r.positive("", "attention.head_count_kv");
      if (!one) return fail(one.error());
      kv.assign(static_cast<std::size_t>(L), *one);
    }
    auto h = hybrid_layers_from_kv(r, kv, L, kind::mamba2_ffn);
    if (!h) return fail(h.error());
    kinds = std::move(h->kinds);
    kv_heads = h->kv_heads;
    auto i = r.positive("", "ssm.inner_size");
    auto f = r.positive("", "feed_forward_length");
    auto sh = r.count_or("", "expert_shared_feed_forward_length", 0);
    auto finetuned = r.flag_or("", "rope.scaling.finetuned", true);
    if (auto e = first_error(i, f, sh, finetuned)) return fail(*e);
    inner = *i;
    ffn = *f;  // the experts' width when routed, else the dense width
    shared = *experts > 0 ? *sh : *f;
    rope = *finetuned;
  } else {
    auto h = hybrid_layers_from_types(r, L, kind::mamba2_ffn, "mamba", "attention");
    if (!h) return fail(h.error());
    kinds = std::move(h->kinds);
    auto kv = r.positive_or("num_key_value_heads", "", *heads);
    auto expand = r.positive_or("mamba_expand", "", 2);
    auto f = r.positive("intermediate_size", "");
    auto sh = r.positive("shared_intermediate_size", "");
    auto proj_bias = r.flag_or("mamba_proj_bias", "", false);
    if (auto e = first_error(kv, expand, f, sh, proj_bias)) return fail(*e);
    if (*proj_bias) return fail(r.error("mamba_proj_bias", "a bias on the Mamba2 input projection is not supported"));
    if (const auto act = r.text("hidden_act", "").value_or("silu"); act != "silu") return fail(r.error("hidden_act", "only silu is supported"));
    const auto pos = r.text("position_embedding_type", "").value_or("nope");
    if (pos != "nope" && pos != "rope") return fail(r.error("position_embedding_type", "'" + pos + "' is neither nope nor rope"));
    rope = pos == "rope";
    kv_heads = *kv;
    inner = *expand * *hidden;
    ffn = *f;
    shared = *sh;
    if (auto d = r.raw().has("mamba_d_head") ? r.raw().get_int("mamba_d_head") : result<std::int64_t, load::load_error>(inner / *ssm_heads);
        d && *d * *ssm_heads != inner)
      return fail(r.error("mamba_d_head", "mamba_n_heads x mamba_d_head must be mamba_expand x hidden_size"));
  }
  const bool routed = *experts > 0;
  constexpr std::int64_t bound = std::int64_t{1} << 20;
  for (auto [v, what] : {std::pair{*hidden, "hidden_size"}, {inner, "inner size"}, {*state, "state size"}, {*ssm_heads, "mamba heads"},
                         {ffn, "intermediate_size"}, {shared, "shared_intermediate_size"}, {*heads, "heads"}})
    if (v > bound) return fail(r.error(what, std::to_string(v) + " is past the bound of " + std::to_string(bound)));
  if (*hidden % *heads != 0) return fail(r.error(r.key("num_attention_heads", "attention.head_count"), "the heads must divide the hidden size"));
  if (inner % *ssm_heads != 0 || *ssm_heads % *groups != 0)
    return fail(r.error(r.key("mamba_n_heads", "ssm.time_step_rank"), "mamba heads must divide the inner size and be a multiple of the groups"));
  if (kv_heads > 0 && *heads % kv_heads != 0) return fail(r.error(r.key("num_key_value_heads", "attention.head_count_kv"), "heads must be a multiple of KV heads"));
  if (*conv < 2 || *conv > 64) return fail(r.error(r.key("mamba_d_conv", "ssm.conv_kernel"), "the kernel must lie in [2, 64]"));
  if (routed && (*used < 1 || *used > *experts || *experts > 4096))
    return fail(r.error(r.key("num_experts_per_tok", "expert_used_count"), "must lie in [1, experts] (at most 4096 experts)"));
  if (shared < 1) return fail(r.error(r.key("shared_intermediate_size", "expert_shared_feed_forward_length"), "must be positive"));

  std::int64_t vocab = 0;
  if (const auto embd = store.find(r.gguf() ? "token_embd.weight" : "model.embed_tokens.weight"); embd && embd->shape().rank() == 2)
    vocab = embd->shape()[0];
  else
    return fail(r.error("embed_tokens", "missing: it gives the vocabulary size"));

  const std::int64_t D = *hidden / *heads;
  decoder_basics basics{vocab, *hidden, routed ? shared : ffn, L, *heads, kv_heads > 0 ? kv_heads : *heads, D, *positions, *eps};
  basics.rope.dims = rope ? D : 0;
  basics.rope.theta = *theta;
  auto s = uniform_spec("granite_hybrid", basics, r);
  s.config.kv_elems_per_token_per_layer = 2 * kv_heads * D;  // 0 without an attention layer
  s.stack.embed_scale = *embed;
  s.stack.residual_scale = *residual;
  s.stack.logit_scale = *logits;
  if (*attention > 0)
    for (auto& a : s.attention) a.scale = *attention;
  // The dense width (routed: the shared expert's, HF's fused shared MLP being [2 x it, H]).
  s.ffn.gated = true;
  s.ffn.act = activation::silu;
  if (routed) {
    moe_params m;
    m.experts = *experts;
    m.used = *used;
    m.width = ffn;
    m.gate = gating::softmax;
    m.norm_topk = true;
    m.shared_width = shared;
    m.shared_gated = false;
    s.moe.assign(static_cast<std::size_t>(L), m);
  }
  s.kinds = kinds;
  s.mamba2 = mamba2_params{inner, *state, *ssm_heads, *groups, *conv, *eps};
  if (!r.gguf()) s.mamba2.norm_groups = 1;  // MambaRMSNormGated over the whole inner width
  const bool gguf = r.gguf();
  weight_rewrite rewrite;
  if (!gguf) rewrite = [routed](const weight_map& w) { return split_fused(w, routed); };
  auto m = make_dense_decoder(std::move(s), store, names(gguf, routed), rewrite);
  if (!m) return m;
  // Each attention layer's projections and a dense model's feed-forward must be whole (the name table
  // holds them as optional; the routed roles are checked by the decoder).
  for (std::int64_t l = 0; l < L; ++l) {
    std::vector<role> need;
    if (kinds[static_cast<std::size_t>(l)] == kind::attention_ffn) need = {role::attn_q, role::attn_k, role::attn_v, role::attn_output};
    if (!routed && !(*m)->weights().has({role::ffn_gate_up, static_cast<std::int32_t>(l)}))
      need.insert(need.end(), {role::ffn_gate, role::ffn_up, role::ffn_down});
    if (auto e = missing_in_layer((*m)->weights(), l, need)) return unexpected(std::move(*e));
  }
  return m;
}

constexpr family_key keys[] = {{load::config_source::hf_json, "granitemoehybrid"}, {load::config_source::gguf, "granitehybrid"}};

}  // namespace

const family_entry granite_hybrid_entry{"granite_hybrid", keys, build};

}  // namespace troupe::families
