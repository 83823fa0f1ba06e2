// MPT (HF model_type mpt, GGUF architecture mpt): MosaicML's decoder. ALiBi instead of positions
// (max bias `attn_config.alibi_bias_max`, llama.cpp's `attention.max_alibi_bias`; HF's
// build_mpt_alibi_tensor and llama.cpp give the same slopes past the power of two), LayerNorm without
// biases (HF's `no_bias`; a checkpoint that stores biases has them read: llama.cpp's are optional), a
// fused Wqkv [q... | k... | v...] optionally clamped (`clip_qkv`, llama.cpp's `clamp_kqv`), grouped KV
// heads where llm-foundry's `kv_n_heads` asks, a plain GELU MLP of `expansion_ratio` x hidden, and the
// head tied to the embedding. GELU: HF's MptMLP is the exact erf form, llama.cpp's MPT the tanh form;
// each checkpoint form follows the runtime that defines it.
//
// Refused with the field named: learned position embeddings (`attn_config.alibi` false, or a GGUF
// `position_embd`), the q/k LayerNorm (`attn_config.qk_ln`, which HF's MptAttention does not implement),
// AWQ's activation scales (GGUF `ffn_act.scales`), and prefix-LM or sequence-id attention.
#include <cmath>

#include "families/components/config_reader.hpp"
#include "families/components/decoder_config.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

