// BLOOM (HF model_type bloom, GGUF architecture bloom): ALiBi instead of positions (max bias 8, the
// slopes of HF's build_alibi_tensor and llama.cpp), LayerNorm with biases everywhere including one
// right after the token embedding, a fused QKV projection with bias (HF: [q | k | v] per head, read
// as stored; llama.cpp's converter regroups it to [q... | k... | v...]), a plain GELU (tanh) MLP of
// 4 x hidden with biases, and the head tied to the embedding unless the checkpoint has its own.
#include <cmath>

#include "families/components/config_reader.hpp"
#include "families/components/decoder_config.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

std::vector<name_rule> names(bool gguf) {
  std::vector<name_rule> t;
  auto global = [&](role r, const char* key, presence p = presence::required, role tied = role::none) { t.push_back({r, false, key, p, tied}); };
  auto layer = [&](role r, std::string key, stored_as s = stored_as::as_is) {
    t.push_back({r, true, std::move(key), presence::required, role::none, s});
  };
  if (gguf) {
    global(role::token_embd, "token_embd.weight");
    global(role::token_embd_norm, "token_embd_norm.weight");
    global(role::token_embd_norm_bias, "token_embd_norm.bias");
    global(role::output, "output.weight", presence::tied, role::token_embd);
    global(role::output_norm, "output_norm.weight");
    global(role::output_norm_bias, "output_norm.bias");
    for (auto [r, key] : {std::pair{role::attn_norm, "attn_norm.weight"}, {role::attn_norm_bias, "attn_norm.bias"},
                          {role::attn_qkv, "attn_qkv.weight"}, {role::attn_qkv_bias, "attn_qkv.bias"}, {role::attn_output, "attn_output.weight"},
                          {role::attn_output_bias, "attn_output.bias"}, {role::ffn_norm, "ffn_norm.weight"}, {role::ffn_norm_bias, "ffn_norm.bias"},
                          {role::ffn_up, "ffn_up.weight"}, {role::ffn_up_bias, "ffn_up.bias"}, {role::ffn_down, "ffn_down.weight"},
                          {role::ffn_down_bias, "ffn_down.bias"}})
      layer(r, std::string("blk.{L}.") + key);
    return t;
  }
  global(role::token_embd, "transformer.word_embeddings.weight");
  global(role::token_embd_norm, "transformer.word_embeddings_layernorm.weight");
  global(role::token_embd_norm_bias, "transformer.word_embeddings_layernorm.bias");
  global(role::output, "lm_head.weight", presence::tied, role::token_embd);
  global(role::output_norm, "transformer.ln_f.weight");
  global(role::output_norm_bias, "transformer.ln_f.bias");
  const auto per_head = stored_as::qkv_per_head;
  for (auto [r, key, s] : {std::tuple{role::attn_norm, "input_layernorm.weight", stored_as::as_is}, {role::attn_norm_bias, "input_layernorm.bias", stored_as::as_is},
                           {role::attn_qkv, "self_attention.query_key_value.weight", per_head},
                           {role::attn_qkv_bias, "self_attention.query_key_value.bias", per_head},
                           {role::attn_output, "self_attention.dense.weight", stored_as::as_is}, {role::attn_output_bias, "self_attention.dense.bias", stored_as::as_is},
                           {role::ffn_norm, "post_attention_layernorm.weight", stored_as::as_is}, {role::ffn_norm_bias, "post_attention_layernorm.bias", stored_as::as_is},
                           {role::ffn_up, "mlp.dense_h_to_4h.weight", stored_as::as_is}, {role::ffn_up_bias, "mlp.dense_h_to_4h.bias", stored_as::as_is},
                           {role::ffn_down, "mlp.dense_4h_to_h.weight", stored_as::as_is}, {role::ffn_down_bias, "mlp.dense_4h_to_h.bias", stored_as::as_is}})
    layer(r, std::string("transformer.h.{L}.") + key, s);
  return t;
}

