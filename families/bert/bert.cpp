// BERT and nomic-bert: the encoder-only families of sentence embedders (all-MiniLM, bge, e5, gte,
// nomic-embed-text), from a Hugging Face directory (BertModel, with or without the "bert." prefix and
// the old gamma/beta LayerNorm names) or a GGUF as llama.cpp's converter writes it (arch bert /
// nomic-bert). They offer the encode program only; embeddings pool its hidden states as the checkpoint
// declares (sentence-transformers' Pooling module, GGUF pooling_type).
//
// BERT: absolute position embeddings, q/k/v with biases, GELU (erf; hidden_act gelu_new and
// gelu_pytorch_tanh take the tanh form) over an ungated feed-forward. nomic-bert: no position table but
// rope (neox pairs, rotary_emb_base) on a fused Wqkv without biases, and a SwiGLU feed-forward whose
// fc11 is the up projection and fc12 the gate.
#include <cmath>

#include "families/components/config_reader.hpp"
#include "families/components/encoder.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

enum class variant : std::uint8_t { bert, nomic };

// Where each role lives in the checkpoint. `p` is the HF prefix ("" or "bert."), `w`/`b` the LayerNorm
// parameter names ("weight"/"bias" or the old "gamma"/"beta").
std::vector<name_rule> name_table(variant v, bool gguf, const std::string& p, const std::string& w, const std::string& bias) {
  std::vector<name_rule> t;
  auto global = [&](role r, std::string key, presence pr = presence::required) { t.push_back({r, false, std::move(key), pr}); };
  auto layer = [&](role r, std::string key, presence pr = presence::required) { t.push_back({r, true, std::move(key), pr}); };
  if (gguf) {
    global(role::token_embd, "token_embd.weight");
    global(role::token_types, "token_types.weight", presence::optional);
    if (v == variant::bert) global(role::position_embd, "position_embd.weight");
    global(role::token_embd_norm, "token_embd_norm.weight");
    global(role::token_embd_norm_bias, "token_embd_norm.bias");
    const auto gguf_key = [](role r, const char* suffix) { return "blk.{L}." + std::string(role_name(r)) + suffix; };
    for (const role r : {role::attn_q, role::attn_k, role::attn_v, role::attn_qkv}) {
      layer(r, gguf_key(r, ".weight"), presence::optional);
      t.push_back({bias_of(r), true, gguf_key(r, ".bias"), presence::optional});
    }
    for (const role r : {role::attn_output, role::attn_output_norm, role::ffn_up, role::ffn_down, role::layer_output_norm}) {
      layer(r, gguf_key(r, ".weight"));
      t.push_back({bias_of(r), true, gguf_key(r, ".bias"), role_name(r).ends_with("norm") ? presence::required : presence::optional});
    }
    layer(role::ffn_gate, "blk.{L}.ffn_gate.weight", presence::optional);
    return t;
  }
  if (v == variant::bert) {
    global(role::token_embd, p + "embeddings.word_embeddings.weight");
    global(role::token_types, p + "embeddings.token_type_embeddings.weight", presence::optional);
    global(role::position_embd, p + "embeddings.position_embeddings.weight");
    global(role::token_embd_norm, p + "embeddings.LayerNorm." + w);
    global(role::token_embd_norm_bias, p + "embeddings.LayerNorm." + bias);
    const std::string l = p + "encoder.layer.{L}.";
    for (auto [r, key] : {std::pair{role::attn_q, "attention.self.query"}, {role::attn_k, "attention.self.key"}, {role::attn_v, "attention.self.value"},
                             {role::attn_output, "attention.output.dense"}, {role::ffn_up, "intermediate.dense"}, {role::ffn_down, "output.dense"}}) {
      layer(r, l + key + ".weight");
      t.push_back({bias_of(r), true, l + key + ".bias", presence::optional});
    }
    layer(role::attn_output_norm, l + "attention.output.LayerNorm." + w);
    layer(role::attn_output_norm_bias, l + "attention.output.LayerNorm." + bias);
    layer(role::layer_output_norm, l + "output.LayerNorm." + w);
    layer(role::layer_output_norm_bias, l + "output.LayerNorm." + bias);
    return t;
  }
  global(role::token_embd, p + "embeddings.word_embeddings.weight");
  global(role::token_types, p + "embeddings.token_type_embeddings.weight", presence::optional);
  global(role::token_embd_norm, p + "emb_ln.weight");
  global(role::token_embd_norm_bias, p + "emb_ln.bias");
  const std::string l = p + "encoder.layers.{L}.";
  layer(role::attn_qkv, l + "attn.Wqkv.weight");
  layer(role::attn_qkv_bias, l + "attn.Wqkv.bias", presence::optional);
  layer(role::attn_output, l + "attn.out_proj.weight");
  layer(role::attn_output_bias, l + "attn.out_proj.bias", presence::optional);
  layer(role::ffn_up, l + "mlp.fc11.weight");
  layer(role::ffn_gate, l + "mlp.fc12.weight");
  layer(role::ffn_down, l + "mlp.fc2.weight");
  layer(role::attn_output_norm, l + "norm1.weight");
  layer(role::attn_output_norm_bias, l + "norm1.bias");
  layer(role::layer_output_norm, l + "norm2.weight");
  layer(role::layer_output_norm_bias, l + "norm2.bias");
  return t;
}

