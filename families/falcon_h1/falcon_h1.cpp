// Falcon-H1 (HF model_type falcon_h1, GGUF architecture falcon-h1): every layer runs attention (NeoX
// rope over the whole head) and a Mamba2 mixer side by side over the same RMS-normed input, adds both
// outputs to the residual stream, then a SwiGLU feed-forward behind its own norm
// (`layer_kind::parallel_ffn`). The Mamba2 mixer's gated norm is there only with mamba_rms_norm (GGUF:
// when the file has ssm_norm).
//
// HF applies the model's mup multipliers at run time: the embeddings, the attention's input
// (attention_in_multiplier; keys also key_multiplier) and output, the Mamba2 input
// (ssm_in_multiplier) and each segment of its projection (ssm_multipliers: z, x, B, C, dt) and its
// output, the MLP's gate and down projections (mlp_multipliers) and the logits (lm_head_multiplier).
// Attention being linear in q, k and v, its multipliers become the score scale (in^2 x key) and one
// output scale (in x out); the others are scales of the graph. llama.cpp's converter bakes them all
// into the GGUF's weights, which are therefore read as they are.
#include <cmath>

#include "families/components/config_reader.hpp"
#include "families/components/decoder_config.hpp"
#include "families/components/mamba2.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

using kind = dense_decoder_spec::layer_kind;

std::vector<name_rule> names(bool gguf) {
  std::vector<name_rule> t;
  auto global = [&](role r, const char* key, presence p = presence::required, role tied = role::none) { t.push_back({r, false, key, p, tied}); };
  auto layer = [&](role r, std::string key, presence p = presence::required) { t.push_back({r, true, std::move(key), p}); };
  constexpr auto opt = presence::optional;
  global(role::token_embd, gguf ? "token_embd.weight" : "model.embed_tokens.weight");
  global(role::output, gguf ? "output.weight" : "lm_head.weight", presence::tied, role::token_embd);
  global(role::output_norm, gguf ? "output_norm.weight" : "model.final_layernorm.weight");
  const std::string L = gguf ? "blk.{L}." : "model.layers.{L}.";
  for (auto [r, g, h, p] : {std::tuple{role::attn_norm, "attn_norm.weight", "input_layernorm.weight", presence::required},
                            {role::ffn_norm, "ffn_norm", "pre_ff_layernorm.weight", presence::required},  // llama.cpp's: no .weight
                            {role::attn_q, "attn_q.weight", "self_attn.q_proj.weight", presence::required},
                            {role::attn_k, "attn_k.weight", "self_attn.k_proj.weight", presence::required},
                            {role::attn_v, "attn_v.weight", "self_attn.v_proj.weight", presence::required},
                            {role::attn_output, "attn_output.weight", "self_attn.o_proj.weight", presence::required},
                            {role::ffn_gate, "ffn_gate.weight", "feed_forward.gate_proj.weight", presence::required},
                            {role::ffn_up, "ffn_up.weight", "feed_forward.up_proj.weight", presence::required},
                            {role::ffn_down, "ffn_down.weight", "feed_forward.down_proj.weight", presence::required}})
    layer(r, L + (gguf ? g : h), p);
  if (gguf)  // llama.cpp reads these biases when a file has them (HF refuses the configs that make them)
    for (auto [r, key] : {std::pair{role::attn_q_bias, "attn_q.bias"}, {role::attn_k_bias, "attn_k.bias"}, {role::attn_v_bias, "attn_v.bias"},
                          {role::attn_output_bias, "attn_output.bias"}, {role::ffn_gate_bias, "ffn_gate.bias"}, {role::ffn_up_bias, "ffn_up.bias"},
                          {role::ffn_down_bias, "ffn_down.bias"}})
      layer(r, L + key, opt);
  add_mamba2_names(t, gguf, "model.layers.{L}.mamba.", opt);  // checked by the decoder (the norm when the model has it)
  return t;
}

