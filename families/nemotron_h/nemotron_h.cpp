// Nemotron-H (HF model_type nemotron_h, GGUF architecture nemotron_h): a hybrid whose layers are each
// one block behind their own RMSNorm and a residual add: a Mamba2 mixer (M), attention without any
// positional encoding (*), or a plain MLP with squared ReLU (-). HF names the pattern
// (hybrid_override_pattern); llama.cpp's GGUF keeps it as per-layer arrays: head_count_kv 0 and
// feed_forward_length 0 make a Mamba2 layer, feed_forward_length 0 alone an attention layer. The
// routed variant (nemotron_h_moe) is not registered.
#include <cmath>

#include "families/components/config_reader.hpp"
#include "families/components/decoder_config.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

using kind = dense_decoder_spec::layer_kind;

std::vector<name_rule> names(bool gguf) {
  std::vector<name_rule> t;
  auto global = [&](role r, const char* key, presence p = presence::required, role tied = role::none) { t.push_back({r, false, key, p, tied}); };
  auto layer = [&](role r, std::string key, presence p = presence::optional) { t.push_back({r, true, std::move(key), p}); };
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
  return t;
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
  if (auto e = first_error(hidden, layers, heads, state, groups, conv, eps, positions)) return fail(*e);
  const std::int64_t L = *layers;
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
      if (c != 'M' && c != '*' && c != '-') return fail(r.error("hybrid_override_pattern", std::string("unknown layer kind '") + c + "'"));
      kinds[static_cast<std::size_t>(l)] = c == 'M' ? kind::mamba2 : c == '*' ? kind::attention_only : kind::ffn_only;
    }
    auto kv = r.positive_or("num_key_value_heads", "", *heads);
    auto hd = r.positive_or("head_dim", "", *hidden / *heads);
    auto ff = r.positive("intermediate_size", "");
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
  auto m = make_dense_decoder(std::move(s), store, names(r.gguf()));
  if (!m) return m;
  // Each layer's block must be whole (the name table holds every block's roles as optional).
  for (std::int64_t l = 0; l < L; ++l) {
    const auto k = kinds[static_cast<std::size_t>(l)];
    if (k == kind::mamba2) continue;  // checked by the decoder
    const auto need = k == kind::attention_only ? std::vector<role>{role::attn_q, role::attn_k, role::attn_v, role::attn_output}
                                                : std::vector<role>{role::ffn_up, role::ffn_down};
    if (auto e = missing_in_layer((*m)->weights(), l, need)) return unexpected(std::move(*e));
  }
  return m;
}

constexpr family_key keys[] = {{load::config_source::hf_json, "nemotron_h"}, {load::config_source::gguf, "nemotron_h"}};

}  // namespace

const family_entry nemotron_h_entry{"nemotron_h", keys, build};

}  // namespace troupe::families