result<std::unique_ptr<model>, model_error> build(variant v, const load::raw_config& cfg, const load::weight_store& store) {
  const std::string family = v == variant::bert ? "bert" : "nomic_bert";
  const config_reader r(cfg, family);
  const bool nomic = v == variant::nomic;
  auto hidden = r.positive(nomic ? "n_embd" : "hidden_size", "embedding_length");
  auto layers = r.positive(nomic ? "n_layer" : "num_hidden_layers", "block_count");
  auto heads = r.positive(nomic ? "n_head" : "num_attention_heads", "attention.head_count");
  auto ffn = r.positive(nomic ? "n_inner" : "intermediate_size", "feed_forward_length");
  auto positions = r.positive_or(nomic ? "n_positions" : "max_position_embeddings", "context_length", 512);
  auto eps = r.number_or(nomic ? "layer_norm_epsilon" : "layer_norm_eps", "attention.layer_norm_epsilon", 1e-12);
  auto causal = r.flag_or(nomic ? "causal" : "is_decoder", "attention.causal", false);
  auto theta = r.number_or("rotary_emb_base", "rope.freq_base", 10000.0);
  if (auto e = first_error(hidden, layers, heads, ffn, positions, eps, causal, theta)) return unexpected(model_error{*e});
  if (*causal) return unexpected(model_error{r.error(r.key(nomic ? "causal" : "is_decoder", "attention.causal"), "a causal BERT is not an encoder troupe runs")});
  constexpr std::int64_t max_dim = std::int64_t{1} << 24;
  if (*layers > static_cast<std::int64_t>(store.size()) || *hidden > max_dim || *ffn > max_dim || *positions > max_dim || *heads > (1 << 16))
    return unexpected(model_error{r.error(r.key(nomic ? "n_embd" : "hidden_size", "embedding_length"), "sizes past what the checkpoint holds")});
  if (*hidden % *heads != 0 || (*hidden / *heads) % 2 != 0)
    return unexpected(model_error{r.error(r.key(nomic ? "n_head" : "num_attention_heads", "attention.head_count"),
                                          std::to_string(*hidden) + " does not split into " + std::to_string(*heads) + " heads of an even width")});
  if (!(*eps >= 0) || !(*theta > 0)) return unexpected(model_error{r.error(r.key(nomic ? "layer_norm_epsilon" : "layer_norm_eps", "attention.layer_norm_epsilon"), "bad epsilon or rotary base")});

  encoder_spec s;
  s.config.family = family;
  s.hidden = *hidden;
  s.layers = *layers;
  s.max_positions = *positions;
  s.norm_eps = *eps;
  s.absolute_positions = !nomic;
  auto& a = s.attention;
  a.heads = a.kv_heads = *heads;
  a.head_dim = *hidden / *heads;
  a.scale = 1.0 / std::sqrt(static_cast<double>(a.head_dim));
  a.causal = false;
  s.ffn.width = *ffn;
  s.ffn.gated = nomic;
  s.ffn.act = nomic ? activation::silu : activation::gelu;
  if (nomic) {
    auto fraction = r.number_or("rotary_emb_fraction", "", 1.0);
    auto interleaved = r.flag_or("rotary_emb_interleaved", "", false);
    if (auto e = first_error(fraction, interleaved)) return unexpected(model_error{*e});
    if (*fraction != 1.0) return unexpected(model_error{r.error("rotary_emb_fraction", "only a full rotary width (1.0) is supported")});
    if (*interleaved) return unexpected(model_error{r.error("rotary_emb_interleaved", "interleaved rotary pairs are not supported")});
    const auto act = r.text("activation_function", "").value_or("swiglu");
    if (act != "swiglu") return unexpected(model_error{r.error("activation_function", "'" + act + "' is not supported (swiglu is)")});
    a.rope.theta = *theta;
    a.rope.dims = a.head_dim;
  } else if (!r.gguf()) {
    const auto act = r.text("hidden_act", "").value_or("gelu");
    if (act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast") s.ffn.act = activation::gelu_tanh;
    else if (act != "gelu") return unexpected(model_error{r.error("hidden_act", "'" + act + "' is not supported (gelu, gelu_new are)")});
    const auto pos = r.text("position_embedding_type", "").value_or("absolute");
    if (pos != "absolute") return unexpected(model_error{r.error("position_embedding_type", "'" + pos + "' is not supported (absolute is)")});
  }
  if (r.gguf()) {
    const auto embd = store.find("token_embd.weight");
    if (!embd || embd->shape().rank() != 2) return unexpected(model_error{r.error("token_embd.weight", "missing: it gives the vocabulary size")});
    s.config.vocab = embd->shape()[0];
  } else {
    auto vocab = r.positive("vocab_size", "");
    if (!vocab) return unexpected(model_error{vocab.error()});
    s.config.vocab = *vocab;
  }
  s.config.hidden = s.hidden;
  s.config.layers = s.layers;
  s.config.max_positions = s.max_positions;
  s.config.bos_id = r.bos_id();

  // HF checkpoints saved from BertFor* models carry a "bert." prefix; old ones name LayerNorm gamma/beta.
  std::string prefix, w = "weight", b = "bias";
  if (!r.gguf()) {
    if (store.find("bert.embeddings.word_embeddings.weight")) prefix = "bert.";
    if (store.find(prefix + (nomic ? "emb_ln.gamma" : "embeddings.LayerNorm.gamma"))) w = "gamma", b = "beta";
  }
  const auto rules = name_table(v, r.gguf(), prefix, w, b);
  return make_encoder(std::move(s), store, rules);
}

result<std::unique_ptr<model>, model_error> build_bert(const load::raw_config& cfg, const load::weight_store& store) {
  return build(variant::bert, cfg, store);
}
result<std::unique_ptr<model>, model_error> build_nomic(const load::raw_config& cfg, const load::weight_store& store) {
  return build(variant::nomic, cfg, store);
}

constexpr family_key bert_keys[] = {{load::config_source::hf_json, "bert"}, {load::config_source::gguf, "bert"}};
constexpr family_key nomic_keys[] = {{load::config_source::hf_json, "nomic_bert"}, {load::config_source::gguf, "nomic-bert"}};

}  // namespace

const family_entry bert_entry{"bert", bert_keys, build_bert};
const family_entry nomic_bert_entry{"nomic_bert", nomic_keys, build_nomic};

}  // namespace troupe::families