// A list of `n` multipliers (default all 1), each finite and positive.
result<std::vector<double>, config_error> multipliers(const config_reader& r, const char* key, std::size_t n) {
  if (!r.raw().has(key)) return std::vector<double>(n, 1.0);
  auto v = r.raw().get_float_array(key);
  if (!v || v->size() != n) return unexpected(r.error(key, "must be a list of " + std::to_string(n) + " numbers"));
  for (double x : *v)
    if (!(std::isfinite(x) && x > 0)) return unexpected(r.error(key, "must hold positive numbers"));
  return *v;
}

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "falcon_h1");
  auto fail = [](config_error e) { return unexpected(model_error{std::move(e)}); };
  auto hidden = r.positive("hidden_size", "embedding_length");
  auto layers = r.positive("num_hidden_layers", "block_count");
  auto heads = r.positive("num_attention_heads", "attention.head_count");
  auto kv_heads = r.positive_or("num_key_value_heads", "attention.head_count_kv", 0);
  auto ffn = r.positive("intermediate_size", "feed_forward_length");
  auto eps = r.number_or("rms_norm_eps", "attention.layer_norm_rms_epsilon", 1e-5);
  auto positions = r.positive_or("max_position_embeddings", "context_length", 8192);
  auto theta = r.number_or("rope_theta", "rope.freq_base", 10000.0);
  auto state = r.positive("mamba_d_state", "ssm.state_size");
  auto groups = r.positive_or("mamba_n_groups", "ssm.group_count", 1);
  auto conv = r.positive_or("mamba_d_conv", "ssm.conv_kernel", 4);
  auto ssm_heads = r.positive("mamba_n_heads", "ssm.time_step_rank");
  auto attention_scale = r.number_or("", "attention.scale", 0.0);
  if (auto e = first_error(hidden, layers, heads, kv_heads, ffn, eps, positions, theta, state, groups, conv, ssm_heads, attention_scale))
    return fail(*e);
  const std::int64_t L = *layers;
  if (L > static_cast<std::int64_t>(store.size())) return fail(r.error(r.key("num_hidden_layers", "block_count"), "more layers than tensors"));
  const std::int64_t kv = *kv_heads > 0 ? *kv_heads : *heads;
  auto head_dim = r.positive_or("head_dim", "attention.key_length", *hidden / *heads);
  if (!head_dim) return fail(head_dim.error());
  std::int64_t inner = 0;
  bool gated_norm = true;
  // The mup multipliers (HF; a GGUF has them in its weights).
  double embed = 1, lm_head = 1, attn_in = 1, attn_out = 1, key = 1, ssm_in = 1, ssm_out = 1;
  std::vector<double> zxbcdt(5, 1.0), mlp(2, 1.0);
  if (r.gguf()) {
    auto i = r.positive("", "ssm.inner_size");
    if (!i) return fail(i.error());
    inner = *i;
    gated_norm = store.find("blk.0.ssm_norm.weight").has_value();
  } else {
    auto expand = r.positive_or("mamba_expand", "", 2);
    if (!expand) return fail(expand.error());
    auto i = r.positive_or("mamba_d_ssm", "", *expand * *hidden);
    auto rms = r.flag_or("mamba_rms_norm", "", false);
    auto before = r.flag_or("mamba_norm_before_gate", "", false);
    if (auto e = first_error(i, rms, before)) return fail(*e);
    inner = *i;
    gated_norm = *rms;
    if (*rms && *before) return fail(r.error("mamba_norm_before_gate", "the norm before the gate is not supported"));
    for (const char* k : {"mamba_proj_bias", "attention_bias", "mlp_bias", "projectors_bias"}) {
      auto b = r.flag_or(k, "", false);
      if (!b) return fail(b.error());
      if (*b) return fail(r.error(k, "biases are not supported"));
    }
    if (const auto act = r.text("hidden_act", "").value_or("silu"); act != "silu") return fail(r.error("hidden_act", "only silu is supported"));
    for (auto [k, v] : {std::pair{"embedding_multiplier", &embed}, {"lm_head_multiplier", &lm_head}, {"attention_in_multiplier", &attn_in},
                        {"attention_out_multiplier", &attn_out}, {"key_multiplier", &key}, {"ssm_in_multiplier", &ssm_in},
                        {"ssm_out_multiplier", &ssm_out}}) {
      auto m = r.number_or(k, "", 1.0);
      if (!m) return fail(m.error());
      if (!(std::isfinite(*m) && *m > 0)) return fail(r.error(k, "must be a positive number"));
      *v = *m;
    }
    auto z = multipliers(r, "ssm_multipliers", 5);
    auto f = multipliers(r, "mlp_multipliers", 2);
    if (auto e = first_error(z, f)) return fail(*e);
    zxbcdt = *z;
    mlp = *f;
    if (r.raw().has("mamba_d_head"))
      if (auto d = r.raw().get_int("mamba_d_head"); d && *d * *ssm_heads != inner)
        return fail(r.error("mamba_d_head", "mamba_n_heads x mamba_d_head must be the inner size"));
  }
  constexpr std::int64_t bound = std::int64_t{1} << 20;
  for (auto [v, what] : {std::pair{*hidden, "hidden_size"}, {inner, "inner size"}, {*state, "state size"}, {*ssm_heads, "mamba heads"},
                         {*ffn, "intermediate_size"}, {*head_dim, "head_dim"}, {*heads, "heads"}})
    if (v > bound) return fail(r.error(what, std::to_string(v) + " is past the bound of " + std::to_string(bound)));
  if (inner % *ssm_heads != 0 || *ssm_heads % *groups != 0)
    return fail(r.error(r.key("mamba_n_heads", "ssm.time_step_rank"), "mamba heads must divide the inner size and be a multiple of the groups"));
  if (*heads % kv != 0) return fail(r.error(r.key("num_key_value_heads", "attention.head_count_kv"), "heads must be a multiple of KV heads"));
  if (*head_dim % 2 != 0) return fail(r.error(r.key("head_dim", "attention.key_length"), "the rotary width must be even"));
  if (*conv < 2 || *conv > 64) return fail(r.error(r.key("mamba_d_conv", "ssm.conv_kernel"), "the kernel must lie in [2, 64]"));

  std::int64_t vocab = 0;
  if (const auto embd = store.find(r.gguf() ? "token_embd.weight" : "model.embed_tokens.weight"); embd && embd->shape().rank() == 2)
    vocab = embd->shape()[0];
  else
    return fail(r.error("embed_tokens", "missing: it gives the vocabulary size"));

  decoder_basics basics{vocab, *hidden, *ffn, L, *heads, kv, *head_dim, *positions, *eps};
  basics.rope.dims = *head_dim;
  basics.rope.theta = *theta;
  auto s = uniform_spec("falcon_h1", basics, r);
  s.stack.embed_scale = embed;
  s.stack.logit_scale = 1.0 / lm_head;  // the stack divides by it
  for (auto& a : s.attention) {
    a.scale = (*attention_scale > 0 ? *attention_scale : a.scale) * attn_in * attn_in * key;
    a.output_scale = attn_in * attn_out;
  }
  s.ffn.gate_scale = mlp[0];
  s.ffn.down_scale = mlp[1];
  s.kinds.assign(static_cast<std::size_t>(L), kind::parallel_ffn);
  s.mamba2 = mamba2_params{inner, *state, *ssm_heads, *groups, *conv, *eps};
  s.mamba2.gated_norm = gated_norm;
  for (std::size_t k = 0; k < 5; ++k) s.mamba2.in_scale[k] = ssm_in * zxbcdt[k];
  s.mamba2.out_scale = ssm_out;
  return make_dense_decoder(std::move(s), store, names(r.gguf()));
}

constexpr family_key keys[] = {{load::config_source::hf_json, "falcon_h1"}, {load::config_source::gguf, "falcon-h1"}};

}  // namespace

const family_entry falcon_h1_entry{"falcon_h1", keys, build};

}  // namespace troupe::families