std::vector<name_rule> names(bool gguf) {
  std::vector<name_rule> t;
  auto global = [&](role r, const char* key, presence p = presence::required, role tied = role::none) { t.push_back({r, false, key, p, tied}); };
  auto layer = [&](role r, std::string key, presence p) { t.push_back({r, true, std::move(key), p, role::none}); };
  constexpr auto req = presence::required, opt = presence::optional;
  if (gguf) {
    global(role::token_embd, "token_embd.weight");
    global(role::output, "output.weight", presence::tied, role::token_embd);
    global(role::output_norm, "output_norm.weight");
    global(role::output_norm_bias, "output_norm.bias", opt);
    for (auto [r, key, p] : {std::tuple{role::attn_norm, "attn_norm.weight", req}, {role::attn_norm_bias, "attn_norm.bias", opt},
                             {role::attn_qkv, "attn_qkv.weight", req}, {role::attn_qkv_bias, "attn_qkv.bias", opt},
                             {role::attn_output, "attn_output.weight", req}, {role::attn_output_bias, "attn_output.bias", opt},
                             {role::ffn_norm, "ffn_norm.weight", req}, {role::ffn_norm_bias, "ffn_norm.bias", opt},
                             {role::ffn_up, "ffn_up.weight", req}, {role::ffn_up_bias, "ffn_up.bias", opt},
                             {role::ffn_down, "ffn_down.weight", req}, {role::ffn_down_bias, "ffn_down.bias", opt}})
      layer(r, std::string("blk.{L}.") + key, p);
    return t;
  }
  global(role::token_embd, "transformer.wte.weight");
  global(role::output, "lm_head.weight", presence::tied, role::token_embd);
  global(role::output_norm, "transformer.norm_f.weight");
  global(role::output_norm_bias, "transformer.norm_f.bias", opt);
  for (auto [r, key, p] : {std::tuple{role::attn_norm, "norm_1.weight", req}, {role::attn_norm_bias, "norm_1.bias", opt},
                           {role::attn_qkv, "attn.Wqkv.weight", req}, {role::attn_qkv_bias, "attn.Wqkv.bias", opt},
                           {role::attn_output, "attn.out_proj.weight", req}, {role::attn_output_bias, "attn.out_proj.bias", opt},
                           {role::ffn_norm, "norm_2.weight", req}, {role::ffn_norm_bias, "norm_2.bias", opt},
                           {role::ffn_up, "ffn.up_proj.weight", req}, {role::ffn_up_bias, "ffn.up_proj.bias", opt},
                           {role::ffn_down, "ffn.down_proj.weight", req}, {role::ffn_down_bias, "ffn.down_proj.bias", opt}})
    layer(r, std::string("transformer.blocks.{L}.") + key, p);
  return t;
}

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "mpt");
  auto fail = [](config_error e) { return unexpected(model_error{std::move(e)}); };
  auto hidden = r.positive("d_model", "embedding_length");
  auto layers = r.positive("n_layers", "block_count");
  auto heads = r.positive("n_heads", "attention.head_count");
  auto eps = r.number_or("layer_norm_epsilon", "attention.layer_norm_epsilon", 1e-5);
  auto positions = r.positive_or("max_seq_len", "context_length", 2048);
  auto clip = r.number_or("attn_config.clip_qkv", "attention.clamp_kqv", 0.0);
  // GGUF: llama.cpp reads 0 when the key is absent (no ALiBi); HF: the attn_config default, 8.
  auto max_bias = r.number_or("attn_config.alibi_bias_max", "attention.max_alibi_bias", r.gguf() ? 0.0 : 8.0);
  if (auto e = first_error(hidden, layers, heads, eps, positions, clip, max_bias)) return fail(*e);
  constexpr std::int64_t bound = std::int64_t{1} << 20;
  if (*hidden > bound) return fail(r.error(r.key("d_model", "embedding_length"), "the width is past the bound of 2^20"));
  if (*heads > (1 << 16)) return fail(r.error(r.key("n_heads", "attention.head_count"), "past the bound of 2^16"));
  if (*layers > static_cast<std::int64_t>(store.size())) return fail(r.error(r.key("n_layers", "block_count"), "more layers than tensors"));
  if (*hidden % *heads != 0) return fail(r.error(r.key("n_heads", "attention.head_count"), "the heads must divide the hidden size"));
  if (!(*eps >= 0)) return fail(r.error(r.key("layer_norm_epsilon", "attention.layer_norm_epsilon"), "must be non-negative"));
  if (!(*clip >= 0) || !std::isfinite(*clip)) return fail(r.error(r.key("attn_config.clip_qkv", "attention.clamp_kqv"), "must be a finite non-negative bound"));
  if (!(*max_bias >= 0) || !std::isfinite(*max_bias) || *max_bias > 64)
    return fail(r.error(r.key("attn_config.alibi_bias_max", "attention.max_alibi_bias"), "must be in [0, 64]"));

  std::int64_t ffn = 0, kv_heads = *heads;
  double scale = 1.0 / std::sqrt(static_cast<double>(*hidden / *heads));
  bool alibi = *max_bias > 0;
  if (r.gguf()) {
    auto f = r.positive("", "feed_forward_length");
    auto kv = r.positive_or("", "attention.head_count_kv", *heads);
    if (auto e = first_error(f, kv)) return fail(*e);
    ffn = *f;
    kv_heads = *kv;
    if (store.find("position_embd.weight")) return fail(r.error("position_embd", "learned position embeddings are not supported"));
    if (store.find("blk.0.attn_q_norm.weight")) return fail(r.error("attn_q_norm", "the q/k LayerNorm (qk_ln) is not supported"));
    if (store.find("blk.0.ffn_act.scales")) return fail(r.error("ffn_act", "AWQ's activation scales are not supported"));
  } else {
    auto ratio = r.number_or("expansion_ratio", "", 4.0);
    auto alibi_on = r.flag_or("attn_config.alibi", "", true);
    auto qk_ln = r.flag_or("attn_config.qk_ln", "", false);
    auto prefix = r.flag_or("attn_config.prefix_lm", "", false);
    auto seq_id = r.flag_or("attn_config.attn_uses_sequence_id", "", false);
    auto softmax_scale = r.number_or("attn_config.softmax_scale", "", 0.0);
    if (auto e = first_error(ratio, alibi_on, qk_ln, prefix, seq_id, softmax_scale)) return fail(*e);
    if (!*alibi_on) return fail(r.error("attn_config.alibi", "learned position embeddings (alibi false) are not supported"));
    if (*qk_ln) return fail(r.error("attn_config.qk_ln", "the q/k LayerNorm is not supported"));
    if (*prefix) return fail(r.error("attn_config.prefix_lm", "prefix-LM attention is not supported"));
    if (*seq_id) return fail(r.error("attn_config.attn_uses_sequence_id", "sequence-id attention is not supported"));
    if (*softmax_scale < 0 || !std::isfinite(*softmax_scale)) return fail(r.error("attn_config.softmax_scale", "must be positive"));
    if (*softmax_scale > 0) scale = *softmax_scale;
    const double width = *ratio * static_cast<double>(*hidden);
    if (!(*ratio > 0) || !(width <= static_cast<double>(bound)) || width != std::floor(width))
      return fail(r.error("expansion_ratio", "must give a whole MLP width up to 2^20"));
    ffn = static_cast<std::int64_t>(width);
    // llm-foundry's attention kinds (HF's MptAttention is multi-head only).
    const auto type = r.text("attn_config.attn_type", "").value_or("multihead_attention");
    if (type == "multiquery_attention") {
      kv_heads = 1;
    } else if (type == "grouped_query_attention") {
      auto kv = r.positive("attn_config.kv_n_heads", "");
      if (!kv) return fail(kv.error());
      kv_heads = *kv;
    } else if (type != "multihead_attention") {
      return fail(r.error("attn_config.attn_type", "'" + type + "' is not an attention kind MPT has"));
    }
  }
  if (ffn > bound) return fail(r.error(r.key("expansion_ratio", "feed_forward_length"), "the MLP width is past the bound of 2^20"));
  if (kv_heads < 1 || kv_heads > *heads || *heads % kv_heads != 0)
    return fail(r.error(r.key("attn_config.kv_n_heads", "attention.head_count_kv"), "must divide the heads"));

  std::int64_t vocab = 0;
  if (const auto embd = store.find(r.gguf() ? "token_embd.weight" : "transformer.wte.weight"); embd && embd->shape().rank() == 2)
    vocab = embd->shape()[0];
  else
    return fail(r.error("wte", "missing: it gives the vocabulary size"));

  // No rotary embedding: basics.rope.dims stays 0.
  const decoder_basics basics{vocab, *hidden, ffn, *layers, *heads, kv_heads, *hidden / *heads, *positions, *eps};
  auto s = uniform_spec("mpt", basics, r);
  s.stack.layer_norm = true;
  for (auto& a : s.attention) {
    a.scale = scale;
    a.alibi = alibi;
    a.alibi_max_bias = *max_bias;
    a.alibi_heads = *heads;
    a.clip_qkv = *clip;
  }
  s.ffn.gated = false;
  s.ffn.act = r.gguf() ? activation::gelu_tanh : activation::gelu;
  return make_dense_decoder(std::move(s), store, names(r.gguf()));
}

constexpr family_key keys[] = {{load::config_source::hf_json, "mpt"}, {load::config_source::gguf, "mpt"}};

}  // namespace

const family_entry mpt_entry{"mpt", keys, build};

}  // namespace troupe::families