// The first of `keys` the HF config holds (BLOOM's configs spell n_embed/hidden_size, n_layer, n_head).
std::string hf_key(const config_reader& r, std::initializer_list<const char*> keys) {
  if (r.gguf()) return "";
  for (const char* k : keys)
    if (r.raw().has(k)) return k;
  return *keys.begin();
}

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "bloom");
  auto fail = [](config_error e) { return unexpected(model_error{std::move(e)}); };
  const auto hidden_key = hf_key(r, {"hidden_size", "n_embed"}), layers_key = hf_key(r, {"n_layer", "num_hidden_layers"}),
             heads_key = hf_key(r, {"n_head", "num_attention_heads"});
  auto hidden = r.positive(hidden_key, "embedding_length");
  auto layers = r.positive(layers_key, "block_count");
  auto heads = r.positive(heads_key, "attention.head_count");
  auto eps = r.number_or("layer_norm_epsilon", "attention.layer_norm_epsilon", 1e-5);
  auto positions = r.positive_or("", "context_length", 2048);  // ALiBi has no positional limit; HF keeps none
  if (auto e = first_error(hidden, layers, heads, eps, positions)) return fail(*e);
  std::int64_t ffn = 4 * *hidden, kv_heads = *heads;
  if (r.gguf()) {
    auto f = r.positive_or("", "feed_forward_length", ffn);
    auto kv = r.positive_or("", "attention.head_count_kv", *heads);
    if (auto e = first_error(f, kv)) return fail(*e);
    ffn = *f;
    kv_heads = *kv;
  } else {
    // HF's BloomConfig names no MLP width (the models use 4 x hidden): the first layer's tensor says it.
    if (const auto up = store.find("transformer.h.0.mlp.dense_h_to_4h.weight"); up && up->shape().rank() == 2) ffn = up->shape()[0];
    auto post = r.flag_or("apply_residual_connection_post_layernorm", "", false);
    if (!post) return fail(post.error());
    if (*post) return fail(r.error("apply_residual_connection_post_layernorm", "the residual after the norm is not supported"));
  }
  constexpr std::int64_t bound = std::int64_t{1} << 20;
  if (*hidden > bound || ffn > bound) return fail(r.error(r.key(hidden_key, "embedding_length"), "the widths are past the bound of 2^20"));
  if (*heads > (1 << 16)) return fail(r.error(r.key(heads_key, "attention.head_count"), "past the bound of 2^16"));
  if (*layers > static_cast<std::int64_t>(store.size())) return fail(r.error(r.key(layers_key, "block_count"), "more layers than tensors"));
  if (*hidden % *heads != 0) return fail(r.error(r.key(heads_key, "attention.head_count"), "the heads must divide the hidden size"));
  if (kv_heads != *heads) return fail(r.error("attention.head_count_kv", "BLOOM has as many key/value heads as query heads"));
  if (!(*eps >= 0)) return fail(r.error(r.key("layer_norm_epsilon", "attention.layer_norm_epsilon"), "must be non-negative"));

  std::int64_t vocab = 0;
  if (const auto embd = store.find(r.gguf() ? "token_embd.weight" : "transformer.word_embeddings.weight"); embd && embd->shape().rank() == 2)
    vocab = embd->shape()[0];
  else
    return fail(r.error("word_embeddings", "missing: it gives the vocabulary size"));

  // No rotary embedding: basics.rope.dims stays 0.
  const decoder_basics basics{vocab, *hidden, ffn, *layers, *heads, kv_heads, *hidden / *heads, *positions, *eps};
  auto s = uniform_spec("bloom", basics, r);
  s.stack.layer_norm = true;
  for (auto& a : s.attention) {
    a.alibi = true;
    a.alibi_heads = *heads;
  }
  s.ffn.gated = false;
  s.ffn.act = activation::gelu_tanh;
  return make_dense_decoder(std::move(s), store, names(r.gguf()));
}

constexpr family_key keys[] = {{load::config_source::hf_json, "bloom"}, {load::config_source::gguf, "bloom"}};

}  // namespace

const family_entry bloom_entry{"bloom", keys, build};

}  // namespace troupe::families
